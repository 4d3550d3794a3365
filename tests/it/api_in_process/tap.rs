//! `GET /{sources|sinks}/{key}/tap`: live messages of a running pipeline as
//! Server-Sent Events, read here with a real HTTP client.

use bytes::Bytes;
use iggy_connect::iggy::{Bus, ProducerTarget};
use iggy_connect::message::{HeaderValue, OutgoingMessage};

use super::*;

/// One Server-Sent Event: its name and its JSON data.
#[derive(Debug)]
struct SseEvent {
    event: String,
    data: Value,
}

/// Reads the events of an SSE response as they come.
struct SseReader {
    response: reqwest::Response,
    buffer: String,
}

impl SseReader {
    fn new(response: reqwest::Response) -> Self {
        Self {
            response,
            buffer: String::new(),
        }
    }

    /// The next event (keep-alive comments skipped), within the deadline.
    async fn next(&mut self) -> SseEvent {
        tokio::time::timeout(DEADLINE, self.next_event())
            .await
            .expect("an event within the deadline")
    }

    async fn next_event(&mut self) -> SseEvent {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let mut event = "message".to_owned();
                let mut data = String::new();
                for line in block.lines() {
                    if let Some(name) = line.strip_prefix("event:") {
                        event = name.trim().to_owned();
                    } else if let Some(text) = line.strip_prefix("data:") {
                        data.push_str(text.trim_start());
                    }
                }
                if data.is_empty() {
                    continue;
                }
                let data = serde_json::from_str(&data).expect("event data is JSON");
                return SseEvent { event, data };
            }
            let chunk = self
                .response
                .chunk()
                .await
                .unwrap()
                .expect("the stream goes on");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }

    /// The next `message` event, skipping notices other than `subscribed`.
    async fn next_message(&mut self) -> Value {
        loop {
            let event = self.next().await;
            if event.event == "message" {
                return event.data;
            }
        }
    }
}

impl Harness {
    /// Opens a tap and waits for its `subscribed` notice.
    async fn tap(&self, path: &str) -> SseReader {
        let response = self
            .request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let content_type = response.headers()["content-type"].to_str().unwrap();
        assert!(
            content_type.starts_with("text/event-stream"),
            "{content_type}"
        );
        let mut reader = SseReader::new(response);
        let first = reader.next().await;
        assert_eq!(
            (first.event.as_str(), first.data["notice"].as_str()),
            ("notice", Some("subscribed"))
        );
        reader
    }
}

#[tokio::test]
async fn a_tap_shows_live_messages_of_a_source_and_of_a_sink() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", random_source(&source, &topic, "")),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sinks", &sink, "running").await;

    let mut sent = harness
        .tap(&format!("/sources/{source}/tap?stage=out&max_bytes=10"))
        .await;
    let frame = sent.next_message().await;
    assert_eq!(frame["connector"], json!(source));
    assert_eq!(frame["stage"], json!("out"));
    assert_eq!(
        (frame["stream"].as_str(), frame["topic"].as_str()),
        (Some("api"), Some(topic.as_str()))
    );
    assert_eq!(frame["encoding"], json!("utf8"));
    assert!(frame["payload"].as_str().unwrap().len() <= 10, "{frame}");
    assert_eq!(
        frame["truncated"],
        json!(frame["size"].as_u64().unwrap() > 10)
    );

    for stage in ["in", "out"] {
        let mut tap = harness
            .tap(&format!("/sinks/{sink}/tap?stage={stage}"))
            .await;
        let frame = tap.next_message().await;
        assert_eq!(
            (frame["connector"].as_str(), frame["stage"].as_str()),
            (Some(sink.as_str()), Some(stage))
        );
        assert_eq!(frame["topic"], json!(topic));
        assert!(
            frame["offset"].is_u64() && frame["partition"].is_u64(),
            "{frame}"
        );
        let payload: Value = serde_json::from_str(frame["payload"].as_str().unwrap()).unwrap();
        assert!(payload.is_object(), "the random source's JSON: {payload}");
    }
}

#[tokio::test]
async fn a_tap_forwards_at_most_limit_messages_per_interval() {
    let (source, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", random_source(&source, &topic, ""))]).await;
    harness.wait_for_status("sources", &source, "running").await;

    // An interval longer than the test: the limit notice comes after exactly
    // `limit` messages, and nothing but notices and keep-alives follow.
    let mut tap = harness
        .tap(&format!(
            "/sources/{source}/tap?stage=in&limit=3&interval_ms=600000"
        ))
        .await;
    let mut messages = 0;
    loop {
        let event = tap.next().await;
        match event.event.as_str() {
            "message" => messages += 1,
            _ => {
                assert_eq!(event.data["notice"], json!("limit"), "{:?}", event.data);
                break;
            }
        }
    }
    assert_eq!(messages, 3);
}

#[tokio::test]
async fn a_tap_needs_the_api_key_and_a_known_connector_and_stage() {
    let http = HttpConfig {
        api_key: "letmein".to_owned().into(),
        ..HttpConfig::default()
    };
    let source = unique("src");
    let mut harness = harness_with(
        &[("a.toml", random_source(&source, &unique("t"), ""))],
        Vec::new(),
        http,
    )
    .await;
    harness.wait_for_status("sources", &source, "running").await;
    let mut tap = harness.tap(&format!("/sources/{source}/tap")).await;
    assert_eq!(tap.next_message().await["stage"], json!("in"));

    let (status, body) = harness
        .get(&format!("/sources/{source}/tap?stage=transformed"))
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request"))
    );
    let (status, body) = harness.get("/sources/nobody/tap").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("source_not_found"))
    );
    let (status, body) = harness.get(&format!("/sinks/{source}/tap")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );

    harness.api_key = None;
    let (status, _) = harness
        .text(reqwest::Method::GET, &format!("/sources/{source}/tap"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    harness.api_key = Some("wrong".into());
    let (status, _) = harness
        .text(reqwest::Method::GET, &format!("/sources/{source}/tap"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_tap_is_refused_when_turned_off() {
    let http = HttpConfig {
        tap: false,
        ..HttpConfig::default()
    };
    let source = unique("src");
    let harness = harness_with(
        &[("a.toml", random_source(&source, &unique("t"), ""))],
        Vec::new(),
        http,
    )
    .await;
    let (status, body) = harness.get(&format!("/sources/{source}/tap")).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::FORBIDDEN, Some("tap_disabled"))
    );
}

#[tokio::test]
async fn a_tap_redacts_the_configured_header_names() {
    let http = HttpConfig {
        tap_redact_headers: vec!["X-Secret-Token".into()],
        ..HttpConfig::default()
    };
    let (sink, topic) = (unique("snk"), unique("t"));
    let harness = harness_with(&[("b.toml", stdout_sink(&sink, &topic))], Vec::new(), http).await;
    harness.wait_for_status("sinks", &sink, "running").await;
    let mut tap = harness.tap(&format!("/sinks/{sink}/tap?stage=in")).await;

    let producer = harness
        .bus
        .producer(&ProducerTarget {
            stream: "api".into(),
            topic: topic.clone(),
            partitions: 1,
            batch_length: 100,
            linger_time: Duration::ZERO,
        })
        .await
        .unwrap();
    let headers = vec![
        ("x-secret-token".into(), HeaderValue::String(CANARY.into())),
        ("x-trace".into(), HeaderValue::String("visible".into())),
    ];
    let message = OutgoingMessage::new(Some(1), headers, Bytes::from_static(b"{\"n\":1}"));
    producer.send(&[message]).await.unwrap();

    let frame = tap.next_message().await;
    assert_eq!(frame["headers"]["x-secret-token"], json!("[REDACTED]"));
    assert_eq!(frame["headers"]["x-trace"], json!("visible"));
    assert!(!frame.to_string().contains(CANARY), "{frame}");
}

#[tokio::test]
async fn a_shutdown_ends_an_open_tap_cleanly_instead_of_cutting_it_at_the_grace() {
    let (source, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", random_source(&source, &topic, ""))]).await;
    harness.wait_for_status("sources", &source, "running").await;
    let mut tap = harness.tap(&format!("/sources/{source}/tap")).await;
    tap.next_message().await;

    harness.server.shutdown().await;
    // The event stream ended: the rest of the body reads to its end. Cut at
    // the grace, the chunked body would end in an error instead.
    let rest = tokio::time::timeout(DEADLINE, async {
        while let Some(chunk) = tap.response.chunk().await? {
            drop(chunk);
        }
        Ok::<_, reqwest::Error>(())
    })
    .await
    .expect("the body ends");
    assert!(rest.is_ok(), "the tap's body ended in an error: {rest:?}");
}
