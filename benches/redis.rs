//! Throughput of the redis sink and source through Iggy, against a real
//! local Redis (Debian's redis-server 7.0, started by the case from
//! `tests/support/redis.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features redis-sink,redis-source --bench redis
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. Redis is a
//! separate process (AOF fsynced on every write, as the tests run it): its
//! memory is not in `rss_mb`. `BENCH_SCALE` (default 1.0) multiplies every
//! case's size.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Iggy, Report, Stages, raw};
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::IggyBus;
use iggy_connect::state::FileStateStore;
use serde_json::json;
use support::redis::RedisServer;

// The source case (`redis_to_iggy`) is not listed yet: in a debug check it
// did not finish within 5 minutes and was not debugged before the deadline.
const CASES: &[&str] = &["iggy_to_redis"];
const TOPIC: &str = "events";

fn main() {
    common::main(CASES, run);
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let messages = common::scaled(100_000, 1000);
    let redis = RedisServer::start();
    let payload = |n: u64| json!({"id": n, "name": "bench", "text": "x".repeat(100)}).to_string();
    let (kind, key, file) = match case {
        "iggy_to_redis" => {
            let client = raw::topic(&iggy, &stream, TOPIC).await;
            raw::send(&client, &stream, TOPIC, messages, 1000, |n| {
                payload(n).into()
            })
            .await;
            let poll_interval = humantime::format_duration(common::poll_interval());
            let file = format!(
                r#"
                type = "sink"
                key = "bench_sink"
                path = "redis"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                url = "{url}"
                stream = "bench"
                "#,
                url = redis.url()
            );
            (ConnectorKind::Sink, "bench_sink", file)
        }
        "redis_to_iggy" => {
            let mut connection = redis.client().await;
            for chunk in (0..messages).collect::<Vec<_>>().chunks(1000) {
                let mut pipeline = redis::pipe();
                for n in chunk {
                    pipeline
                        .cmd("XADD")
                        .arg("bench")
                        .arg("*")
                        .arg("payload")
                        .arg(payload(*n))
                        .ignore();
                }
                let () = pipeline.query_async(&mut connection).await.expect("XADD");
            }
            let file = format!(
                r#"
                type = "source"
                key = "bench_source"
                path = "redis"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "json"
                batch_length = 1000
                [plugin_config]
                url = "{url}"
                streams = ["bench"]
                batch_size = 1000
                "#,
                url = redis.url()
            );
            (ConnectorKind::Source, "bench_source", file)
        }
        other => panic!("unknown case {other}"),
    };
    let stages = Stages::install();
    let state = tempfile::tempdir().expect("state dir");
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(iggy.settings())),
        Arc::new(FileStateStore::new(state.path()).expect("state store")),
        Duration::from_secs(10),
    );
    runtime.add(connector(&file)).expect("add connector");
    let started = Instant::now();
    runtime.start_enabled().await;
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let view = runtime.view(kind, key).expect("view");
        if view.metrics.processed.get() >= messages {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{key} did not finish: {:?}",
            view.status
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let elapsed = started.elapsed();
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies(key),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
    runtime.shutdown().await;
}

fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("bench.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad bench config: {issues}"))
        .0
}
