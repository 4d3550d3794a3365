//! The binary as a user runs it.
// The tests here run the random source and the stdout sink (the default
// features): a build without them leaves them out rather than failing them.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

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
fn pipe_into_stdout_prints_the_payloads_unless_told_not_to() {
    let pipe = |extra: &[&str]| {
        let mut args = vec!["pipe", "--source", "random", "--sink", "stdout"];
        args.extend(["--set", "source.max_count=5"]);
        args.extend(extra);
        let output = iggy_connect(&args);
        assert!(output.status.success(), "{}", stderr(&output));
        String::from_utf8_lossy(&output.stdout).lines().count()
    };
    assert_eq!(pipe(&[]), 5);
    assert_eq!(pipe(&["--set", "sink.print_payload=false"]), 0);
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
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
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

/// A typo in a connector file is an error, not a warning: `enabeld = false`
/// once passed `validate` and ran the connector. `nan` for an integer once
/// read as unset (a random source without limit). Every bad field of
/// `plugin_config` is reported, not only the first. A size that is none.
#[test]
fn validate_refuses_unknown_connector_keys_with_a_hint_and_non_finite_integers() {
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
        "typos.toml",
        "type = \"source\"\nkey = \"a\"\nenabeld = false\nversion = 0\nname = \"a\"\npath = \"random\"\n\
         max_in_flight_bytes = \"lots\"\n\
         [[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\nbatch_lenght = 10\n\
         [plugin_config]\nmax_count = nan\npayload_size = \"big\"\nmessage_range = [1, 2]\n",
    );
    let config = dir.path().join("config.toml");
    let output = iggy_connect(&["validate", "--config", config.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let report = stderr(&output);
    let line = |field: &str, says: &str| {
        report.lines().any(|line| {
            line.contains("typos.toml")
                && line.contains(&format!("field `{field}`"))
                && line.contains(says)
        })
    };
    assert!(line("enabeld", "did you mean `enabled`?"), "{report}");
    assert!(
        line("streams[0].batch_lenght", "did you mean `batch_length`?"),
        "{report}"
    );
    assert!(
        line("max_in_flight_bytes", "expected a size such as \"16MiB\""),
        "{report}"
    );
    assert!(line("plugin_config.max_count", "nan"), "{report}");
    // Every field of plugin_config that does not fit, in one pass.
    assert!(line("plugin_config.payload_size", "big"), "{report}");
    assert!(
        line("plugin_config.message_range", "unknown field"),
        "{report}"
    );
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
         max_in_flight_bytes = \"8MiB\"\n[[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\n[plugin_config]\nmax_count = 5\n",
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

#[cfg(feature = "file-source")]
#[test]
fn pipe_takes_one_value_for_a_list_field_as_a_list_of_one() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    std::fs::write(&log, "first\nsecond\n").unwrap();
    let include = format!("source.include={}", log.display());
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "file",
        "--sink",
        "stdout",
        "--schema",
        "text",
        "--max-messages",
        "2",
        "--set",
        &include,
    ]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "first\nsecond\n");
}

#[test]
fn pipe_configuration_errors_exit_2() {
    for args in [
        &["--set", "source.bogus=1"][..],
        &["--set", "nowhere.field=1"],
        &["--set", "no-equals-sign"],
        &["--schema", "nosuch"],
    ] {
        let mut all = vec!["pipe", "--source", "random", "--sink", "stdout"];
        all.extend_from_slice(args);
        let output = iggy_connect(&all);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
    }
    let output = iggy_connect(&["pipe", "--source", "random", "--sink", "nosuch"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

/// Lines of a child's stream, read on a thread.
fn lines_of(stream: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        BufReader::new(stream)
            .lines()
            .map_while(Result::ok)
            .collect()
    })
}

/// `pipe --source random --sink stdout` as fast as it goes, with progress
/// lines every 100 ms; nothing reads its stdout until [`finish`](Self::finish),
/// so the sink blocks on the full pipe while the source reads on.
struct BlockedPipe {
    child: std::process::Child,
    stderr: std::sync::mpsc::Receiver<String>,
    reader: std::thread::JoinHandle<()>,
    report: Vec<String>,
}

impl BlockedPipe {
    fn start() -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
            .args(["pipe", "--source", "random", "--sink", "stdout"])
            .args([
                "--set",
                "source.interval=0ms",
                "--progress-interval",
                "100ms",
            ])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (lines, stderr) = std::sync::mpsc::channel();
        let stream = child.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stream).lines().map_while(Result::ok) {
                let _ = lines.send(line);
            }
        });
        Self {
            child,
            stderr,
            reader,
            report: Vec::new(),
        }
    }

    /// Reads stderr up to the first line `wanted` accepts.
    fn wait_for(&mut self, wanted: impl Fn(&str) -> bool) {
        loop {
            let line = self
                .stderr
                .recv_timeout(Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("no such line: {:?}", self.report));
            let found = wanted(&line);
            self.report.push(line);
            if found {
                return;
            }
        }
    }

    fn interrupt(&self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
    }

    /// Reads stdout to its end and waits for the exit: the exit code, the
    /// lines printed and stderr.
    fn finish(mut self) -> (Option<i32>, usize, String) {
        let printed = lines_of(self.child.stdout.take().unwrap());
        let status = self.child.wait().unwrap();
        let printed = printed.join().unwrap().len();
        self.reader.join().unwrap();
        self.report.extend(self.stderr.try_iter());
        (status.code(), printed, self.report.join("\n"))
    }
}

/// The count of a `pipe` report's "N records read from the source were not
/// delivered to the sink".
fn undelivered(report: &str) -> u64 {
    report
        .lines()
        .find_map(|line| {
            line.strip_suffix(" records read from the source were not delivered to the sink")
        })
        .and_then(|line| line.strip_prefix("pipe: "))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no count of undelivered records in {report}"))
}

#[test]
fn an_interrupted_pipe_with_records_in_flight_exits_130_and_counts_them() {
    let mut pipe = BlockedPipe::start();
    pipe.wait_for(|line| {
        progress_counts(line).is_some_and(|(read, delivered)| read > delivered + 5000)
    });
    pipe.interrupt();
    let (code, printed, report) = pipe.finish();
    assert_eq!(code, Some(130), "{report}");
    assert!(undelivered(&report) > 0, "{report}");
    let summary = summary_records(&report);
    assert!(
        printed as u64 >= summary,
        "{printed} printed, summary says {summary}: {report}"
    );
}

#[test]
fn a_second_interrupt_stops_a_pipe_at_once_instead_of_waiting_for_its_sink() {
    let mut pipe = BlockedPipe::start();
    pipe.wait_for(|line| progress_counts(line).is_some_and(|(read, delivered)| read > delivered));
    // The blocked sink holds the graceful stop the first SIGINT starts.
    pipe.interrupt();
    pipe.wait_for(|line| line.starts_with("pipe: interrupted, stopping"));
    pipe.interrupt();
    pipe.wait_for(|line| line == "pipe: interrupted again, stopping at once");
    let (code, _, report) = pipe.finish();
    assert_eq!(code, Some(130), "{report}");
    assert!(undelivered(&report) > 0, "{report}");
}

/// The records read and delivered of a `pipe` progress line.
fn progress_counts(line: &str) -> Option<(u64, u64)> {
    let (read, rest) = line.strip_prefix("pipe: ")?.split_once(" records read, ")?;
    let (delivered, _) = rest.split_once(" delivered, ")?;
    Some((read.parse().ok()?, delivered.parse().ok()?))
}

/// The record count of `pipe`'s summary line.
fn summary_records(report: &str) -> u64 {
    report
        .lines()
        .find_map(|line| {
            line.strip_prefix("pipe: ")?
                .split_once(" records in ")
                .map(|(n, _)| n.to_owned())
        })
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no summary line in {report}"))
}

#[test]
fn pipe_with_a_duration_stops_delivers_everything_and_reports_progress_and_a_summary() {
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "random",
        "--sink",
        "stdout",
        "--set",
        "source.interval=20ms",
        "--set",
        "sink.print_payload=true",
        "--duration",
        "1500ms",
        "--progress-interval",
        "200ms",
    ]);
    let report = stderr(&output);
    assert!(output.status.success(), "{report}");
    let printed = String::from_utf8_lossy(&output.stdout).lines().count() as u64;
    assert!(printed > 0, "{report}");
    assert_eq!(summary_records(&report), printed, "{report}");
    assert!(
        report.contains(" records in ") && report.contains(" 0 errors, 0 dropped"),
        "{report}"
    );
    assert!(
        report
            .lines()
            .any(|line| progress_counts(line).is_some() && line.ends_with(" records/s")),
        "no progress line: {report}"
    );
}

#[test]
fn pipe_with_max_messages_stops_the_source_at_the_batch_that_reaches_it() {
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "random",
        "--sink",
        "stdout",
        "--set",
        "source.interval=0ms",
        "--set",
        "source.messages_range=[10, 10]",
        "--set",
        "sink.print_payload=true",
        "--max-messages",
        "495",
    ]);
    let report = stderr(&output);
    assert!(output.status.success(), "{report}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout).lines().count(),
        500,
        "{report}"
    );
    assert_eq!(summary_records(&report), 500, "{report}");
}

#[test]
fn pipe_runs_connector_files_with_their_streams_and_transforms() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "source.toml",
        "type = \"source\"\nkey = \"rnd\"\nenabled = false\nversion = 0\nname = \"r\"\npath = \"random\"\n\
         [[streams]]\nstream = \"orders\"\ntopic = \"created\"\nschema = \"json\"\n\
         [plugin_config]\nmax_count = 40\ninterval = \"0ms\"\n\
         [transforms.add_fields]\nenabled = true\n[[transforms.add_fields.fields]]\nkey = \"origin\"\nvalue.static = \"file\"\n",
    );
    write(
        dir.path(),
        "sink.toml",
        "type = \"sink\"\nkey = \"out\"\nenabled = true\nversion = 0\nname = \"o\"\npath = \"stdout\"\n\
         [[streams]]\nstream = \"orders\"\ntopics = [\"created\"]\nschema = \"json\"\n\
         [plugin_config]\nprint_payload = true\n",
    );
    let file = |name: &str| dir.path().join(name).to_str().unwrap().to_owned();
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        &file("source.toml"),
        "--sink-file",
        &file("sink.toml"),
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(stdout.lines().count(), 40, "{}", stderr(&output));
    for line in stdout.lines() {
        let record: serde_json::Value = serde_json::from_str(line).unwrap();
        assert_eq!(record["origin"], "file", "{line}");
    }
    // A `--set` lays over the file; a sink reading a topic the source does not
    // write is a configuration error.
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        &file("source.toml"),
        "--sink",
        "stdout",
        "--set",
        "source.max_count=7",
        "--set",
        "sink.print_payload=true",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert_eq!(String::from_utf8_lossy(&output.stdout).lines().count(), 7);
    let other = std::fs::read_to_string(dir.path().join("sink.toml"))
        .unwrap()
        .replace("created", "cancelled");
    write(dir.path(), "other.toml", &other);
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        &file("source.toml"),
        "--sink-file",
        &file("other.toml"),
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("topic \"cancelled\", which the source does not write"),
        "{}",
        stderr(&output)
    );
}

/// A JSON object whose keys are all different (serde_json keeps the last of
/// repeated keys silently, so this checks them itself).
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<UniqueKeys, A::Error> {
                let mut seen = std::collections::HashSet::new();
                while let Some((key, _)) = map.next_entry::<String, serde::de::IgnoredAny>()? {
                    if !seen.insert(key.clone()) {
                        return Err(serde::de::Error::custom(format!("key `{key}` repeats")));
                    }
                }
                Ok(UniqueKeys)
            }
        }
        deserializer.deserialize_map(Visitor)
    }
}

fn assert_json_lines(report: &str) {
    assert!(!report.trim().is_empty());
    for line in report.lines() {
        if let Err(error) = serde_json::from_str::<UniqueKeys>(line) {
            panic!("{error}: {line}");
        }
    }
}

#[test]
fn pipe_honours_the_log_format_and_every_json_line_is_an_object_with_unique_keys() {
    let output = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args([
            "pipe",
            "--source",
            "random",
            "--sink",
            "stdout",
            "--set",
            "source.max_count=20",
        ])
        .env("RUST_LOG", "debug")
        .env("IGGY_CONNECTORS_LOGGING_FORMAT", "json")
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    assert_json_lines(&stderr(&output));
    // The connector span's fields are in the lines logged inside it.
    assert!(
        stderr(&output)
            .lines()
            .any(|line| line.contains("stdout sink received a batch")
                && line.contains("\"connector_type\":\"sink\"")),
        "{}",
        stderr(&output)
    );
    assert!(
        stderr(&output).contains("\"records\":20"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn completions_read_partly_end_without_a_panic() {
    // `iggy-connect completions bash | head -1`: the reader closes the pipe early.
    let mut child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["completions", "bash"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{stderr}");
}

#[test]
fn completions_man_page_and_version_with_features() {
    for (shell, marker) in [
        ("bash", "-o default iggy-connect"),
        ("zsh", "#compdef iggy-connect"),
        ("fish", "complete -c iggy-connect"),
    ] {
        let output = iggy_connect(&["completions", shell]);
        assert!(output.status.success(), "{shell}: {}", stderr(&output));
        let script = String::from_utf8_lossy(&output.stdout);
        assert!(
            script.contains(marker) && script.contains("pipe"),
            "{shell}: {script}"
        );
    }
    let output = iggy_connect(&["man"]);
    assert!(output.status.success());
    let page = String::from_utf8_lossy(&output.stdout);
    assert!(
        page.contains(".TH iggy-connect") && page.contains("pipe"),
        "{page}"
    );
    let output = iggy_connect(&["--version"]);
    let version = String::from_utf8_lossy(&output.stdout);
    assert!(
        version.starts_with(&format!("iggy-connect {}", env!("CARGO_PKG_VERSION"))),
        "{version}"
    );
    // A table, not a `match`: with most features off, clippy reads the match
    // as `matches!` and fails the feature-limited lint.
    for (feature, enabled) in [
        ("random-source", cfg!(feature = "random-source")),
        ("stdout-sink", cfg!(feature = "stdout-sink")),
        ("postgres-source", cfg!(feature = "postgres-source")),
        ("postgres-sink", cfg!(feature = "postgres-sink")),
        ("http-source", cfg!(feature = "http-source")),
        ("http-sink", cfg!(feature = "http-sink")),
    ] {
        assert_eq!(version.contains(feature), enabled, "{feature}: {version}");
    }
}

#[test]
fn run_logs_a_startup_line_and_json_lines_with_unique_keys_without_the_iggy_clients_info_lines() {
    let dir = tempfile::tempdir().unwrap();
    let connectors = dir.path().join("connectors");
    std::fs::create_dir(&connectors).unwrap();
    write(
        dir.path(),
        "config.toml",
        &format!(
            "[iggy]\naddress = \"127.0.0.1:1\"\n[http]\nenabled = false\n[logging]\nformat = \"json\"\n\
             [state]\npath = \"{}\"\n[connectors]\nconfig_type = \"local\"\nconfig_dir = \"{}\"\n",
            dir.path().join("state").display(),
            connectors.display()
        ),
    );
    write(
        &connectors,
        "random.toml",
        "type = \"source\"\nkey = \"rnd\"\nenabled = true\nversion = 0\nname = \"r\"\npath = \"random\"\n\
         [[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\n",
    );
    let config = dir.path().join("config.toml");
    let mut child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["run", "--config", config.to_str().unwrap()])
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut lines = Vec::new();
    // Until the engine has retried the unreachable broker twice.
    while lines
        .iter()
        .filter(|line: &&String| line.contains("bus unreachable"))
        .count()
        < 2
    {
        let mut line = String::new();
        if stderr.read_line(&mut line).unwrap() == 0 {
            break;
        }
        lines.push(line);
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let rest = lines_of(stderr);
    child.wait().unwrap();
    lines.extend(rest.join().unwrap());
    let report = lines.concat();
    assert_json_lines(&report);
    let retry = lines
        .iter()
        .find(|line| line.contains("bus unreachable"))
        .expect("a retry line");
    assert!(
        retry.contains("\"attempt\":1") && retry.contains("\"error\":"),
        "{retry}"
    );
    assert!(
        !lines.iter().any(|line| line.contains("\"target\":\"iggy::") && line.contains("\"level\":\"INFO\"")),
        "{report}"
    );
    let startup = lines
        .iter()
        .find(|line| line.contains("iggy-connect starting"))
        .expect("a startup line");
    assert!(
        startup.contains(config.to_str().unwrap())
            && startup.contains("127.0.0.1:1")
            && startup.contains("source rnd (random)"),
        "{startup}"
    );
}

#[cfg(feature = "postgres-sink")]
#[test]
fn a_postgres_connection_string_of_another_scheme_is_a_configuration_error() {
    let output = iggy_connect(&[
        "pipe",
        "--source",
        "random",
        "--sink",
        "postgres",
        "--set",
        "sink.connection_string=mysql://user@127.0.0.1/db",
        "--set",
        "sink.target_table=t",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let report = stderr(&output);
    assert!(
        report.contains("sink.connection_string") && report.contains("postgres://"),
        "{report}"
    );
    assert!(
        !report.contains("mysql://user"),
        "the connection string is a secret: {report}"
    );
}

/// A loopback port nothing listens on: bound, read, released.
#[cfg(all(feature = "postgres-source", feature = "postgres-sink"))]
fn refused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

#[cfg(all(feature = "postgres-source", feature = "postgres-sink"))]
#[test]
fn a_refused_postgres_connection_names_the_cause_and_the_address() {
    let port = refused_port();
    let url = format!("postgres://app@127.0.0.1:{port}/app");
    let source_side = [
        "--source".to_owned(),
        "postgres".into(),
        "--sink".into(),
        "stdout".into(),
        "--set".into(),
        format!("source.connection_string={url}"),
        "--set".into(),
        "source.tables=[\"events\"]".into(),
    ];
    let sink_side = [
        "--source".to_owned(),
        "random".into(),
        "--sink".into(),
        "postgres".into(),
        "--set".into(),
        format!("sink.connection_string={url}"),
        "--set".into(),
        "sink.target_table=events".into(),
    ];
    for args in [source_side, sink_side] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
            .arg("pipe")
            .args(&args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (sender, lines) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        let found = loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if line.to_lowercase().contains("connection refused") => break Some(line),
                Ok(line) => seen.push(line),
                Err(_) => break None,
            }
        };
        child.kill().unwrap();
        child.wait().unwrap();
        let report = seen.join("\n");
        let line = found.unwrap_or_else(|| panic!("{args:?}: no `connection refused` in {report}"));
        assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
        for noise in ["pool timed out", "reading the catalog", " at line "] {
            assert!(
                !report.contains(noise) && !line.contains(noise),
                "{noise}: {report}\n{line}"
            );
        }
    }
}

/// Every line of `text` that says `error:`, and none twice.
fn assert_one_error_prefix(text: &str) {
    assert!(text.contains("error: "), "{text}");
    for line in text.lines() {
        assert!(
            !line.contains("error: error:"),
            "prefix twice: {line}\n{text}"
        );
    }
}

#[test]
fn pipe_with_a_bad_connector_file_prints_each_problem_with_one_error_prefix() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "source.toml",
        "type = \"source\"\nkey = \"rnd\"\nenabled = true\npath = \"random\"\n\
         [[streams]]\nstream = \"s\"\ntopic = \"t\"\nschema = \"json\"\nbatch_length = \"many\"\n",
    );
    let file = dir.path().join("source.toml");
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        file.to_str().unwrap(),
        "--sink",
        "stdout",
    ]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    let message = stderr(&output);
    assert!(message.contains("batch_length"), "{message}");
    assert!(message.contains("source.toml"), "{message}");
    assert_one_error_prefix(&message);
    // A file that is not there, and a sink file given as the source.
    let output = iggy_connect(&[
        "pipe",
        "--source-file",
        "/nonexistent.toml",
        "--sink",
        "stdout",
    ]);
    assert_one_error_prefix(&stderr(&output));
}

#[test]
fn run_with_json_logging_prints_a_fatal_config_error_as_json_lines() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "config.toml",
        "[iggy]\naddress = \"not an address\"\n[connectors]\nconfig_type = \"local\"\nconfig_dir = \"nowhere\"\n",
    );
    let config = dir.path().join("config.toml");
    for (env, file_format) in [(Some("json"), ""), (None, "[logging]\nformat = \"json\"\n")] {
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, format!("{text}{file_format}")).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_iggy-connect"));
        command.args(["run", "--config", config.to_str().unwrap()]);
        if let Some(format) = env {
            command.env("IGGY_CONNECTORS_LOGGING_FORMAT", format);
        }
        let output = command.output().unwrap();
        assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
        let message = stderr(&output);
        let lines: Vec<serde_json::Value> = message
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}")))
            .collect();
        let fields: Vec<&str> = lines
            .iter()
            .filter_map(|line| line["field"].as_str())
            .collect();
        assert!(fields.contains(&"iggy.address"), "{message}");
        for line in &lines {
            assert_eq!(line["level"], "ERROR", "{line}");
            assert!(
                line["message"]
                    .as_str()
                    .is_some_and(|text| !text.is_empty()),
                "{line}"
            );
        }
        assert!(
            lines
                .iter()
                .any(|line| line["file"].as_str() == Some(config.to_str().unwrap())),
            "{message}"
        );
    }
}
