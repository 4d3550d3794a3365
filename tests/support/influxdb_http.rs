//! A protocol test server of InfluxDB 2.x (`/api/v2/write`, Token auth) and
//! 3.x (`/api/v3/write_lp`, Bearer auth), which Debian's 1.6 does not have.
//! Points are stored by series and timestamp (a rewrite overwrites, as the
//! real engines do). A line containing `poison` is refused the way each
//! version does: v2 refuses the whole request (`line N` in the message), v3
//! writes the rest and lists the refused lines (`line_number`). Faults: the
//! next requests answered 503 (with `Retry-After`) or 429.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Unavailable,
    TooManyRequests,
}

#[derive(Default)]
struct Inner {
    token: String,
    /// (series, timestamp) -> fields.
    points: BTreeMap<(String, String), String>,
    requests: Vec<HashMap<String, String>>,
    faults: VecDeque<Fault>,
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
        Some(Fault::TooManyRequests) => Some((StatusCode::TOO_MANY_REQUESTS, "").into_response()),
        None => None,
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
