//! Prometheus metrics and `/stats` against the messages moved.

use super::*;
use crate::support::prometheus::{parse_metrics, sample};

#[tokio::test]
async fn metrics_and_stats_count_the_messages_actually_moved() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let source_file = random_source(&source, &topic, "").replace(
        "messages_range = [5, 5]",
        "messages_range = [5, 5]\nmax_count = 40",
    );
    let harness = harness(&[
        ("a.toml", source_file),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sources", &source, "stopped").await;
    let started = Instant::now();
    loop {
        let (_, details) = harness.get(&format!("/sources/{source}")).await;
        assert_eq!(details["stop_reason"], "completed");
        let (_, stats) = harness.get("/stats").await;
        let processed = stats["connectors"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["key"] == sink.as_str())
            .unwrap()["messages_processed"]
            .as_u64()
            .unwrap();
        if processed == 40 {
            break;
        }
        assert!(
            started.elapsed() < DEADLINE,
            "the sink processed {processed} of 40"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(harness.bus.messages("api", &topic).len(), 40);

    let (status, stats) = harness.get("/stats").await;
    assert_eq!(status, StatusCode::OK);
    for field in [
        "connectors_runtime_version",
        "connectors_runtime_version_semver",
        "process_id",
        "cpu_usage",
        "total_cpu_usage",
        "memory_usage",
        "total_memory",
        "available_memory",
        "run_time",
        "start_time",
        "sources_total",
        "sources_running",
        "sinks_total",
        "sinks_running",
    ] {
        assert!(stats.get(field).is_some(), "missing {field}");
    }
    assert_eq!(
        stats["process_id"].as_u64(),
        Some(u64::from(std::process::id()))
    );
    assert!(stats["memory_usage"].as_u64().unwrap() > 0);
    let entry = stats["connectors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|entry| entry["key"] == source.as_str())
        .unwrap();
    assert_eq!(
        (
            entry["messages_produced"].as_u64(),
            entry["messages_sent"].as_u64(),
            entry["status"].as_str()
        ),
        (Some(40), Some(40), Some("stopped"))
    );
    assert!(entry["messages_consumed"].is_null());

    let (status, text) = harness.text(reqwest::Method::GET, "/metrics").await;
    assert_eq!(status, StatusCode::OK);
    let samples = parse_metrics(&text);
    let source_labels = [("connector_type", "source")];
    let sink_labels = [("connector_type", "sink")];
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_produced_total",
            &source,
            &source_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_sent_total",
            &source,
            &source_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_consumed_total",
            &sink,
            &sink_labels
        ),
        Some(40.0)
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_messages_processed_total",
            &sink,
            &sink_labels
        ),
        Some(40.0)
    );
    assert!(
        sample(
            &samples,
            "iggy_connector_stage_duration_seconds_bucket",
            &source,
            &[("stage", "total"), ("le", "0.00005")]
        )
        .is_some(),
        "upstream's first bucket, 50 µs"
    );
    assert_eq!(
        sample(
            &samples,
            "iggy_connector_stage_duration_seconds_count",
            &sink,
            &[("stage", "commit")]
        )
        .map(|count| count > 0.0),
        Some(true)
    );
    let (status, _) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a completed finite source is healthy"
    );
}
