//! A protocol test server of InfluxDB 2.x (`/api/v2/write`, Token auth) and
//! 3.x (`/api/v3/write_lp`, Bearer auth), which Debian's 1.6 does not have.
//! Points are stored by series and timestamp (a rewrite overwrites, as the
//! real engines do). A line containing `poison` is refused the way each
//! version does: v2 refuses the whole request (`line N` in the message), v3
//! writes the rest and lists the refused lines (`line_number`). Faults: the
//! next requests answered 503 (with `Retry-After`) or 429.
//!
//! Queries (for the source): `/api/v2/query` (Flux, answered in annotated CSV
//! with `#datatype`/`#group`/`#default`, one table per series and field, the
//! way Flux groups) and `/api/v3/query_sql` (SQL, answered in JSON lines,
//! rows sharing a timestamp in a different order on every other query, as
//! DataFusion does not keep one). They read the points seeded with `seed`
//! and understand the query shapes of upstream's examples: the bucket or
//! table, the measurement filter, the time bound against the cursor (`>` or
//! `>=`), `limit(n:)`/`LIMIT` and `OFFSET`. Anything else is a 400 in each
//! version's error shape. The organization is `iggy`; a bucket or database
//! nothing was seeded into is a 404.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answered as usual (a place in the script of the next requests).
    Pass,
    /// 503 with `Retry-After: 0`.
    Unavailable,
    /// 503 with `Retry-After` of that many seconds.
    UnavailableFor(u64),
    TooManyRequests,
}

#[derive(Default)]
struct Inner {
    token: String,
    /// (series, timestamp) -> fields.
    points: BTreeMap<(String, String), String>,
    requests: Vec<HashMap<String, String>>,
    faults: VecDeque<Fault>,
    /// Points for the query endpoints, in seeding order.
    seeded: Vec<Seeded>,
    /// Query bodies received, in order.
    queries: Vec<String>,
    sql_queries: u64,
}

/// One point for the query endpoints.
#[derive(Clone)]
pub struct Seeded {
    /// The v2 bucket, or the v3 database.
    pub bucket: String,
    pub measurement: String,
    pub tags: Vec<(String, String)>,
    pub fields: Vec<(String, serde_json::Value)>,
    /// ns since the epoch.
    pub time: i64,
}

pub struct InfluxHttp {
    inner: Arc<Mutex<Inner>>,
    pub url: String,
    task: tokio::task::JoinHandle<()>,
}

impl InfluxHttp {
    /// Accepts requests carrying `token`.
    pub async fn start(token: &str) -> Self {
        let inner = Arc::new(Mutex::new(Inner {
            token: token.to_owned(),
            ..Inner::default()
        }));
        let app = axum::Router::new()
            .route(
                "/health",
                axum::routing::get(|| async { "{\"status\":\"pass\"}" }),
            )
            .route("/api/v2/write", axum::routing::post(write_v2))
            .route("/api/v3/write_lp", axum::routing::post(write_v3))
            .route("/api/v2/query", axum::routing::post(query_v2))
            .route("/api/v3/query_sql", axum::routing::post(query_v3))
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { inner, url, task }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap()
    }

    pub fn fail_next(&self, faults: &[Fault]) {
        self.lock().faults.extend(faults);
    }

    /// Every stored point as `series fields timestamp`.
    pub fn points(&self) -> Vec<String> {
        self.lock()
            .points
            .iter()
            .map(|((series, timestamp), fields)| format!("{series} {fields} {timestamp}"))
            .collect()
    }

    pub fn requests(&self) -> Vec<HashMap<String, String>> {
        self.lock().requests.clone()
    }

    /// Adds a point the query endpoints read.
    pub fn seed(
        &self,
        bucket: &str,
        measurement: &str,
        tags: &[(&str, &str)],
        fields: &[(&str, serde_json::Value)],
        time: i64,
    ) {
        self.lock().seeded.push(Seeded {
            bucket: bucket.into(),
            measurement: measurement.into(),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            fields: fields
                .iter()
                .map(|(k, v)| ((*k).into(), v.clone()))
                .collect(),
            time,
        });
    }

    /// The query texts received (Flux or SQL), in order.
    pub fn queries(&self) -> Vec<String> {
        self.lock().queries.clone()
    }
}

impl Drop for InfluxHttp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `series fields timestamp`, split at the first unescaped space and the last space.
fn split(line: &str) -> Option<(String, String, String)> {
    let bytes = line.as_bytes();
    let mut first = None;
    for (index, byte) in bytes.iter().enumerate() {
        if *byte == b' ' && (index == 0 || bytes[index - 1] != b'\\') {
            first = Some(index);
            break;
        }
    }
    let first = first?;
    let last = line.rfind(' ')?;
    (last > first).then(|| {
        (
            line[..first].to_owned(),
            line[first + 1..last].to_owned(),
            line[last + 1..].to_owned(),
        )
    })
}

fn check(
    inner: &mut Inner,
    headers: &HeaderMap,
    scheme: &str,
    params: HashMap<String, String>,
) -> Option<Response> {
    inner.requests.push(params);
    let wanted = format!("{scheme} {}", inner.token);
    if headers
        .get("authorization")
        .and_then(|value| value.to_str().ok())
        != Some(wanted.as_str())
    {
        return Some(
            (
                StatusCode::UNAUTHORIZED,
                "{\"code\":\"unauthorized\",\"message\":\"unauthorized access\"}",
            )
                .into_response(),
        );
    }
    match inner.faults.pop_front() {
        Some(Fault::Unavailable) => {
            Some((StatusCode::SERVICE_UNAVAILABLE, [("Retry-After", "0")], "").into_response())
        }
        Some(Fault::UnavailableFor(seconds)) => Some(
            (
                StatusCode::SERVICE_UNAVAILABLE,
                [("Retry-After", seconds.to_string())],
                "",
            )
                .into_response(),
        ),
        Some(Fault::TooManyRequests) => Some((StatusCode::TOO_MANY_REQUESTS, "").into_response()),
        Some(Fault::Pass) | None => None,
    }
}

async fn write_v2(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut inner = inner.lock().unwrap();
    if let Some(answer) = check(&mut inner, &headers, "Token", params) {
        return answer;
    }
    let lines: Vec<&str> = body.lines().collect();
    let bad: Vec<usize> = (0..lines.len())
        .filter(|index| lines[*index].contains("poison"))
        .collect();
    if let Some(first) = bad.first() {
        let detail: String = bad
            .iter()
            .map(|index| format!("\nline {}: invalid field value", index + 1))
            .collect();
        let message = serde_json::json!({
            "code": "invalid",
            "line": first + 1,
            "message": format!("failed to parse line protocol: errors encountered on line(s):{detail}"),
        });
        return (StatusCode::BAD_REQUEST, message.to_string()).into_response();
    }
    for line in lines {
        store(&mut inner, line);
    }
    StatusCode::NO_CONTENT.into_response()
}

async fn write_v3(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut inner = inner.lock().unwrap();
    if let Some(answer) = check(&mut inner, &headers, "Bearer", params) {
        return answer;
    }
    let mut errors = Vec::new();
    for (index, line) in body.lines().enumerate() {
        if line.contains("poison") {
            errors.push(serde_json::json!({
                "original_line": line,
                "line_number": index + 1,
                "error_message": "invalid column type",
            }));
        } else {
            store(&mut inner, line);
        }
    }
    if errors.is_empty() {
        return StatusCode::NO_CONTENT.into_response();
    }
    let answer =
        serde_json::json!({"error": "partial write of line protocol occurred", "data": errors});
    (StatusCode::BAD_REQUEST, answer.to_string()).into_response()
}

fn store(inner: &mut Inner, line: &str) {
    if let Some((series, fields, timestamp)) = split(line) {
        inner.points.insert((series, timestamp), fields);
    }
}

/// ns since the epoch as RFC 3339 with nine fraction digits and `Z`.
pub fn rfc3339(nanos: i64) -> String {
    let time = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(nanos as u64);
    humantime::format_rfc3339_nanos(time).to_string()
}

fn parse_time(text: &str) -> Option<i64> {
    let time = humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).ok()?;
    Some(time.duration_since(std::time::UNIX_EPOCH).ok()?.as_nanos() as i64)
}

/// The seeded points a query selects: `bucket`, optional measurement, after
/// the bound (`>` or `>=` the time), in time order, `offset` and `limit` applied.
fn select(
    seeded: &[Seeded],
    bucket: &str,
    measurement: Option<&str>,
    bound: (&str, i64),
    offset: usize,
    limit: Option<usize>,
) -> Vec<Seeded> {
    let mut points: Vec<Seeded> = seeded
        .iter()
        .filter(|point| point.bucket == bucket)
        .filter(|point| measurement.is_none_or(|m| point.measurement == m))
        .filter(|point| match bound.0 {
            ">" => point.time > bound.1,
            _ => point.time >= bound.1,
        })
        .cloned()
        .collect();
    points.sort_by_key(|point| point.time);
    points
        .into_iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
        .collect()
}

fn capture<'a>(pattern: &str, text: &'a str) -> Option<regex::Captures<'a>> {
    regex::Regex::new(pattern).unwrap().captures(text)
}

async fn query_v2(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut inner = inner.lock().unwrap();
    let org = params.get("org").cloned().unwrap_or_default();
    if let Some(answer) = check(&mut inner, &headers, "Token", params) {
        return answer;
    }
    let invalid = |message: &str| {
        let answer = serde_json::json!({"code": "invalid", "message": message});
        (StatusCode::BAD_REQUEST, answer.to_string()).into_response()
    };
    let request: serde_json::Value = match serde_json::from_str(&body) {
        Ok(request) => request,
        Err(_) => return invalid("failed to decode request body"),
    };
    let flux = request["query"].as_str().unwrap_or_default().to_owned();
    inner.queries.push(flux.clone());
    if org != "iggy" {
        let answer = serde_json::json!({"code": "not found", "message": format!("organization name \"{org}\" not found")});
        return (StatusCode::NOT_FOUND, answer.to_string()).into_response();
    }
    let Some(bucket) = capture(r#"from\(bucket:\s*"([^"]+)"\)"#, &flux) else {
        return invalid("compilation failed: error calling function \"from\": missing bucket");
    };
    let bucket = bucket[1].to_owned();
    if !inner.seeded.iter().any(|point| point.bucket == bucket) {
        let answer = serde_json::json!({"code": "not found", "message": format!("failed to initialize execute state: could not find bucket \"{bucket}\"")});
        return (StatusCode::NOT_FOUND, answer.to_string()).into_response();
    }
    let measurement =
        capture(r#"r\._measurement\s*==\s*"([^"]+)""#, &flux).map(|c| c[1].to_owned());
    let bound = capture(r#"r\._time\s*(>=|>)\s*time\(v:\s*"([^"]+)"\)"#, &flux)
        .map(|c| (c[1].to_owned(), c[2].to_owned()))
        .or_else(|| {
            capture(r#"range\(start:\s*time\(v:\s*"([^"]+)"\)"#, &flux)
                .map(|c| (">=".to_owned(), c[1].to_owned()))
        });
    let Some((operator, cursor)) = bound else {
        return invalid("compilation failed: no time bound this test server understands");
    };
    let Some(cursor) = parse_time(&cursor) else {
        return invalid(&format!("compilation failed: cannot parse time {cursor:?}"));
    };
    let limit = capture(r"limit\(n:\s*(\d+)\)", &flux).map(|c| c[1].parse().unwrap());
    // Flux's limit is per table: one field of one series here.
    let points = select(
        &inner.seeded,
        &bucket,
        measurement.as_deref(),
        (&operator, cursor),
        0,
        None,
    );
    // (series and field, its rows as point, field, value)
    type Table = (String, Vec<(Seeded, String, serde_json::Value)>);
    let mut tables: Vec<Table> = Vec::new();
    for point in points {
        for (field, value) in &point.fields {
            let key = format!("{}|{:?}|{field}", point.measurement, point.tags);
            let position = match tables.iter().position(|(k, _)| *k == key) {
                Some(position) => position,
                None => {
                    tables.push((key, Vec::new()));
                    tables.len() - 1
                }
            };
            tables[position]
                .1
                .push((point.clone(), field.clone(), value.clone()));
        }
    }
    let mut csv = String::new();
    for (table, (_, rows)) in tables.iter().enumerate() {
        let rows: Vec<_> = rows.iter().take(limit.unwrap_or(usize::MAX)).collect();
        let Some((first, _, value)) = rows.first() else {
            continue;
        };
        let datatype = match value {
            serde_json::Value::Bool(_) => "boolean",
            serde_json::Value::Number(n) if n.is_i64() => "long",
            serde_json::Value::Number(_) => "double",
            _ => "string",
        };
        let tag_names: Vec<&str> = first.tags.iter().map(|(k, _)| k.as_str()).collect();
        let mut datatypes = vec![
            "#datatype",
            "string",
            "long",
            "dateTime:RFC3339",
            "dateTime:RFC3339",
            "dateTime:RFC3339Nano",
            datatype,
            "string",
            "string",
        ];
        datatypes.extend(tag_names.iter().map(|_| "string"));
        let mut group = vec![
            "#group", "false", "false", "true", "true", "false", "false", "true", "true",
        ];
        group.extend(tag_names.iter().map(|_| "true"));
        let mut default = vec!["#default".to_owned(), "_result".to_owned()];
        default.extend((0..7 + tag_names.len()).map(|_| String::new()));
        let mut header = vec![
            "",
            "result",
            "table",
            "_start",
            "_stop",
            "_time",
            "_value",
            "_field",
            "_measurement",
        ];
        header.extend(tag_names.iter().copied());
        csv.push_str(&format!(
            "{}\r\n{}\r\n{}\r\n{}\r\n",
            datatypes.join(","),
            group.join(","),
            default.join(","),
            header.join(",")
        ));
        for (point, field, value) in rows {
            let value = match value {
                serde_json::Value::String(text) => format!("\"{}\"", text.replace('"', "\"\"")),
                other => other.to_string(),
            };
            let mut line = vec![
                String::new(),
                String::new(),
                table.to_string(),
                rfc3339(cursor),
                rfc3339(4_102_444_800_000_000_000),
                rfc3339(point.time),
                value,
                field.clone(),
                point.measurement.clone(),
            ];
            line.extend(point.tags.iter().map(|(_, v)| v.clone()));
            csv.push_str(&line.join(","));
            csv.push_str("\r\n");
        }
        csv.push_str("\r\n");
    }
    ([("content-type", "text/csv; charset=utf-8")], csv).into_response()
}

async fn query_v3(
    State(inner): State<Arc<Mutex<Inner>>>,
    Query(params): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mut inner = inner.lock().unwrap();
    if let Some(answer) = check(&mut inner, &headers, "Bearer", params) {
        return answer;
    }
    let invalid = |message: &str| {
        let answer = serde_json::json!({"error": message});
        (StatusCode::BAD_REQUEST, answer.to_string()).into_response()
    };
    let request: serde_json::Value = match serde_json::from_str(&body) {
        Ok(request) => request,
        Err(_) => return invalid("invalid request body"),
    };
    let db = request["db"].as_str().unwrap_or_default().to_owned();
    let sql = request["q"].as_str().unwrap_or_default().to_owned();
    inner.queries.push(sql.clone());
    if request["format"] != "jsonl" {
        return invalid("this test server answers format jsonl only");
    }
    if !inner.seeded.iter().any(|point| point.bucket == db) {
        let answer = serde_json::json!({"error": format!("database not found: {db}")});
        return (StatusCode::NOT_FOUND, answer.to_string()).into_response();
    }
    let Some(table) = capture(r#"(?i)FROM\s+"?(\w+)"?"#, &sql) else {
        return invalid("error while planning query: no FROM");
    };
    let Some(bound) = capture(r"(?i)\btime\s*(>=|>)\s*'([^']+)'", &sql) else {
        return invalid("error while planning query: no time bound this test server understands");
    };
    let Some(cursor) = parse_time(&bound[2]) else {
        return invalid(&format!(
            "error while planning query: cannot cast {:?} to timestamp",
            &bound[2]
        ));
    };
    let limit = capture(r"(?i)LIMIT\s+(\d+)", &sql).map(|c| c[1].parse().unwrap());
    let offset = capture(r"(?i)OFFSET\s+(\d+)", &sql).map_or(0, |c| c[1].parse().unwrap());
    let mut points = select(
        &inner.seeded,
        &db,
        Some(&table[1]),
        (&bound[1], cursor),
        0,
        None,
    );
    inner.sql_queries += 1;
    if inner.sql_queries % 2 == 0 {
        // Ties in the other order: a stable descending sort, reversed.
        points.sort_by_key(|point| std::cmp::Reverse(point.time));
        points.reverse();
    }
    let mut lines = String::new();
    for point in points
        .into_iter()
        .skip(offset)
        .take(limit.unwrap_or(usize::MAX))
    {
        let mut row = serde_json::Map::new();
        for (tag, value) in &point.tags {
            row.insert(tag.clone(), serde_json::Value::String(value.clone()));
        }
        // InfluxDB 3 answers times without a zone.
        row.insert(
            "time".into(),
            serde_json::Value::String(rfc3339(point.time).trim_end_matches('Z').to_owned()),
        );
        for (field, value) in &point.fields {
            row.insert(field.clone(), value.clone());
        }
        lines.push_str(&serde_json::Value::Object(row).to_string());
        lines.push('\n');
    }
    ([("content-type", "application/jsonl")], lines).into_response()
}
