//! `remap` and `filter` (feature `vrl`) as users run them: the runtime over
//! the in-memory bus, `pipe`, `validate` and `iggy-connect test` through the
//! real binary.

#![cfg(all(feature = "vrl", feature = "random-source", feature = "stdout-sink"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use iggy_connect::config::env::EnvVars;
use iggy_connect::config::{ConnectorConfig, parse_connector_file};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::HeaderValue;
use iggy_connect::state::MemoryStateStore;
use serde_json::Value;

use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(30);

const EXAMPLE: &str = "examples/remap/users.toml";

fn iggy_connect(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

/// The binary's stdout, once it exited 0 (else the test fails with both
/// streams).
fn succeeded(args: &[&str]) -> String {
    let output = iggy_connect(args);
    let stdout = text(&output.stdout);
    assert_eq!(
        output.status.code(),
        Some(0),
        "{args:?}: {stdout}{}",
        text(&output.stderr)
    );
    stdout
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The example file with `from` replaced by `to`, in a temp dir.
fn edited_example(dir: &Path, from: &str, to: &str) -> PathBuf {
    let example =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(EXAMPLE)).unwrap();
    assert!(example.contains(from), "{from}");
    let path = dir.join("users.toml");
    std::fs::write(&path, example.replace(from, to)).unwrap();
    path
}

/// A runtime config in `dir` whose connector directory is `connectors`.
fn runtime_config(dir: &Path, connectors: &Path) -> PathBuf {
    let config = dir.join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[iggy]\naddress = \"localhost:8090\"\n[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
            connectors.display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn test_command_passes_the_example_files_tests_from_the_file_and_beside_it() {
    let stdout = succeeded(&["test", EXAMPLE]);
    for name in [
        "renames, masks, parses the time and keys by user",
        "drops debug events",
        "a time that does not parse fails the message",
        // From users.test.toml.
        "a random record keeps its fields and gets a user key",
    ] {
        assert!(stdout.contains(&format!("test {name} ... ok")), "{stdout}");
    }
    assert_eq!(
        stdout.lines().last(),
        Some("4 passed, 0 failed"),
        "{stdout}"
    );
}

#[test]
fn test_command_fails_a_wrong_expectation_with_a_diff_and_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let file = edited_example(
        dir.path(),
        r#"json_equals = { user = "ann""#,
        r#"json_equals = { user = "anne""#,
    );
    let output = iggy_connect(&["test", file.to_str().unwrap()]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("test renames, masks, parses the time and keys by user ... FAILED"),
        "{stdout}"
    );
    assert!(
        stdout.contains("test drops debug events ... ok"),
        "{stdout}"
    );
    assert!(stdout.contains("  -   \"user\": \"anne\""), "{stdout}");
    assert!(stdout.contains("  +   \"user\": \"ann\""), "{stdout}");
    assert_eq!(
        stdout.lines().last(),
        Some("2 passed, 1 failed"),
        "{stdout}"
    );
}

#[test]
fn test_command_fails_when_something_comes_out_that_the_test_says_must_not() {
    let dir = tempfile::tempdir().unwrap();
    let file = edited_example(
        dir.path(),
        r#"outputs = [{ fields = { user = "eve" } }]"#,
        "outputs = []",
    );
    let output = iggy_connect(&["test", file.to_str().unwrap()]);
    let stdout = text(&output.stdout);
    assert_eq!(output.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("expected 0 output(s), got 1"), "{stdout}");
}

#[test]
fn a_program_that_does_not_compile_is_a_config_error_with_vrls_diagnostic_in_test_and_validate() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    let file = edited_example(&connectors, "parse_timestamp!(", "parse_timestamp(");
    let output = iggy_connect(&["test", file.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let config = runtime_config(dir.path(), &connectors);
    let validated = iggy_connect(&["validate", "--config", config.to_str().unwrap()]);
    assert_eq!(validated.status.code(), Some(2));
    for report in [text(&output.stderr), text(&validated.stderr)] {
        assert!(
            report.contains("users.toml: field `transforms.remap.source`"),
            "{report}"
        );
        assert!(report.contains("error[E103]"), "{report}");
        assert!(report.contains("┌─ source:6:9"), "{report}");
        assert!(
            report.contains("adding a `!`: `parse_timestamp!(.at"),
            "{report}"
        );
        assert!(report.contains("^^^^^^^^^^"), "{report}");
    }
}

#[test]
fn test_command_runs_a_files_tests_once_however_often_a_glob_or_a_directory_names_it() {
    let stdout = succeeded(&[
        "test",
        EXAMPLE,
        "examples/remap/users.test.toml",
        "examples",
    ]);
    assert_eq!(
        stdout.matches("running 4 test(s) from").count(),
        1,
        "{stdout}"
    );
    assert_eq!(
        stdout.lines().last(),
        Some("4 passed, 0 failed"),
        "{stdout}"
    );

    // A directory without tests, or tests without their connector file, is
    // an error, not a pass that ran nothing.
    let empty = iggy_connect(&["test", "examples/connectors"]);
    assert_eq!(empty.status.code(), Some(2));
    assert!(
        text(&empty.stderr).contains("examples/connectors: no connector file with tests"),
        "{}",
        text(&empty.stderr)
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("orphan.test.toml"), "[[tests]]\n").unwrap();
    let orphan = iggy_connect(&["test", dir.path().to_str().unwrap()]);
    assert_eq!(orphan.status.code(), Some(2));
    assert!(
        text(&orphan.stderr).contains("orphan.test.toml: no connector file"),
        "{}",
        text(&orphan.stderr)
    );
}

#[test]
fn validate_leaves_out_a_files_tests_beside_it_in_the_connectors_directory() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for name in ["users.toml", "users.test.toml"] {
        std::fs::copy(
            root.join("examples/remap").join(name),
            connectors.join(name),
        )
        .unwrap();
    }
    let config = runtime_config(dir.path(), &connectors);
    let stdout = succeeded(&["validate", "--config", config.to_str().unwrap()]);
    assert!(stdout.contains("config OK: 1 connector(s)"), "{stdout}");
}

#[test]
fn pipe_runs_the_example_file_through_its_filter_and_remap() {
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        EXAMPLE,
        "--sink",
        "stdout",
        "--set",
        "source.max_count=50",
        "--set",
        "source.interval=0ms",
        "--set",
        "sink.print_payload=true",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let records: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(records.len(), 50);
    for record in records {
        assert_eq!(record["user"], "World", "{record}");
        assert!(record.get("name").is_none(), "{record}");
    }
}

#[tokio::test]
async fn a_source_with_a_remap_stores_the_changed_payload_headers_and_key_and_dead_letters_runtime_errors()
 {
    let config = parse(
        r#"
type = "source"
key = "remapping"
path = "random"
[[streams]]
stream = "remap_src"
topic = "records"
schema = "json"
[dead_letter]
stream = "remap_src"
topic = "dead"
[plugin_config]
interval = "0ms"
max_count = 200
[transforms.remap]
source = '''
.user = del(.name)
%key = to_string(to_int!(.seq))
%headers.pipeline = "remap"
if mod(to_int!(.seq), 10) == 3 { .n = to_int!("not a number") }
'''
"#,
    );
    let bus = MemoryBus::new();
    let runtime = runtime(&bus);
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "remapping")
        .await
        .unwrap();

    let view = runtime.view(ConnectorKind::Source, "remapping").unwrap();
    let stored = bus.messages("remap_src", "records");
    let dead = bus.messages("remap_src", "dead");
    assert_eq!(stored.len(), 180);
    assert_eq!(dead.len(), 20);
    assert_eq!(view.metrics.errors.get(), 20);
    for message in &stored {
        let record: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(record["user"], "World");
        assert!(record.get("name").is_none());
        assert!(
            message
                .headers
                .contains(&("pipeline".into(), HeaderValue::from("remap"))),
            "{:?}",
            message.headers
        );
    }
    for message in &dead {
        let record: Value = serde_json::from_slice(&message.payload).unwrap();
        assert_eq!(record["seq"].as_u64().unwrap() % 10, 3, "{record}");
        let reason = message
            .headers
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect::<Vec<_>>()
            .join("\n");
        assert!(reason.contains("to_int"), "{reason}");
    }
    runtime.shutdown().await;
}

fn parse(text: &str) -> ConnectorConfig {
    match parse_connector_file(Path::new("remap.toml"), text, &EnvVars::default()) {
        Ok((config, warnings)) => {
            assert!(warnings.is_empty(), "{warnings:?}");
            config
        }
        Err(issues) => panic!("{issues}"),
    }
}

fn runtime(bus: &MemoryBus) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    )
}

#[test]
fn describe_shows_the_format_of_a_files_tests_in_its_json_schema() {
    let output = iggy_connect(&["describe", "source", "random", "--format", "json-schema"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let schema: Value = serde_json::from_slice(&output.stdout).unwrap();
    let tests = &schema["properties"]["tests"]["items"]["properties"];
    assert!(
        tests["inputs"]["items"]["properties"]["json"].is_object(),
        "{schema}"
    );
    for check in [
        "json_equals",
        "fields",
        "headers",
        "condition",
        "error_contains",
    ] {
        assert!(
            tests["outputs"]["items"]["properties"][check].is_object(),
            "{check}: {schema}"
        );
    }
}

#[test]
fn run_moves_records_through_a_remap_on_the_source_and_a_filter_and_remap_on_the_sink_through_iggy()
{
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "users.toml",
        r#"
type = "source"
key = "users"
path = "random"
[[streams]]
stream = "vrl_stream"
topic = "users"
schema = "json"
[plugin_config]
interval = "5ms"
max_count = 100
[transforms.remap]
source = '''
.user = del(.name)
%key = .user
%headers.pipeline = "users"
'''
"#,
    );
    workspace.add_connector(
        "print.toml",
        r#"
type = "sink"
key = "print"
path = "stdout"
[[streams]]
stream = "vrl_stream"
topics = ["users"]
schema = "json"
consumer_group = "print"
[plugin_config]
print_payload = true
[transforms.from_users]
type = "filter"
condition = '%headers.pipeline == "users" && mod(to_int!(.seq), 2) == 0'
[transforms.stamp]
type = "remap"
source = '.offset = %offset; .topic = %stream + "/" + %topic'
"#,
    );
    let running = workspace.run();
    wait_until("100 records in the topic", LONG, || {
        server.message_count("vrl_stream", "users") == 100
    });
    wait_until("50 lines on stdout", LONG, || {
        workspace.stdout().matches('\n').count() == 50
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let mut offsets = Vec::new();
    for line in workspace.stdout().lines() {
        let record: Value = serde_json::from_str(line).unwrap();
        assert_eq!(record["user"], "World", "{record}");
        assert!(record.get("name").is_none(), "{record}");
        assert_eq!(record["seq"].as_u64().unwrap() % 2, 0, "{record}");
        assert_eq!(record["topic"], "vrl_stream/users", "{record}");
        offsets.push(record["offset"].as_u64().unwrap());
    }
    offsets.sort_unstable();
    offsets.dedup();
    assert_eq!(offsets.len(), 50);
}
