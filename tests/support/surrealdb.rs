//! A SurrealDB protocol test server (the real engine is ~600 crates, too
//! heavy for CI here, see docs/connectors/surrealdb.md): axum on 127.0.0.1:0, following
//! SurrealDB's documented HTTP API (2.x/3.x) for what the sink uses.
//!
//! - `GET /health`;
//! - `POST /signin` with `{user, pass[, ns[, db]]}`: 200 with a token, or 401
//!   with SurrealDB's authentication error body;
//! - `POST /sql` (the body is SurrealQL) and `POST /rpc` (JSON-RPC, method
//!   `query` with `[sql, vars]`): `surreal-ns` / `surreal-db` select the
//!   namespace and database (1.x's `NS` / `DB` too); Basic auth checked
//!   against the users (`surreal-auth-ns` / `surreal-auth-db` say where a user
//!   is defined); bad credentials are 401, anonymous statements fail with
//!   `IAM error: Not enough permissions`. `/sql` answers an array of
//!   per-statement results (`{status: OK|ERR, time, result}`), `/rpc`
//!   `{id, result: [...]}` or `{id, error: {code, message}}`; a parse error
//!   fails the whole request (400 from `/sql`, an `error` from `/rpc`).
//!
//! The SurrealQL understood is the sink's subset: `INFO FOR DB`, `USE NS x`,
//! `DEFINE NAMESPACE|DATABASE IF NOT EXISTS x`, `DEFINE TABLE IF NOT EXISTS
//! x SCHEMALESS`, `DEFINE INDEX IF NOT EXISTS i ON TABLE t FIELDS a, b
//! [UNIQUE]`, and `INSERT IGNORE INTO t $var RETURN NONE` (an object or an
//! array of objects with an `id`). Statements run one by one, without a
//! transaction: an existing record id is ignored (`IGNORE`), a field of the
//! wrong type (fields defined through [`SurrealServer::define_field`]) or a
//! unique index conflict fails that statement only; a missing namespace or
//! database fails every statement, so does a missing table when strict.
//!
//! Faults, for the next `/rpc` requests: a status (429/503 with
//! `Retry-After`), a dropped connection after the statements ran (the
//! answer is cut off), a slow answer after the statements ran, the first
//! statement failing with a retryable transaction conflict; down (503
//! for every request). `/rpc` bodies over the body limit are answered 413.
#![cfg(feature = "surrealdb-sink")]

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures::StreamExt;
use serde_json::{Map, Value, json};

/// A request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub method: Method,
    pub path: String,
    pub headers: HeaderMap,
    pub body: bytes::Bytes,
}

/// Where a user is defined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Level {
    Root,
    Namespace(String),
    Database(String, String),
}

#[derive(Debug, Clone)]
pub enum Fault {
    /// This status (a JSON error body), with `Retry-After` seconds when set.
    Status(u16, Option<u64>),
    /// Run the statements, then cut the answer off.
    Drop,
    /// Run the statements, then answer after this long.
    Slow(Duration),
    /// The first statement fails with a retryable transaction conflict.
    Conflict,
}

#[derive(Debug, Clone, Default)]
struct Table {
    records: BTreeMap<String, Value>,
    /// (field path, type): `number`, `string`, `bool`, `object`.
    fields: Vec<(String, String)>,
    /// (name, fields, unique).
    indexes: Vec<(String, Vec<String>, bool)>,
}

type Databases = BTreeMap<String, BTreeMap<String, Table>>;

struct Shared {
    users: Vec<(Level, String, String)>,
    namespaces: BTreeMap<String, Databases>,
    strict: bool,
    faults: VecDeque<Fault>,
    down: bool,
    rpc_body_limit: usize,
    inserted: u64,
    seen: Vec<Seen>,
}

#[derive(Clone)]
pub struct SurrealServer {
    shared: Arc<Mutex<Shared>>,
    pub address: SocketAddr,
}

/// Who a request runs as and where.
struct Session {
    level: Option<Level>,
    ns: Option<String>,
    db: Option<String>,
}

impl SurrealServer {
    /// A server with the root user `root`/`root` and nothing defined.
    pub async fn start() -> Self {
        let shared = Arc::new(Mutex::new(Shared {
            users: vec![(Level::Root, "root".into(), "root".into())],
            namespaces: BTreeMap::new(),
            strict: false,
            faults: VecDeque::new(),
            down: false,
            rpc_body_limit: 4 << 20,
            inserted: 0,
            seen: Vec::new(),
        }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("local address");
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        tokio::spawn(async move {
            axum::serve(listener, app)
                .await
                .expect("the surrealdb server runs");
        });
        Self { shared, address }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        lock(&self.shared)
    }

    pub fn add_user(&self, level: Level, user: &str, pass: &str) {
        self.lock().users.push((level, user.into(), pass.into()));
    }

    /// Defines `ns` and `db` (and `table` when given) directly.
    pub fn define(&self, ns: &str, db: &str, table: Option<&str>) {
        let mut shared = self.lock();
        let tables = shared
            .namespaces
            .entry(ns.into())
            .or_default()
            .entry(db.into())
            .or_default();
        if let Some(table) = table {
            tables.entry(table.into()).or_default();
        }
    }

    /// `DEFINE FIELD path ON table TYPE kind` (the table defined too).
    pub fn define_field(&self, ns: &str, db: &str, table: &str, path: &str, kind: &str) {
        self.define(ns, db, Some(table));
        let mut shared = self.lock();
        table_mut(&mut shared, ns, db, table)
            .fields
            .push((path.into(), kind.into()));
    }

    /// `DEFINE INDEX name ON table FIELDS ... UNIQUE` (the table defined too).
    pub fn define_unique_index(
        &self,
        ns: &str,
        db: &str,
        table: &str,
        name: &str,
        fields: &[&str],
    ) {
        self.define(ns, db, Some(table));
        let mut shared = self.lock();
        table_mut(&mut shared, ns, db, table).indexes.push((
            name.into(),
            fields.iter().map(|field| field.to_string()).collect(),
            true,
        ));
    }

    /// Undefined tables are refused instead of created on first write.
    pub fn set_strict(&self, strict: bool) {
        self.lock().strict = strict;
    }

    /// Largest `/rpc` body taken (`SURREAL_HTTP_MAX_RPC_BODY_SIZE`, 4 MiB
    /// by default); 413 past it.
    pub fn set_rpc_body_limit(&self, bytes: usize) {
        self.lock().rpc_body_limit = bytes;
    }

    /// 503 for every request while down.
    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    pub fn fail_next(&self, fault: Fault) {
        self.lock().faults.push_back(fault);
    }

    /// The records of a table, by id key.
    pub fn records(&self, ns: &str, db: &str, table: &str) -> BTreeMap<String, Value> {
        self.lock()
            .namespaces
            .get(ns)
            .and_then(|dbs| dbs.get(db))
            .and_then(|tables| tables.get(table))
            .map(|table| table.records.clone())
            .unwrap_or_default()
    }

    /// The indexes defined on a table: (name, fields, unique).
    pub fn indexes(&self, ns: &str, db: &str, table: &str) -> Vec<(String, Vec<String>, bool)> {
        self.lock()
            .namespaces
            .get(ns)
            .and_then(|dbs| dbs.get(db))
            .and_then(|tables| tables.get(table))
            .map(|table| table.indexes.clone())
            .unwrap_or_default()
    }

    pub fn namespace_exists(&self, ns: &str) -> bool {
        self.lock().namespaces.contains_key(ns)
    }

    /// How many records INSERTs stored (ignored ones not counted).
    pub fn inserted(&self) -> u64 {
        self.lock().inserted
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// The `/rpc` requests seen.
    pub fn rpc_requests(&self) -> Vec<Seen> {
        self.seen()
            .into_iter()
            .filter(|seen| seen.path == "/rpc")
            .collect()
    }
}

fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn table_mut<'a>(shared: &'a mut Shared, ns: &str, db: &str, table: &str) -> &'a mut Table {
    shared
        .namespaces
        .get_mut(ns)
        .and_then(|dbs| dbs.get_mut(db))
        .and_then(|tables| tables.get_mut(table))
        .expect("defined")
}

fn auth_failed() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        axum::Json(json!({
            "code": 401,
            "details": "Authentication failed",
            "description": "Your authentication details are invalid. Reauthenticate using valid authentication parameters.",
            "information": "There was a problem with authentication",
        })),
    )
        .into_response()
}

fn header(headers: &HeaderMap, names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|name| headers.get(*name)?.to_str().ok().map(str::to_owned))
}

async fn handle(State(shared): State<Arc<Mutex<Shared>>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let path = parts.uri.path().to_owned();
    lock(&shared).seen.push(Seen {
        at: Instant::now(),
        method: parts.method.clone(),
        path: path.clone(),
        headers: parts.headers.clone(),
        body: body.clone(),
    });
    match (parts.method.as_str(), path.as_str()) {
        ("GET", "/health") => StatusCode::OK.into_response(),
        ("POST", "/signin") => signin(&shared, &body),
        ("POST", "/sql") => {
            let Some(session) = session(&shared, &parts.headers) else {
                return auth_failed();
            };
            let text = String::from_utf8_lossy(&body).into_owned();
            match run(&mut lock(&shared), session, &text, &Map::new()) {
                Ok(results) => axum::Json(Value::Array(results)).into_response(),
                Err(parse_error) => (
                    StatusCode::BAD_REQUEST,
                    axum::Json(json!({
                        "code": 400,
                        "details": "Request problems detected",
                        "description": "There is a problem with your request. Refer to the documentation for further information.",
                        "information": format!("There was a problem with the database: {parse_error}"),
                    })),
                )
                    .into_response(),
            }
        }
        _ if lock(&shared).down => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(
                json!({"code": 503, "details": "down", "information": "the server is down"}),
            ),
        )
            .into_response(),
        ("POST", "/rpc") => {
            if body.len() > lock(&shared).rpc_body_limit {
                return (StatusCode::PAYLOAD_TOO_LARGE, "length limit exceeded").into_response();
            }
            let fault = lock(&shared).faults.pop_front();
            if let Some(Fault::Status(status, retry_after)) = fault {
                let status = StatusCode::from_u16(status).expect("a valid status");
                let body = json!({"code": status.as_u16(), "details": "injected", "information": "injected fault"});
                let mut response = (status, axum::Json(body)).into_response();
                if let Some(seconds) = retry_after {
                    response.headers_mut().insert(
                        "retry-after",
                        seconds.to_string().parse().expect("a header"),
                    );
                }
                return response;
            }
            let Some(session) = session(&shared, &parts.headers) else {
                return auth_failed();
            };
            let answer = rpc(
                &shared,
                session,
                &body,
                matches!(fault, Some(Fault::Conflict)),
            );
            match fault {
                Some(Fault::Drop) => {
                    // Headers and the start of the body, then the connection breaks.
                    let stream = futures::stream::iter([false, true]).then(|broken| async move {
                        if broken {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                            Err(std::io::Error::other("connection dropped"))
                        } else {
                            Ok(bytes::Bytes::from_static(b"{\"id\":1,"))
                        }
                    });
                    Response::builder()
                        .status(StatusCode::OK)
                        .header("content-type", "application/json")
                        .body(Body::from_stream(stream))
                        .expect("a response")
                }
                Some(Fault::Slow(delay)) => {
                    tokio::time::sleep(delay).await;
                    axum::Json(answer).into_response()
                }
                _ => axum::Json(answer).into_response(),
            }
        }
        _ => StatusCode::NOT_FOUND.into_response(),
    }
}

fn signin(shared: &Mutex<Shared>, body: &[u8]) -> Response {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return (StatusCode::BAD_REQUEST, "not JSON").into_response();
    };
    let text = |key: &str| request[key].as_str().map(str::to_owned);
    let level = match (text("ns"), text("db")) {
        (None, _) => Level::Root,
        (Some(ns), None) => Level::Namespace(ns),
        (Some(ns), Some(db)) => Level::Database(ns, db),
    };
    let (Some(user), Some(pass)) = (text("user"), text("pass")) else {
        return auth_failed();
    };
    let known = lock(shared)
        .users
        .iter()
        .any(|(l, u, p)| *l == level && *u == user && *p == pass);
    if known {
        axum::Json(json!({"code": 200, "details": "Authentication succeeded", "token": "eyJ0ZXN0IjoidG9rZW4ifQ"}))
            .into_response()
    } else {
        auth_failed()
    }
}

/// The session of a request; `None` when its credentials are refused.
fn session(shared: &Mutex<Shared>, headers: &HeaderMap) -> Option<Session> {
    let ns = header(headers, &["surreal-ns", "ns"]);
    let db = header(headers, &["surreal-db", "db"]);
    let Some(authorization) = header(headers, &["authorization"]) else {
        return Some(Session {
            level: None,
            ns,
            db,
        });
    };
    let encoded = authorization.strip_prefix("Basic ")?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (user, pass) = decoded.split_once(':')?;
    let level = match (
        header(headers, &["surreal-auth-ns"]),
        header(headers, &["surreal-auth-db"]),
    ) {
        (None, _) => Level::Root,
        (Some(ns), None) => Level::Namespace(ns),
        (Some(ns), Some(db)) => Level::Database(ns, db),
    };
    let known = lock(shared)
        .users
        .iter()
        .any(|(l, u, p)| *l == level && u == user && p == pass);
    known.then_some(Session {
        level: Some(level),
        ns,
        db,
    })
}

fn rpc(shared: &Mutex<Shared>, session: Session, body: &[u8], conflict: bool) -> Value {
    let Ok(request) = serde_json::from_slice::<Value>(body) else {
        return json!({"id": null, "error": {"code": -32700, "message": "Parse error"}});
    };
    let id = request["id"].clone();
    if request["method"] != "query" {
        return json!({"id": id, "error": {"code": -32601, "message": "Method not found"}});
    }
    let Some(sql) = request["params"][0].as_str() else {
        return json!({"id": id, "error": {"code": -32602, "message": "Invalid params"}});
    };
    let vars = request["params"][1]
        .as_object()
        .cloned()
        .unwrap_or_default();
    // A conflicting statement runs nothing: left out, answered its error.
    let sql = if conflict {
        sql.split_once(';').map_or("", |(_, rest)| rest).to_owned()
    } else {
        sql.to_owned()
    };
    match run(&mut lock(shared), session, &sql, &vars) {
        Ok(mut results) => {
            if conflict {
                results.insert(0, err("Failed to commit transaction due to a read or write conflict. This transaction can be retried".into()));
            }
            json!({"id": id, "result": results})
        }
        Err(parse_error) => json!({"id": id, "error": {
            "code": -32000,
            "message": format!("There was a problem with the database: {parse_error}"),
        }}),
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Word(String),
    Ident(String),
    Var(String),
    Comma,
}

/// The statements of `text` as tokens; a parse error for what is not the
/// sink's subset.
fn parse(text: &str) -> Result<Vec<Vec<Token>>, String> {
    let mut statements = vec![Vec::new()];
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ';' => statements.push(Vec::new()),
            ',' => statements.last_mut().expect("one").push(Token::Comma),
            c if c.is_whitespace() => {}
            '`' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('\\') => name.push(chars.next().ok_or("Parse error: unclosed `")?),
                        Some('`') => break,
                        Some(c) => name.push(c),
                        None => return Err("Parse error: unclosed `".into()),
                    }
                }
                statements.last_mut().expect("one").push(Token::Ident(name));
            }
            '$' | 'a'..='z' | 'A'..='Z' | '_' | '0'..='9' => {
                let mut word = String::new();
                if c != '$' {
                    word.push(c);
                }
                while let Some(&next) = chars.peek() {
                    if next.is_alphanumeric() || next == '_' {
                        word.push(next);
                        chars.next();
                    } else {
                        break;
                    }
                }
                statements.last_mut().expect("one").push(if c == '$' {
                    Token::Var(word)
                } else {
                    Token::Word(word)
                });
            }
            other => return Err(format!("Parse error: unexpected '{other}'")),
        }
    }
    statements.retain(|statement| !statement.is_empty());
    Ok(statements)
}

fn name(token: Option<&Token>) -> Result<String, String> {
    match token {
        Some(Token::Word(word) | Token::Ident(word)) => Ok(word.clone()),
        other => Err(format!("Parse error: expected a name, found {other:?}")),
    }
}

fn words(tokens: &[Token]) -> Vec<String> {
    tokens
        .iter()
        .map(|token| match token {
            Token::Word(word) => word.to_ascii_uppercase(),
            _ => String::new(),
        })
        .collect()
}

/// One statement understood.
enum Parsed {
    InfoForDb,
    UseNs(String),
    DefineNamespace(String),
    DefineDatabase(String),
    DefineTable(String),
    DefineIndex {
        name: String,
        table: String,
        fields: Vec<String>,
        unique: bool,
    },
    Insert {
        table: String,
        var: String,
    },
}

fn understand(tokens: &[Token]) -> Result<Parsed, String> {
    let upper = words(tokens);
    let upper: Vec<&str> = upper.iter().map(String::as_str).collect();
    let not_subset = || Err(format!("Parse error: not understood: {tokens:?}"));
    Ok(match upper.as_slice() {
        ["INFO", "FOR", "DB"] => Parsed::InfoForDb,
        ["USE", "NS", _] => Parsed::UseNs(name(tokens.get(2))?),
        ["DEFINE", "NAMESPACE", "IF", "NOT", "EXISTS", _] => {
            Parsed::DefineNamespace(name(tokens.get(5))?)
        }
        ["DEFINE", "DATABASE", "IF", "NOT", "EXISTS", _] => {
            Parsed::DefineDatabase(name(tokens.get(5))?)
        }
        ["DEFINE", "TABLE", "IF", "NOT", "EXISTS", _, "SCHEMALESS"] => {
            Parsed::DefineTable(name(tokens.get(5))?)
        }
        [
            "DEFINE",
            "INDEX",
            "IF",
            "NOT",
            "EXISTS",
            _,
            "ON",
            "TABLE",
            _,
            "FIELDS",
            rest @ ..,
        ] => {
            let mut fields = Vec::new();
            let mut unique = false;
            for (token, word) in tokens[10..].iter().zip(rest) {
                match (token, *word) {
                    (Token::Comma, _) => {}
                    (_, "UNIQUE") => unique = true,
                    (token, _) => fields.push(name(Some(token))?),
                }
            }
            Parsed::DefineIndex {
                name: name(tokens.get(5))?,
                table: name(tokens.get(8))?,
                fields,
                unique,
            }
        }
        ["INSERT", "IGNORE", "INTO", _, "", "RETURN", "NONE"] => match &tokens[4] {
            Token::Var(var) => Parsed::Insert {
                table: name(tokens.get(3))?,
                var: var.clone(),
            },
            _ => return not_subset(),
        },
        _ => return not_subset(),
    })
}

fn ok(result: Value) -> Value {
    json!({"status": "OK", "time": "10µs", "result": result})
}

fn err(message: String) -> Value {
    json!({"status": "ERR", "time": "10µs", "result": message})
}

/// Runs `text`'s statements in `session`; their results, or a parse error
/// (nothing run).
fn run(
    shared: &mut Shared,
    mut session: Session,
    text: &str,
    vars: &Map<String, Value>,
) -> Result<Vec<Value>, String> {
    let parsed: Vec<Parsed> = parse(text)?
        .iter()
        .map(|tokens| understand(tokens))
        .collect::<Result<_, _>>()?;
    Ok(parsed
        .into_iter()
        .map(|statement| execute(shared, &mut session, statement, vars).map_or_else(err, ok))
        .collect())
}

const DENIED: &str = "IAM error: Not enough permissions to perform this action";

fn may(session: &Session, ns: Option<&str>, db: Option<&str>) -> bool {
    match &session.level {
        None => false,
        Some(Level::Root) => true,
        Some(Level::Namespace(user_ns)) => ns == Some(user_ns.as_str()),
        Some(Level::Database(user_ns, user_db)) => {
            ns == Some(user_ns.as_str()) && db == Some(user_db.as_str())
        }
    }
}

fn selected(session: &Session) -> Result<(String, String), String> {
    let ns = session.ns.clone().ok_or("Specify a namespace to use")?;
    let db = session.db.clone().ok_or("Specify a database to use")?;
    Ok((ns, db))
}

/// The tables of the session's database, checking it exists.
fn tables<'a>(
    shared: &'a mut Shared,
    session: &Session,
) -> Result<&'a mut BTreeMap<String, Table>, String> {
    let (ns, db) = selected(session)?;
    if !may(session, Some(&ns), Some(&db)) {
        return Err(DENIED.into());
    }
    shared
        .namespaces
        .get_mut(&ns)
        .ok_or_else(|| format!("The namespace '{ns}' does not exist"))?
        .get_mut(&db)
        .ok_or_else(|| format!("The database '{db}' does not exist"))
}

fn execute(
    shared: &mut Shared,
    session: &mut Session,
    statement: Parsed,
    vars: &Map<String, Value>,
) -> Result<Value, String> {
    match statement {
        Parsed::InfoForDb => {
            let tables = tables(shared, session)?;
            let names: Map<String, Value> = tables
                .keys()
                .map(|name| {
                    (
                        name.clone(),
                        json!(format!("DEFINE TABLE {name} SCHEMALESS")),
                    )
                })
                .collect();
            Ok(json!({"tables": names}))
        }
        Parsed::UseNs(ns) => {
            session.ns = Some(ns);
            session.db = None;
            Ok(Value::Null)
        }
        Parsed::DefineNamespace(ns) => {
            if session.level != Some(Level::Root) {
                return Err(DENIED.into());
            }
            shared.namespaces.entry(ns).or_default();
            Ok(Value::Null)
        }
        Parsed::DefineDatabase(db) => {
            let ns = session.ns.clone().ok_or("Specify a namespace to use")?;
            if !may(session, Some(&ns), None) {
                return Err(DENIED.into());
            }
            shared
                .namespaces
                .get_mut(&ns)
                .ok_or_else(|| format!("The namespace '{ns}' does not exist"))?
                .entry(db)
                .or_default();
            Ok(Value::Null)
        }
        Parsed::DefineTable(table) => {
            tables(shared, session)?.entry(table).or_default();
            Ok(Value::Null)
        }
        Parsed::DefineIndex {
            name,
            table,
            fields,
            unique,
        } => {
            let table = tables(shared, session)?.entry(table).or_default();
            if !table.indexes.iter().any(|index| index.0 == name) {
                table.indexes.push((name, fields, unique));
            }
            Ok(Value::Null)
        }
        Parsed::Insert { table, var } => {
            let value = vars
                .get(&var)
                .cloned()
                .ok_or("Can not execute INSERT statement using value: NONE")?;
            let records = match value {
                Value::Array(items) => items,
                object @ Value::Object(_) => vec![object],
                other => {
                    return Err(format!(
                        "Can not execute INSERT statement using value: {other}"
                    ));
                }
            };
            let strict = shared.strict;
            let tables = tables(shared, session)?;
            if strict && !tables.contains_key(&table) {
                return Err(format!("The table '{table}' does not exist"));
            }
            let target = tables.entry(table.clone()).or_default();
            let mut stored = 0;
            for record in records {
                let key = match &record["id"] {
                    Value::String(key) => key.clone(),
                    Value::Number(number) => number.to_string(),
                    other => {
                        return Err(format!(
                            "Found {other} for the Record ID but this is not a valid id"
                        ));
                    }
                };
                // IGNORE: an existing record stays as it is.
                if target.records.contains_key(&key) {
                    continue;
                }
                for (path, kind) in &target.fields {
                    let found = path
                        .split('.')
                        .try_fold(&record, |value, part| value.get(part));
                    let fits = match (kind.as_str(), found) {
                        (_, None) => true,
                        ("number", Some(value)) => value.is_number(),
                        ("string", Some(value)) => value.is_string(),
                        ("bool", Some(value)) => value.is_boolean(),
                        ("object", Some(value)) => value.is_object(),
                        _ => true,
                    };
                    if !fits {
                        return Err(format!(
                            "Found {} for field `{path}`, with record `{table}:{key}`, but expected a {kind}",
                            found.map(Value::to_string).unwrap_or_default()
                        ));
                    }
                }
                for (name, fields, unique) in &target.indexes {
                    if !unique {
                        continue;
                    }
                    let values: Vec<&Value> = fields.iter().map(|field| &record[field]).collect();
                    let clash = target.records.iter().find(|(_, other)| {
                        fields
                            .iter()
                            .zip(&values)
                            .all(|(field, value)| &other[field] == *value)
                    });
                    if let Some((other, _)) = clash {
                        return Err(format!(
                            "Database index `{name}` already contains {}, with record `{table}:{other}`",
                            Value::Array(values.into_iter().cloned().collect())
                        ));
                    }
                }
                target.records.insert(key, record);
                stored += 1;
            }
            shared.inserted += stored;
            Ok(json!([]))
        }
    }
}
