//! Throughput of the s3 sink: Iggy -> sink -> moto's S3 server (PyPI
//! `moto[server]`, a Python process on loopback, so its cost is part of the
//! figures; `scripts/s3-emulator` installs it):
//!
//!     cargo bench --features s3-sink --bench backends -- s3
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! the case prints one `bench:` line with `objects=N` added. The time runs
//! until every message is in an uploaded object (the sink is stopped after
//! it accepted the last one, which flushes and commits what it holds).
//! `BENCH_SCALE` (default 1.0) multiplies the case's size (a debug check:
//! `BENCH_SCALE=0.01 cargo bench --profile dev --features s3-sink --bench backends -- s3`).
#![cfg(feature = "s3-sink")]

use iggy_connect::connectors::ConnectorKind;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::s3::S3Server;

const CASES: &[&str] = &["iggy_to_s3_sink"];
const TOPIC: &str = "events";
const BUCKET: &str = "bench";

inventory::submit! {
    crate::Bench {
        name: "s3",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let iggy = Iggy::start();
    let stream = common::unique(&case);
    sink_case(&case, &iggy, &stream, common::scaled(100_000, 1000)).await;
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64) {
    let server = S3Server::start().await;
    server.create_bucket(BUCKET).await;
    let client = raw::topic_of_documents(iggy, stream, TOPIC, messages).await;
    let stages = Stages::install();
    let poll_interval = humantime::format_duration(common::poll_interval());
    let endpoint = server.endpoint();
    let pipeline = Pipeline::new(
        iggy,
        &format!(
            r#"
                type = "sink"
                key = "s3_sink"
                path = "libiggy_connector_s3_sink"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                bucket = "{BUCKET}"
                region = "us-east-1"
                endpoint = "{endpoint}"
                access_key_id = "bench"
                secret_access_key = "bench"
                file_rotation = "messages"
                max_messages_per_file = 10000
                compression = "gzip"
                "#
        ),
    );
    let started = std::time::Instant::now();
    pipeline
        .run_until_done(ConnectorKind::Sink, "s3_sink", messages)
        .await;
    pipeline.runtime.shutdown().await;
    let elapsed = started.elapsed();
    let objects = server.objects(BUCKET);
    let mut stored = 0;
    for (_, body) in &objects {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(&body[..]), &mut text)
            .expect("gzip");
        stored += text.lines().count() as u64;
    }
    assert_eq!(stored, messages, "every message in one object");
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies("s3_sink"),
        extra: vec![
            ("objects", objects.len().to_string()),
            ("backend", "moto".into()),
            ("server", iggy.kind().into()),
        ],
    }
    .print();
    raw::drop_stream(&client, stream).await;
}
