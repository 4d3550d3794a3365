//! Throughput of the nats sink, Iggy -> sink -> a real local
//! `nats-server -js` (Debian's 2.9, started by the case from
//! `tests/support/nats_server.rs`, installed by `scripts/ensure-debian-packages`):
//!
//!     cargo bench --features nats-sink,nats-source --bench nats
//!
//! Iggy is `IGGY_ADDRESS` or the test server (see `benches/common/mod.rs`);
//! each case runs in its own process and prints one `bench:` line. The NATS
//! server is a separate process: its memory is not in `rss_mb`.
//!
//! `BENCH_SCALE` (default 1.0) multiplies every case's size.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use common::{Iggy, raw};
use iggy_connect::connectors::ConnectorKind;
use serde_json::json;
use support::nats_server::{NatsServer, stream_messages};

const CASES: &[&str] = &["iggy_to_nats_jetstream"];
const TOPIC: &str = "events";

fn main() {
    common::main(CASES, run);
}

async fn run(case: String) {
    let case = case.as_str();
    let iggy = Iggy::start();
    let stream = common::unique(case);
    let messages = common::scaled(200_000, 1000);
    match case {
        "iggy_to_nats_jetstream" => {
            let server = NatsServer::start();
            let plugin = format!(
                "url = \"{}\"\nsubject = \"bench.events\"\nstream = \"BENCH\"\nstream_subjects = [\"bench.>\"]\n",
                server.url()
            );
            sink_case(case, &iggy, &stream, messages, "nats", &plugin).await;
            let stored = stream_messages(&server.jetstream().await, "BENCH").await;
            assert_eq!(stored, messages, "messages in the JetStream stream");
        }
        other => panic!("unknown case {other}"),
    }
}

async fn sink_case(case: &str, iggy: &Iggy, stream: &str, messages: u64, path: &str, plugin: &str) {
    let client = raw::topic(iggy, stream, TOPIC).await;
    raw::send(&client, stream, TOPIC, messages, 1000, |n| {
        serde_json::to_vec(&json!({"id": n, "name": "bench", "text": "x".repeat(100)}))
            .expect("json")
            .into()
    })
    .await;
    let poll_interval = humantime::format_duration(common::poll_interval());
    let file = format!(
        r#"
        type = "sink"
        key = "bench_sink"
        path = "{path}"
        [[streams]]
        stream = "{stream}"
        topics = ["{TOPIC}"]
        schema = "json"
        batch_length = 5000
        poll_interval = "{poll_interval}"
        consumer_group = "bench"
        [plugin_config]
        {plugin}
        "#
    );
    common::run_connector(
        case,
        iggy,
        ConnectorKind::Sink,
        "bench_sink",
        &file,
        messages,
    )
    .await;
    raw::drop_stream(&client, stream).await;
}
