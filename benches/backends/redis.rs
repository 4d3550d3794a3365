//! Throughput of the redis sink and source through Iggy, against a real
//! local Redis (Debian's redis-server 7.0, started by the case from
//! `tests/support/redis.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features redis-sink,redis-source --bench backends -- redis
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. Redis is a
//! separate process (AOF fsynced on every write, as the tests run it): its
//! memory is not in `rss_mb`. `BENCH_SCALE` (default 1.0) multiplies every
//! case's size.
#![cfg(all(feature = "redis-source", feature = "redis-sink"))]

use iggy_connect::connectors::ConnectorKind;
use serde_json::json;

use crate::common;
use crate::common::{Iggy, Pipeline, Report, Stages, raw};
use crate::support::redis::RedisServer;

const CASES: &[&str] = &["iggy_to_redis", "redis_to_iggy"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "redis",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
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
    let pipeline = Pipeline::new(&iggy, &file);
    let elapsed = pipeline.run_until_done(kind, key, messages).await;
    // After the shutdown every batch's commit has recorded its duration.
    pipeline.runtime.shutdown().await;
    Report {
        name: case,
        messages,
        elapsed,
        latencies: stages.latencies(key),
        extra: vec![("server", iggy.kind().into())],
    }
    .print();
}
