//! A protocol test server of Apache Doris Stream Load (2.x): a frontend (FE)
//! and a backend (BE) on their own loopback ports. `PUT
//! /api/{db}/{table}/_stream_load` on the FE checks basic auth and
//! `Expect: 100-continue` and answers 307 to the same path on the BE; the BE
//! checks them again, reads the body (`format: json` with
//! `strip_outer_array`, or `csv` with `columns` and the separators in
//! `\xNN` notation), checks each row against the table's columns and answers
//! the way Doris does: `Success`; `Label Already Exists` with
//! `ExistingJobStatus` for a label already used by a finished load (a failed
//! load leaves its label free); `Fail` with `Message` and an `ErrorURL` whose
//! log quotes each unfit row as `src line [...]` when more rows are unfit
//! than `max_filter_ratio` allows (nothing is loaded then), else the fit
//! rows are loaded and the unfit ones counted in `NumberFilteredRows`. An
//! unknown database or table is a `Fail` naming it. Faults: the next loads
//! answered 503 or 429, `Publish Timeout` (loaded, not yet visible), or
//! loaded with the answer lost (a 500 after the commit).
#![cfg(feature = "doris-sink")]

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Map, Value, json};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Unavailable,
    TooManyRequests,
    PublishTimeout,
    AnswerLost,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// An integer (BIGINT): a JSON integer or a string of one.
    Int,
    /// Text (VARCHAR): any scalar.
    Text,
}

#[derive(Clone)]
pub struct Column {
    pub name: String,
    pub kind: Kind,
    pub nullable: bool,
}

pub fn column(name: &str, kind: Kind, nullable: bool) -> Column {
    Column {
        name: name.into(),
        kind,
        nullable,
    }
}

/// What one request to the FE or a BE carried.
#[derive(Debug, Clone)]
pub struct Seen {
    pub backend: bool,
    pub headers: HashMap<String, String>,
}

#[derive(Default)]
struct Inner {
    username: String,
    password: String,
    be_port: u16,
    /// The host the FE redirects to.
    redirect_host: String,
    tables: HashMap<(String, String), Vec<Column>>,
    /// Loaded rows by (db, table).
    rows: HashMap<(String, String), Vec<Map<String, Value>>>,
    labels: HashMap<(String, String), &'static str>,
    error_logs: HashMap<String, String>,
    faults: VecDeque<Fault>,
    seen: Vec<Seen>,
}

pub struct Doris {
    inner: Arc<Mutex<Inner>>,
    pub fe_url: String,
    pub be_port: u16,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Doris {
    /// A server accepting `username`/`password`.
    pub async fn start(username: &str, password: &str) -> Self {
        let fe = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let be = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let be_port = be.local_addr().unwrap().port();
        let inner = Arc::new(Mutex::new(Inner {
            username: username.into(),
            password: password.into(),
            be_port,
            redirect_host: "127.0.0.1".into(),
            ..Inner::default()
        }));
        let fe_app = axum::Router::new()
            .route(
                "/api/{db}/{table}/_stream_load",
                axum::routing::put(frontend),
            )
            .with_state(inner.clone());
        let be_app = axum::Router::new()
            .route(
                "/api/{db}/{table}/_stream_load",
                axum::routing::put(backend),
            )
            .route("/api/_load_error_log", axum::routing::get(error_log))
            .with_state(inner.clone());
        let fe_url = format!("http://{}", fe.local_addr().unwrap());
        let tasks = vec![
            tokio::spawn(async move { axum::serve(fe, fe_app).await.unwrap() }),
            tokio::spawn(async move { axum::serve(be, be_app).await.unwrap() }),
        ];
        Self {
            inner,
            fe_url,
            be_port,
            tasks,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn create_table(&self, db: &str, table: &str, columns: Vec<Column>) {
        self.lock()
            .tables
            .insert((db.into(), table.into()), columns);
    }

    /// The FE redirects to this host name instead of 127.0.0.1.
    pub fn redirect_to_host(&self, host: &str) {
        self.lock().redirect_host = host.into();
    }

    pub fn fail_next(&self, faults: &[Fault]) {
        self.lock().faults.extend(faults);
    }

    /// Drops the faults not used yet.
    pub fn clear_faults(&self) {
        self.lock().faults.clear();
    }

    /// The rows loaded into `db.table`, in load order.
    pub fn rows(&self, db: &str, table: &str) -> Vec<Map<String, Value>> {
        self.lock()
            .rows
            .get(&(db.to_owned(), table.to_owned()))
            .cloned()
            .unwrap_or_default()
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }
}

impl Drop for Doris {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn header_map(headers: &HeaderMap) -> HashMap<String, String> {
    headers
        .iter()
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The answer to a request without the right credentials or `Expect`.
fn refuse(inner: &Inner, headers: &HashMap<String, String>) -> Option<Response> {
    let wanted = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", inner.username, inner.password))
    );
    if headers.get("authorization") != Some(&wanted) {
        return Some((StatusCode::UNAUTHORIZED, "no valid Basic authorization").into_response());
    }
    if headers.get("expect").map(String::as_str) != Some("100-continue") {
        return Some(
            axum::Json(json!({"status": "FAILED", "msg": "There is no 100-continue header"}))
                .into_response(),
        );
    }
    None
}

async fn frontend(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((db, table)): Path<(String, String)>,
    headers: HeaderMap,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let headers = header_map(&headers);
    inner.seen.push(Seen {
        backend: false,
        headers: headers.clone(),
    });
    if let Some(answer) = refuse(&inner, &headers) {
        return answer;
    }
    let location = format!(
        "http://{}:{}/api/{db}/{table}/_stream_load",
        inner.redirect_host, inner.be_port
    );
    (StatusCode::TEMPORARY_REDIRECT, [("location", location)]).into_response()
}

fn separator(header: Option<&String>, default: char) -> char {
    match header.map(String::as_str) {
        None => default,
        Some(text) => text
            .strip_prefix("\\x")
            .and_then(|hex| u8::from_str_radix(hex, 16).ok())
            .map(char::from)
            .unwrap_or_else(|| text.chars().next().unwrap_or(default)),
    }
}

/// A row of a load body: its text (quoted in the error log) and its columns.
type BodyRow = (String, Map<String, Value>);

/// The body's rows.
fn parse_rows(headers: &HashMap<String, String>, body: &str) -> Result<Vec<BodyRow>, String> {
    match headers.get("format").map(String::as_str).unwrap_or("csv") {
        "json" => {
            let value: Value =
                serde_json::from_str(body).map_err(|error| format!("JSON parse error: {error}"))?;
            let items = match (value, headers.get("strip_outer_array").map(String::as_str)) {
                (Value::Array(items), Some("true")) => items,
                (object @ Value::Object(_), _) => vec![object],
                _ => return Err("JSON data is an array, strip_outer_array must be true".into()),
            };
            items
                .into_iter()
                .map(|item| match item {
                    Value::Object(row) => Ok((serde_json::to_string(&row).unwrap(), row)),
                    other => Err(format!("not a JSON object: {other}")),
                })
                .collect()
        }
        "csv" => {
            let columns: Vec<String> = headers
                .get("columns")
                .map(|columns| {
                    columns
                        .split(',')
                        .map(|c| c.trim().trim_matches('`').to_owned())
                        .filter(|c| !c.contains('='))
                        .collect()
                })
                .unwrap_or_default();
            let field_separator = separator(headers.get("column_separator"), '\t');
            let line_delimiter = separator(headers.get("line_delimiter"), '\n');
            body.split(line_delimiter)
                .filter(|line| !line.is_empty())
                .map(|line| {
                    let mut row = Map::new();
                    for (column, field) in columns.iter().zip(line.split(field_separator)) {
                        let value = if field == "\\N" {
                            Value::Null
                        } else if let Some(text) =
                            field.strip_prefix('"').and_then(|f| f.strip_suffix('"'))
                        {
                            Value::String(text.replace("\\\"", "\"").replace("\\\\", "\\"))
                        } else {
                            serde_json::from_str(field).unwrap_or(Value::String(field.into()))
                        };
                        row.insert(column.clone(), value);
                    }
                    Ok((line.to_owned(), row))
                })
                .collect()
        }
        other => Err(format!("unknown format {other}")),
    }
}

/// Why `row` does not fit `columns`, if it does not.
fn unfit(columns: &[Column], row: &Map<String, Value>) -> Option<String> {
    for column in columns {
        let value = row.get(&column.name).unwrap_or(&Value::Null);
        let fits = match (value, column.kind) {
            (Value::Null, _) => column.nullable,
            (Value::Number(number), Kind::Int) => number.is_i64(),
            (Value::String(text), Kind::Int) => text.parse::<i64>().is_ok(),
            (_, Kind::Int) => false,
            (Value::Array(_) | Value::Object(_), Kind::Text) => false,
            (_, Kind::Text) => true,
        };
        if !fits {
            return Some(format!("column({}) value is incorrect", column.name));
        }
    }
    None
}

async fn backend(
    State(shared): State<Arc<Mutex<Inner>>>,
    Path((db, table)): Path<(String, String)>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut inner = shared.lock().unwrap();
    let headers = header_map(&headers);
    inner.seen.push(Seen {
        backend: true,
        headers: headers.clone(),
    });
    if let Some(answer) = refuse(&inner, &headers) {
        return answer;
    }
    let Some(label) = headers.get("label").cloned() else {
        return axum::Json(json!({"Status": "Fail", "Message": "no label"})).into_response();
    };
    let Some(columns) = inner.tables.get(&(db.clone(), table.clone())).cloned() else {
        return axum::Json(json!({"Status": "Fail", "Message": format!("errCode = 2, detailMessage = Unknown table '{table}' in database '{db}'")})).into_response();
    };
    if let Some(status) = inner.labels.get(&(db.clone(), label.clone())) {
        return axum::Json(json!({"Status": "Label Already Exists", "ExistingJobStatus": status, "Label": label, "Message": format!("Label [{label}] has already been used.")})).into_response();
    }
    let fault = inner.faults.pop_front();
    match fault {
        Some(Fault::Unavailable) => {
            return (StatusCode::SERVICE_UNAVAILABLE, [("Retry-After", "0")], "").into_response();
        }
        Some(Fault::TooManyRequests) => return StatusCode::TOO_MANY_REQUESTS.into_response(),
        _ => {}
    }
    let rows = match parse_rows(&headers, &body) {
        Ok(rows) => rows,
        Err(message) => {
            return axum::Json(json!({"Status": "Fail", "Label": label, "Message": message}))
                .into_response();
        }
    };
    let total = rows.len();
    let mut fit = Vec::new();
    let mut log = String::new();
    for (text, row) in rows {
        match unfit(&columns, &row) {
            None => fit.push(row),
            Some(reason) => log.push_str(&format!("Reason: {reason}. src line [{text}]; \n")),
        }
    }
    let filtered = total - fit.len();
    let ratio: f64 = headers
        .get("max_filter_ratio")
        .and_then(|ratio| ratio.parse().ok())
        .unwrap_or(0.0);
    let error_url = (filtered > 0).then(|| {
        let file = format!("__shard_{}/error_log_{label}", inner.error_logs.len());
        inner.error_logs.insert(file.clone(), log.clone());
        format!(
            "http://127.0.0.1:{}/api/_load_error_log?file={file}",
            inner.be_port
        )
    });
    if filtered > 0 && filtered as f64 > ratio * total as f64 {
        return axum::Json(json!({
            "TxnId": 1, "Label": label, "Status": "Fail",
            "Message": "[DATA_QUALITY_ERROR]too many filtered rows",
            "NumberTotalRows": total, "NumberLoadedRows": 0, "NumberFilteredRows": filtered,
            "ErrorURL": error_url,
        }))
        .into_response();
    }
    let loaded = fit.len();
    inner
        .rows
        .entry((db.clone(), table))
        .or_default()
        .extend(fit);
    inner.labels.insert((db, label.clone()), "FINISHED");
    let status = match fault {
        Some(Fault::PublishTimeout) => "Publish Timeout",
        Some(Fault::AnswerLost) => {
            return (StatusCode::INTERNAL_SERVER_ERROR, "connection reset").into_response();
        }
        _ => "Success",
    };
    let mut answer = json!({
        "TxnId": 1, "Label": label, "Status": status, "Message": "OK",
        "NumberTotalRows": total, "NumberLoadedRows": loaded, "NumberFilteredRows": filtered,
    });
    if let Some(url) = error_url {
        answer["ErrorURL"] = json!(url);
    }
    axum::Json(answer).into_response()
}

async fn error_log(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let inner = inner.lock().unwrap();
    match params
        .get("file")
        .and_then(|file| inner.error_logs.get(file))
    {
        Some(log) => log.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}
