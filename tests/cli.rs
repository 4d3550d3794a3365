//! The binary as a user runs it.

use std::path::Path;
use std::process::{Command, Output};

fn iggy_connect(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the binary runs")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn pipe_with_max_count_prints_exactly_that_many_messages_and_exits_zero() {
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "random",
        "--sink",
        "stdout",
        "--set",
        "source.max_count=1000",
        "--set",
        "sink.print_payload=true",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1000);
    let mut ids = std::collections::HashSet::new();
    for line in lines {
        let record: serde_json::Value =
            serde_json::from_str(line).expect("each line is a JSON record");
        assert!(
            ids.insert(record["id"].as_str().unwrap().to_owned()),
            "duplicate record {line}"
        );
    }
    assert!(stderr(&output).contains("NOTHING IS DURABLE"));
}

#[test]
fn pipe_names_the_bad_setting_and_exits_non_zero() {
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "random",
        "--sink",
        "stdout",
        "--set",
        "source.max_cont=5",
    ]);
    assert!(!output.status.success());
    let message = stderr(&output);
    assert!(message.contains("max_cont"), "{message}");
}

#[test]
fn pipe_with_a_connector_not_compiled_in_names_the_feature() {
    let output = iggy_connect(&["pipe", "--source", "random", "--sink", "nosuch"]);
    assert!(!output.status.success());
    assert!(
        stderr(&output).contains("unknown sink connector \"nosuch\""),
        "{}",
        stderr(&output)
    );
}

#[test]
fn list_shows_the_compiled_in_connectors_with_their_features() {
    let output = iggy_connect(&["list"]);
    assert!(output.status.success());
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert_eq!(
        stdout.contains("random-source"),
        cfg!(feature = "random-source"),
        "{stdout}"
    );
    assert_eq!(
        stdout.contains("stdout-sink"),
        cfg!(feature = "stdout-sink"),
        "{stdout}"
    );
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).unwrap();
}

#[test]
fn validate_reports_every_problem_with_file_and_field_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    write(
        dir.path(),
        "config.toml",
        &format!(
            "[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
            connectors.display()
        ),
    );
    write(
        &connectors,
        "unknown.toml",
        "type = \"sink\"\nkey = \"a\"\nenabled = true\nversion = 0\nname = \"a\"\npath = \"libiggy_connector_nosuch_sink\"\n\
         [[streams]]\nstream = \"s\"\ntopics = [\"t\"]\nschema = \"json\"\n",
    );
    write(
        &connectors,
        "missing.toml",
        "type = \"source\"\nkey = \"b\"\nenabled = true\nversion = 0\nname = \"b\"\npath = \"random\"\n\
         [[streams]]\nstream = \"s\"\nschema = \"json\"\n",
    );
    write(
        &connectors,
        "duration.toml",
        "type = \"source\"\nkey = \"c\"\nenabled = true\nversion = 0\nname = \"c\"\npath = \"random\"\n\
         [[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\nlinger_time = \"soon\"\n",
    );
    let config = dir.path().join("config.toml");
    let output = iggy_connect(&["validate", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let report = stderr(&output);
    let line = |file: &str, field: &str| {
        report
            .lines()
            .any(|line| line.contains(file) && line.contains(&format!("field `{field}`")))
    };
    assert!(line("unknown.toml", "path"), "{report}");
    assert!(
        report.contains("unknown sink connector \"nosuch\""),
        "{report}"
    );
    assert!(line("missing.toml", "streams[0].topic"), "{report}");
    assert!(line("duration.toml", "streams[0].linger_time"), "{report}");
    assert!(report.contains("expected a duration"), "{report}");
    assert!(report.contains("3 error(s)"), "{report}");
}

#[test]
fn validate_accepts_a_good_config_and_lists_its_connectors() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    write(
        dir.path(),
        "config.toml",
        &format!(
            "[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
            connectors.display()
        ),
    );
    write(
        &connectors,
        "random.toml",
        "type = \"source\"\nkey = \"rnd\"\nenabled = true\nversion = 1\nname = \"r\"\npath = \"random\"\n\
         [[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\n[plugin_config]\nmax_count = 5\n",
    );
    let config = dir.path().join("config.toml");
    let output = iggy_connect(&["validate", "--config", config.to_str().unwrap()]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("source rnd (random, version 1, enabled)")
    );
}

#[test]
fn the_example_runtime_config_validates() {
    let root = env!("CARGO_MANIFEST_DIR");
    let output = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["validate", "--config", "examples/config.toml"])
        .current_dir(root)
        .output()
        .expect("the binary runs");
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("config OK: 2 connector(s)"), "{stdout}");
}

#[test]
fn validate_reports_iggy_connection_settings_that_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    write(
        dir.path(),
        "config.toml",
        &format!(
            "[iggy]\naddress = \"localhost:8090\"\ntoken = \"file:{}/missing-token\"\n[iggy.tls]\nenabled = true\n\
             [connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
            dir.path().display(),
            connectors.display()
        ),
    );
    let config = dir.path().join("config.toml");
    let output = iggy_connect(&["validate", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let report = stderr(&output);
    assert!(
        report.contains("iggy.token") && report.contains("missing-token"),
        "{report}"
    );
}
