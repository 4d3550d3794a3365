//! A protocol test server of the current ClickHouse HTTP interface (24.x),
//! for what Debian's 18.16 lacks: `insert_deduplication_token`,
//! `RowBinaryWithDefaults`, the `X-ClickHouse-Exception-Code` header and 400
//! for bad data. It answers the queries the sink runs at open, stores inserts
//! (deduplicating by token, as a table with a deduplication window does), and
//! refuses a JSONEachRow insert holding a `"poison"` line the way the server
//! does (code 117, `(at row N)` unless told to leave the row out). Faults:
//! scripted answers for the next inserts.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;

/// How the next insert is answered instead of normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answered as usual (a place in the script of the next inserts).
    Pass,
    /// 503 with no exception code, nothing stored.
    Unavailable,
    /// 503 with `Retry-After` of that many seconds, nothing stored.
    UnavailableFor(u64),
    /// 500 with code 252 (TOO_MANY_PARTS), nothing stored.
    TooManyParts,
    /// Stored, then answered 503: the acknowledgement is lost.
    LostAnswer,
}

/// One insert the server accepted.
#[derive(Debug, Clone)]
pub struct Insert {
    pub format: String,
    pub settings: HashMap<String, String>,
    pub body: Bytes,
}

#[derive(Default)]
struct Inner {
    columns: String,
    dedup_tokens: HashSet<String>,
    stored: Vec<Insert>,
    requests: Vec<HashMap<String, String>>,
    faults: VecDeque<Fault>,
    name_rows: bool,
}

#[derive(Clone)]
pub struct ClickHouseHttp {
    inner: Arc<Mutex<Inner>>,
    pub url: String,
    task: Arc<tokio::task::JoinHandle<()>>,
}

impl ClickHouseHttp {
    /// `columns`: the table's `system.columns` rows as `name\ttype\tdefault_kind`.
    pub async fn start(columns: &str) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            columns: columns.to_owned(),
            name_rows: true,
            ..Inner::default()
        }));
        let app = axum::Router::new()
            .route("/", axum::routing::post(answer))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            inner,
            url,
            task: Arc::new(task),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn fail_next(&self, faults: &[Fault]) {
        self.lock().faults.extend(faults);
    }

    /// Refusals name no row (older or parallel parsing): the sink must bisect.
    pub fn hide_rows(&self) {
        self.lock().name_rows = false;
    }

    pub fn stored(&self) -> Vec<Insert> {
        self.lock().stored.clone()
    }

    /// The JSONEachRow lines stored, over every insert.
    pub fn lines(&self) -> Vec<serde_json::Value> {
        self.stored()
            .iter()
            .flat_map(|insert| {
                String::from_utf8(insert.body.to_vec())
                    .unwrap()
                    .lines()
                    .map(|line| serde_json::from_str(line).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The query parameters of every insert request, answered or not.
    pub fn insert_requests(&self) -> Vec<HashMap<String, String>> {
        self.lock().requests.clone()
    }
}

impl Drop for ClickHouseHttp {
    fn drop(&mut self) {
        if Arc::strong_count(&self.task) == 1 {
            self.task.abort();
        }
    }
}

fn exception(status: u16, code: u32, name: &str, message: &str) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("X-ClickHouse-Exception-Code", code.to_string())],
        format!("Code: {code}. DB::Exception: {message}. ({name}) (version 24.8.4.13 (official build))\n"),
    )
        .into_response()
}

async fn answer(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
    body: Bytes,
) -> Response {
    let (sql, data) = match params.get("query") {
        Some(sql) => (sql.clone(), body),
        None => (String::from_utf8_lossy(&body).into_owned(), Bytes::new()),
    };
    let mut inner = inner.lock().unwrap();
    if sql.starts_with("SELECT version()") {
        return "24.8.4.13\n".into_response();
    }
    if sql.contains("system.settings") {
        return "insert_deduplication_token\ninput_format_parallel_parsing\ndate_time_input_format\n"
            .into_response();
    }
    if sql.contains("system.formats") {
        return "RowBinaryWithDefaults\n".into_response();
    }
    if sql.contains("system.columns") {
        return inner.columns.clone().into_response();
    }
    let Some(format) = sql
        .strip_prefix("INSERT INTO ")
        .and_then(|rest| rest.split(" FORMAT ").nth(1))
    else {
        return exception(400, 62, "SYNTAX_ERROR", &format!("Syntax error: {sql}"));
    };
    inner.requests.push(params.clone());
    let insert = Insert {
        format: format.trim().to_owned(),
        settings: params.clone(),
        body: data,
    };
    match inner.faults.pop_front() {
        Some(Fault::Unavailable) => return (StatusCode::SERVICE_UNAVAILABLE, "").into_response(),
        Some(Fault::UnavailableFor(seconds)) => {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                [("Retry-After", seconds.to_string())],
                "",
            )
                .into_response();
        }
        Some(Fault::TooManyParts) => {
            return exception(500, 252, "TOO_MANY_PARTS", "Too many parts (300)");
        }
        Some(Fault::LostAnswer) => {
            store(&mut inner, insert);
            return (StatusCode::SERVICE_UNAVAILABLE, "").into_response();
        }
        Some(Fault::Pass) | None => {}
    }
    if insert.format == "JSONEachRow" {
        let text = String::from_utf8_lossy(&insert.body).into_owned();
        if let Some(row) = text.lines().position(|line| line.contains("\"poison\"")) {
            let at = if inner.name_rows {
                format!(": (at row {})\n", row + 1)
            } else {
                String::new()
            };
            return exception(
                400,
                117,
                "INCORRECT_DATA",
                &format!("Unknown field found while parsing JSONEachRow format: poison{at}"),
            );
        }
    }
    store(&mut inner, insert);
    StatusCode::OK.into_response()
}

fn store(inner: &mut Inner, insert: Insert) {
    if let Some(token) = insert.settings.get("insert_deduplication_token")
        && !inner.dedup_tokens.insert(token.clone())
    {
        return;
    }
    inner.stored.push(insert);
}
