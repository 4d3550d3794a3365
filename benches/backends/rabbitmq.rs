//! Throughput of the rabbitmq sink and source through Iggy and a real local
//! RabbitMQ broker (Debian's `rabbitmq-server` 3.10, started by the case from
//! `tests/support/rabbitmq.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features rabbitmq-sink,rabbitmq-source --bench backends -- rabbitmq
//!
//! - `iggy_to_rabbitmq`: Iggy -> sink -> a durable queue (persistent
//!   messages, publisher confirms per batch);
//! - `rabbitmq_to_iggy` (not listed yet, see `CASES`): a durable queue filled
//!   beforehand -> source (manual acks per batch) -> Iggy.
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/backends/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The broker
//! is a separate process: its memory is not in `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size (at least 1000
//! messages): `BENCH_SCALE=0.01` for a quick check.
#![cfg(all(feature = "rabbitmq-source", feature = "rabbitmq-sink"))]

use iggy_connect::connectors::ConnectorKind;
use serde_json::json;

use crate::common;
use crate::common::{Iggy, raw};
use crate::support;
use crate::support::rabbitmq::{client, publish, shared, unique};

const CASES: &[&str] = &["iggy_to_rabbitmq", "rabbitmq_to_iggy"];
const TOPIC: &str = "events";

inventory::submit! {
    crate::Bench {
        name: "rabbitmq",
        cases: CASES,
        run: |case| Box::pin(run(case)),
    }
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let messages = common::scaled(100_000, 1000);
    let port = shared().port;
    let queue = unique("bench");
    client(port).await.queue(&queue, None).await;
    let payload = |n: u64| json!({"id": n, "name": "bench", "text": "x".repeat(100)}).to_string();
    match case {
        "iggy_to_rabbitmq" => {
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
                path = "rabbitmq"
                [[streams]]
                stream = "{stream}"
                topics = ["{TOPIC}"]
                schema = "json"
                batch_length = 1000
                poll_interval = "{poll_interval}"
                consumer_group = "bench"
                [plugin_config]
                port = {port}
                routing_key = "{queue}"
                "#
            );
            common::run_connector(
                case,
                &iggy,
                ConnectorKind::Sink,
                "bench_sink",
                &file,
                messages,
            )
            .await;
            let ready = support::rabbitmq::client(port).await.ready(&queue).await;
            assert!(
                u64::from(ready) >= messages,
                "{ready} messages in the queue"
            );
            raw::drop_stream(&client, &stream).await;
        }
        "rabbitmq_to_iggy" => {
            let client = raw::topic(&iggy, &stream, TOPIC).await;
            publish(port, &queue, (0..messages).map(|n| payload(n).into_bytes())).await;
            let file = format!(
                r#"
                type = "source"
                key = "bench_source"
                path = "rabbitmq"
                [[streams]]
                stream = "{stream}"
                topic = "{TOPIC}"
                schema = "json"
                batch_length = 1000
                [plugin_config]
                port = {port}
                queue = "{queue}"
                batch_size = 1000
                "#
            );
            common::run_connector(
                case,
                &iggy,
                ConnectorKind::Source,
                "bench_source",
                &file,
                messages,
            )
            .await;
            raw::drop_stream(&client, &stream).await;
        }
        other => panic!("unknown case {other}"),
    }
}
