//! Throughput of the file source through Iggy: a log of lines written
//! beforehand, tailed into a one-partition topic.
//!
//!     cargo bench --no-default-features --features file-source --bench backends -- file
//!
//! The ceiling, measured in the same run on the same file (in the page
//! cache, read once before): `cat FILE > /dev/null`, printed as
//! `ceiling_lines_per_s` (the file's lines over cat's time) and
//! `of_ceiling`. `BENCH_SCALE` (default 1.0) multiplies the line count.
#![cfg(feature = "file-source")]

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Instant;

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages};

const CASES: &[&str] = &["file_tail_to_iggy"];

inventory::submit! {
    crate::Bench {
        name: "file",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let lines = common::scaled(1_000_000, 1000);
    let dir = tempfile::tempdir().expect("temp dir");
    let log = dir.path().join("app.log");
    write_log(&log, lines);
    let ceiling = lines as f64 / cat_seconds(&log);

    let iggy = Iggy::start();
    let stream = common::unique(&case);
    let file = format!(
        r#"
        type = "source"
        key = "bench_source"
        path = "file"
        max_in_flight = 16
        [[streams]]
        stream = "{stream}"
        topic = "lines"
        schema = "text"
        batch_length = 1000
        [plugin_config]
        include = ["{log}"]
        batch_size = 1000
        poll_interval = "10ms"
        include_file_headers = false
        "#,
        log = log.display(),
    );
    let stages = Stages::install();
    let pipeline = Pipeline::new(&iggy, &file);
    let elapsed = pipeline
        .run_until_done(ConnectorKind::Source, "bench_source", lines)
        .await;
    pipeline.runtime.shutdown().await;
    let report = Report {
        name: &case,
        messages: lines,
        elapsed,
        latencies: stages.latencies("bench_source"),
        extra: Vec::new(),
    };
    let of_ceiling = report.rate() / ceiling;
    Report {
        extra: vec![
            ("server", iggy.kind().into()),
            ("line_bytes", (LINE.len() + 8).to_string()),
            ("ceiling_lines_per_s", format!("{ceiling:.0}")),
            ("of_ceiling", format!("{:.1}%", of_ceiling * 100.0)),
        ],
        ..report
    }
    .print();
}

/// A typical log line: with its 7-digit number and newline, 101 bytes.
const LINE: &str =
    "2026-12-05T21:00:00.000Z INFO  request handled path=/api/orders status=200 duration_ms=12 id=";

fn write_log(path: &std::path::Path, lines: u64) {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).expect("log"));
    for number in 0..lines {
        writeln!(out, "{LINE}{number:07}").expect("write log");
    }
    out.flush().expect("flush log");
}

/// The fastest of three `cat FILE > /dev/null` (the first one also warms
/// the page cache, as the source then finds it).
fn cat_seconds(path: &std::path::Path) -> f64 {
    (0..3)
        .map(|_| {
            let started = Instant::now();
            let status = Command::new("cat")
                .arg(path)
                .stdout(Stdio::null())
                .status()
                .expect("cat runs");
            assert!(status.success(), "cat failed");
            started.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}
