//! `test`: runs the unit tests of connector files, with no Iggy server and
//! no backend. A file's tests are its `[[tests]]` tables and those of
//! `NAME.test.toml` beside it. Each test sends its `inputs` through the file's
//! decode, transforms and encode, as the runtime would, and compares what
//! comes out with its `outputs`, in order.
//!
//! ```toml
//! [[tests]]
//! name = "masks the email and keys by user"
//! [[tests.inputs]]
//! json = { uid = "u-7", email = "ann@example.com" }
//! headers = { tenant = "acme" }
//! [[tests.outputs]]
//! json_contains = { user_id = "u-7" }
//! fields = { email = "[REDACTED]@example.com" }
//! headers = { tenant = "acme" }
//! key = "u-7"
//! condition = 'assert!(!exists(.uid))'
//!
//! [[tests]]
//! name = "drops debug logs"
//! inputs = [{ json = { level = "debug" } }]
//! outputs = []
//! ```
//!
//! Output is one line per test, a diff per failure and a closing
//! `N passed, N failed` line; the exit code is 1 when a test fails and 2 when a
//! file or a test cannot be read.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::EXIT_CONFIG;
use crate::codec::Schema;
use crate::config::connector::{parse_connector_file, toml_to_json};
use crate::config::env::EnvVars;
use crate::config::is_connector_file;
use crate::config::{ConnectorConfig, KindConfig};
use crate::message::{HeaderValue, Headers, Payload, TopicRef};
use crate::transforms::{MessageMeta, Side, TransformChain, Verdict};

/// One test of a connector file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TestCase {
    pub name: String,
    /// Messages sent in, in order.
    pub inputs: Vec<Input>,
    /// What must come out, in order; empty: nothing may come out.
    pub outputs: Vec<Expected>,
}

/// A message a test sends in: to a source's transforms as the record the
/// source produced, or to a sink's as the bytes stored in the topic.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    /// The payload as a JSON value.
    pub json: Option<Value>,
    /// The payload as text (a sink: the stored bytes).
    pub text: Option<String>,
    #[serde(default)]
    pub headers: Map<String, Value>,
    /// `%key` before the transforms (sources).
    pub key: Option<String>,
    pub id: Option<u64>,
    pub partition: Option<u32>,
    /// Sinks: the message's offset.
    pub offset: Option<u64>,
    /// Microseconds since the epoch (the server's timestamp on a sink, the
    /// origin timestamp on a source).
    pub timestamp: Option<u64>,
}

/// Checks on one message that came out. Every check given must hold.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expected {
    /// The payload, read as JSON, equals this.
    pub json_equals: Option<Value>,
    /// The payload, read as JSON, has these fields with these values
    /// (objects compared by the keys given, recursively).
    pub json_contains: Option<Value>,
    /// The payload as text (JSON serialized) equals this.
    pub text_equals: Option<String>,
    /// The payload as text contains this.
    pub text_contains: Option<String>,
    /// Dotted paths (`user.name`, `tags.0`) and the values they must hold.
    pub fields: Option<Map<String, Value>>,
    /// Headers that must be there with these values (others may be).
    pub headers: Option<Map<String, Value>>,
    /// The key a source's transform set (`%key`).
    pub key: Option<String>,
    /// A VRL boolean program on the message (`.` and `%`), such as
    /// `assert_eq!(.n, 2)`: it must resolve to `true`.
    pub condition: Option<String>,
    /// Instead of a message, the input failed with an error containing this.
    pub error_contains: Option<String>,
}

/// What one input became.
#[derive(Debug)]
enum Produced {
    Message {
        payload: Payload,
        headers: Headers,
        key: Option<String>,
    },
    Failed(String),
    Dropped,
}

/// The runnable pipeline of one connector file.
struct Harness {
    side: Side,
    schema: Schema,
    topic: TopicRef,
    transforms: TransformChain,
}

pub fn test(paths: &[PathBuf]) -> ExitCode {
    let vars = EnvVars::from_process();
    let files = match connector_files(paths) {
        Ok(files) => files,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let (mut passed, mut failed) = (0, 0);
    for file in &files {
        match load(file, &vars) {
            Ok((harness, tests)) => {
                println!("\nrunning {} test(s) from {}", tests.len(), file.display());
                for test in &tests {
                    if run_one(&harness, test) {
                        passed += 1;
                    } else {
                        failed += 1;
                    }
                }
            }
            Err(message) => {
                // Config issues come formatted ("error: FILE: field ..."), as `validate` prints them.
                if message.starts_with("error") {
                    eprintln!("{message}");
                } else {
                    eprintln!("error: {message}");
                }
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }
    println!("\n{passed} passed, {failed} failed");
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// The connector files `paths` name, each once, in the order given: a file,
/// the connector file of a `NAME.test.toml`, or every connector file with
/// tests under a directory (as `rpk connect test ./dir/...` walks one), so a
/// shell glob over a file and its tests runs them once.
fn connector_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        let found = if path.is_dir() {
            let found = tested_files_under(path)?;
            if found.is_empty() {
                return Err(format!(
                    "{}: no connector file with tests in this directory",
                    path.display()
                ));
            }
            found
        } else {
            vec![connector_file_of(path)]
        };
        for file in found {
            if !files.contains(&file) {
                files.push(file);
            }
        }
    }
    Ok(files)
}

/// The connector files under `dir`, sorted, that have `[[tests]]` or a
/// `NAME.test.toml` beside them; a tests file without its connector file is
/// an error, since its tests would silently never run.
fn tested_files_under(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|error| format!("cannot read {}: {error}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    let mut files = Vec::new();
    for path in entries {
        let hidden = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_none_or(|name| name.starts_with('.'));
        if hidden {
            continue;
        }
        if path.is_dir() {
            files.extend(tested_files_under(&path)?);
        } else if is_connector_file(&path) {
            let text = std::fs::read_to_string(&path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))?;
            let inline = toml::from_str::<toml::Table>(&text)
                .map_err(|error| format!("{}: not valid TOML: {error}", path.display()))?
                .contains_key("tests");
            if inline || tests_file_of(&path).is_file() {
                files.push(path);
            }
        } else if path
            .to_str()
            .is_some_and(|name| name.ends_with(".test.toml"))
        {
            let file = connector_file_of(&path);
            if !file.is_file() {
                return Err(format!(
                    "{}: no connector file {} beside it",
                    path.display(),
                    file.display()
                ));
            }
        }
    }
    Ok(files)
}

/// The connector file's pipeline and its tests (in the file, then beside it).
fn load(file: &Path, vars: &EnvVars) -> Result<(Harness, Vec<TestCase>), String> {
    let text = std::fs::read_to_string(file)
        .map_err(|error| format!("cannot read {}: {error}", file.display()))?;
    let (config, _warnings) = parse_connector_file(file, &text, vars).map_err(|issues| {
        issues
            .0
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("\n")
    })?;
    let harness = Harness::new(&config)?;
    let mut tests = read_tests(file, &text)?;
    let beside = tests_file_of(file);
    if beside.exists() {
        let text = std::fs::read_to_string(&beside)
            .map_err(|error| format!("cannot read {}: {error}", beside.display()))?;
        tests.extend(read_tests(&beside, &text)?);
    }
    if tests.is_empty() {
        return Err(format!(
            "{}: no tests: add [[tests]] to it or to {}",
            file.display(),
            beside.display()
        ));
    }
    for test in &tests {
        check_test(test)
            .map_err(|message| format!("{}: test \"{}\": {message}", file.display(), test.name))?;
    }
    Ok((harness, tests))
}

/// `orders.test.toml` names `orders.toml`; any other path is the file itself.
fn connector_file_of(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or("");
    match name.strip_suffix(".test.toml") {
        Some(stem) => path.with_file_name(format!("{stem}.toml")),
        None => path.to_owned(),
    }
}

fn tests_file_of(connector_file: &Path) -> PathBuf {
    let stem = connector_file
        .file_stem()
        .and_then(|stem| stem.to_str())
        .unwrap_or("connector");
    connector_file.with_file_name(format!("{stem}.test.toml"))
}

fn read_tests(file: &Path, text: &str) -> Result<Vec<TestCase>, String> {
    let table: toml::Table = toml::from_str(text)
        .map_err(|error| format!("{}: not valid TOML: {error}", file.display()))?;
    let Some(tests) = table.get("tests") else {
        return Ok(Vec::new());
    };
    let json = toml_to_json(tests);
    serde_path_to_error::deserialize::<_, Vec<TestCase>>(&json).map_err(|error| {
        format!(
            "{}: field `tests{}`: {}",
            file.display(),
            path_suffix(&error.path().to_string()),
            error.inner()
        )
    })
}

/// serde's path (`[0].inputs[1].json`) as it follows `tests`.
fn path_suffix(path: &str) -> String {
    match path {
        "." => String::new(),
        path if path.starts_with('[') => path.to_owned(),
        path => format!(".{path}"),
    }
}

/// What can be refused before running: inputs with no or two payloads,
/// outputs with no check, conditions that do not compile.
fn check_test(test: &TestCase) -> Result<(), String> {
    if test.inputs.is_empty() {
        return Err("expected at least one input".into());
    }
    for (index, input) in test.inputs.iter().enumerate() {
        if input.json.is_some() == input.text.is_some() {
            return Err(format!(
                "inputs[{index}]: expected `json` or `text` (one of them)"
            ));
        }
    }
    for (index, expected) in test.outputs.iter().enumerate() {
        if expected.is_empty() {
            return Err(format!(
                "outputs[{index}]: expected at least one check (json_equals, json_contains, text_equals, text_contains, fields, headers, key, condition, error_contains)"
            ));
        }
        if let Some(condition) = &expected.condition {
            condition_chain(condition)
                .map_err(|message| format!("outputs[{index}].condition: {message}"))?;
        }
    }
    Ok(())
}

impl Expected {
    fn is_empty(&self) -> bool {
        self.json_equals.is_none()
            && self.json_contains.is_none()
            && self.text_equals.is_none()
            && self.text_contains.is_none()
            && self.fields.is_none()
            && self.headers.is_none()
            && self.key.is_none()
            && self.condition.is_none()
            && self.error_contains.is_none()
    }
}

/// A condition as a one-step chain: a `filter` keeps the messages it holds for.
fn condition_chain(condition: &str) -> Result<TransformChain, String> {
    TransformChain::build(&[(
        "condition".into(),
        serde_json::json!({"type": "filter", "condition": condition}),
    )])
    .map_err(|error| error.message)
}

impl Harness {
    fn new(config: &ConnectorConfig) -> Result<Self, String> {
        let origin = config.origin();
        let transforms = TransformChain::build(&config.transforms).map_err(|error| {
            format!(
                "{}: transforms.{}: {error}",
                origin.display(),
                error.transform
            )
        })?;
        let (side, schema, topic) = match &config.kind_config {
            KindConfig::Source { streams, .. } => {
                let stream = streams.first().ok_or("the file has no [[streams]] entry")?;
                let topic = TopicRef {
                    stream: stream.stream.clone(),
                    topic: stream.topic.clone(),
                };
                (Side::Source, stream.schema.clone(), topic)
            }
            KindConfig::Sink { streams, .. } => {
                let stream = streams.first().ok_or("the file has no [[streams]] entry")?;
                let topic = TopicRef {
                    stream: stream.stream.clone(),
                    topic: stream.topics.first().cloned().unwrap_or_default(),
                };
                (Side::Sink, stream.schema.clone(), topic)
            }
        };
        Ok(Self {
            side,
            schema,
            topic,
            transforms,
        })
    }

    /// One input through decode (sinks), the transforms and encode
    /// (sources), as the engine runs them.
    fn run(&self, input: &Input) -> Produced {
        let mut headers = input_headers(&input.headers);
        let payload = match self.side {
            Side::Source => Ok(match (&input.json, &input.text) {
                (Some(json), _) => Payload::Json(json.clone()),
                (None, text) => Payload::Text(text.clone().unwrap_or_default()),
            }),
            Side::Sink => {
                let stored = match (&input.json, &input.text) {
                    (Some(json), _) => Bytes::from(json.to_string()),
                    (None, text) => Bytes::from(text.clone().unwrap_or_default()),
                };
                self.schema
                    .decode(stored)
                    .map_err(|error| format!("decode: {error}"))
            }
        };
        let mut payload = match payload {
            Ok(payload) => payload,
            Err(error) => return Produced::Failed(error),
        };
        let mut meta = MessageMeta {
            side: self.side,
            topic: Some(&self.topic),
            partition: input.partition,
            id: input.id.map(u128::from),
            offset: input.offset,
            timestamp: input.timestamp.filter(|_| self.side == Side::Sink),
            origin_timestamp: input.timestamp,
            headers: &mut headers,
            key: input.key.clone(),
        };
        match self.transforms.apply_with(&mut payload, &mut meta) {
            Ok(Verdict::Keep) => {}
            Ok(Verdict::Drop) => return Produced::Dropped,
            Err(error) => return Produced::Failed(format!("transform: {error}")),
        }
        let key = meta.key.take();
        if self.side == Side::Source {
            // What the topic stores, read back as a sink of the same stream would.
            let stored = self
                .schema
                .encode(&payload)
                .map_err(|error| format!("encode: {error}"))
                .and_then(|bytes| {
                    self.schema
                        .decode(bytes)
                        .map_err(|error| format!("decode: {error}"))
                });
            payload = match stored {
                Ok(payload) => payload,
                Err(error) => return Produced::Failed(error),
            };
        }
        Produced::Message {
            payload,
            headers,
            key,
        }
    }
}

/// Runs one test and prints its line (and its failures); true when it passed.
fn run_one(harness: &Harness, test: &TestCase) -> bool {
    let produced: Vec<Produced> = test
        .inputs
        .iter()
        .map(|input| harness.run(input))
        .filter(|produced| !matches!(produced, Produced::Dropped))
        .collect();
    let mut failures = String::new();
    if produced.len() != test.outputs.len() {
        let _ = writeln!(
            failures,
            "expected {} output(s), got {}:",
            test.outputs.len(),
            produced.len()
        );
        for (index, produced) in produced.iter().enumerate() {
            let _ = writeln!(failures, "  output {index}: {}", describe(produced));
        }
    } else {
        for (index, (produced, expected)) in produced.iter().zip(&test.outputs).enumerate() {
            for failure in check(produced, expected) {
                let _ = writeln!(failures, "output {index}: {failure}");
            }
        }
    }
    if failures.is_empty() {
        println!("test {} ... ok", test.name);
        true
    } else {
        println!("test {} ... FAILED", test.name);
        println!("---- {} ----", test.name);
        print!("{failures}");
        false
    }
}

fn describe(produced: &Produced) -> String {
    match produced {
        Produced::Message { payload, .. } => format!("message {}", payload_text(payload)),
        Produced::Failed(error) => format!("error: {error}"),
        Produced::Dropped => "dropped".into(),
    }
}

/// Every check of `expected` that does not hold, described.
fn check(produced: &Produced, expected: &Expected) -> Vec<String> {
    let (payload, headers, key) = match (produced, &expected.error_contains) {
        (Produced::Failed(error), Some(wanted)) if error.contains(wanted.as_str()) => {
            return Vec::new();
        }
        (Produced::Failed(error), _) => return vec![format!("failed: {error}")],
        (_, Some(wanted)) => {
            return vec![format!(
                "expected an error containing {wanted:?}, got {}",
                describe(produced)
            )];
        }
        (
            Produced::Message {
                payload,
                headers,
                key,
            },
            None,
        ) => (payload, headers, key),
        (Produced::Dropped, None) => return vec!["dropped".into()],
    };
    let mut failures = Vec::new();
    let json = payload_json(payload);
    if let Some(wanted) = &expected.json_equals {
        match &json {
            Some(actual) if actual == wanted => {}
            Some(actual) => failures.push(format!("json_equals:\n{}", diff(wanted, actual))),
            None => failures.push(format!(
                "json_equals: the payload is not JSON: {}",
                payload_text(payload)
            )),
        }
    }
    if let Some(wanted) = &expected.json_contains {
        match &json {
            Some(actual) if contains(actual, wanted) => {}
            Some(actual) => failures.push(format!("json_contains:\n{}", diff(wanted, actual))),
            None => failures.push(format!(
                "json_contains: the payload is not JSON: {}",
                payload_text(payload)
            )),
        }
    }
    let text = payload_text(payload);
    if let Some(wanted) = &expected.text_equals
        && &text != wanted
    {
        failures.push(format!("text_equals:\n  - {wanted}\n  + {text}"));
    }
    if let Some(wanted) = &expected.text_contains
        && !text.contains(wanted.as_str())
    {
        failures.push(format!("text_contains: {wanted:?} not in {text:?}"));
    }
    for (path, wanted) in expected.fields.iter().flatten() {
        let actual = json.as_ref().and_then(|json| field(json, path));
        if actual != Some(wanted) {
            failures.push(format!(
                "fields.{path}: expected {wanted}, found {}",
                actual.map_or("nothing".to_owned(), Value::to_string)
            ));
        }
    }
    for (name, wanted) in expected.headers.iter().flatten() {
        let actual = headers
            .iter()
            .find(|(header, _)| header == name)
            .map(|(_, value)| header_json(value));
        if actual.as_ref() != Some(wanted) {
            failures.push(format!(
                "headers.{name}: expected {wanted}, found {}",
                actual.map_or("no such header".to_owned(), |value| value.to_string())
            ));
        }
    }
    if let Some(wanted) = &expected.key
        && key.as_ref() != Some(wanted)
    {
        failures.push(format!(
            "key: expected {wanted:?}, found {}",
            key.as_ref()
                .map_or_else(|| "no key".to_owned(), |key| format!("{key:?}"))
        ));
    }
    if let Some(condition) = &expected.condition
        && let Some(failure) = check_condition(condition, payload, headers, key)
    {
        failures.push(failure);
    }
    failures
}

fn check_condition(
    condition: &str,
    payload: &Payload,
    headers: &Headers,
    key: &Option<String>,
) -> Option<String> {
    let chain = match condition_chain(condition) {
        Ok(chain) => chain,
        Err(error) => return Some(format!("condition: {error}")),
    };
    let mut headers = headers.clone();
    let mut meta = MessageMeta::headers_only(Side::Sink, &mut headers);
    meta.key = key.clone();
    match chain.apply_with(&mut payload.clone(), &mut meta) {
        Ok(Verdict::Keep) => None,
        Ok(Verdict::Drop) => Some(format!("condition is false: {condition}")),
        Err(error) => Some(format!("condition: {}", error.message)),
    }
}

fn payload_json(payload: &Payload) -> Option<Value> {
    match payload {
        Payload::Json(value) => Some(value.clone()),
        Payload::JsonBytes(bytes) | Payload::Raw(bytes) => serde_json::from_slice(bytes).ok(),
        Payload::Text(text) => serde_json::from_str(text).ok(),
    }
}

fn payload_text(payload: &Payload) -> String {
    String::from_utf8_lossy(&payload.to_bytes()).into_owned()
}

/// `wanted`'s object keys are all in `actual` with values it contains;
/// anything else compares equal.
fn contains(actual: &Value, wanted: &Value) -> bool {
    match (actual, wanted) {
        (Value::Object(actual), Value::Object(wanted)) => wanted.iter().all(|(key, value)| {
            actual
                .get(key)
                .is_some_and(|present| contains(present, value))
        }),
        _ => actual == wanted,
    }
}

/// The value at a dotted path (`a.b`, `items.0.id`).
fn field<'a>(json: &'a Value, path: &str) -> Option<&'a Value> {
    path.split('.')
        .try_fold(json, |value, segment| match value {
            Value::Object(map) => map.get(segment),
            Value::Array(items) => segment
                .parse::<usize>()
                .ok()
                .and_then(|index| items.get(index)),
            _ => None,
        })
}

/// Expected (`-`) against actual (`+`), line by line, both pretty-printed
/// with their keys sorted (a remap's objects come out sorted; a test's keys
/// are in the order written).
fn diff(wanted: &Value, actual: &Value) -> String {
    let pretty = |value: &Value| serde_json::to_string_pretty(&sorted(value)).unwrap_or_default();
    let (wanted, actual) = (pretty(wanted), pretty(actual));
    let mut out = String::new();
    for change in similar::TextDiff::from_lines(&wanted, &actual).iter_all_changes() {
        let sign = match change.tag() {
            similar::ChangeTag::Delete => '-',
            similar::ChangeTag::Insert => '+',
            similar::ChangeTag::Equal => ' ',
        };
        let _ = write!(out, "  {sign} {change}");
        if change.missing_newline() {
            out.push('\n');
        }
    }
    out.truncate(out.trim_end().len());
    out
}

fn sorted(value: &Value) -> Value {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_by(|left, right| left.0.cmp(right.0));
            Value::Object(
                entries
                    .into_iter()
                    .map(|(key, value)| (key.clone(), sorted(value)))
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.iter().map(sorted).collect()),
        other => other.clone(),
    }
}

fn input_headers(headers: &Map<String, Value>) -> Headers {
    headers
        .iter()
        .map(|(name, value)| {
            let value = match value {
                Value::String(text) => HeaderValue::String(text.into()),
                Value::Bool(flag) => HeaderValue::Bool(*flag),
                Value::Number(number) => match (number.as_i64(), number.as_u64()) {
                    (Some(number), _) => HeaderValue::Int(number),
                    (None, Some(number)) => HeaderValue::UInt(number),
                    _ => HeaderValue::Float(number.as_f64().unwrap_or_default()),
                },
                other => HeaderValue::String(other.to_string().into()),
            };
            (name.into(), value)
        })
        .collect()
}

fn header_json(value: &HeaderValue) -> Value {
    match value {
        HeaderValue::String(text) => Value::from(text.as_str()),
        HeaderValue::Bool(flag) => Value::from(*flag),
        HeaderValue::Int(number) => Value::from(*number),
        HeaderValue::UInt(number) => Value::from(*number),
        HeaderValue::Float(number) => Value::from(*number),
        HeaderValue::Raw(_) => Value::from(value.to_string()),
    }
}
