//! `GET /{sources|sinks}/{key}/dlq` and `POST .../dlq/replay`: a sink whose
//! backend (the faulty sink) refuses one record dead-letters it with its
//! origin; once the backend is fixed a replay delivers it, once.
#![cfg(feature = "faulty-sink")]

use crate::support::accounting::{Seen, seqs_in_file};

use super::*;

const API_KEY: &str = "dlq-key";

struct Refusing {
    harness: Harness,
    sink: String,
    source: String,
    output: PathBuf,
    marker: PathBuf,
}

/// A random source of 30 records into a faulty sink that refuses seq 7
/// while its marker exists, dead-lettering it; returned once it did.
async fn refusing_sink() -> Refusing {
    let work = tempfile::tempdir().unwrap().keep();
    let output = work.join("out.jsonl");
    let marker = work.join("refusing");
    std::fs::write(&marker, "").unwrap();
    let (source, sink, topic) = (unique("src"), unique("out"), unique("t"));
    let source_file = format!(
        "type = \"source\"\nkey = \"{source}\"\nenabled = true\nversion = 0\nname = \"random\"\npath = \"random\"\n\
         [[streams]]\nstream = \"api\"\ntopic = \"{topic}\"\nschema = \"json\"\n\
         [plugin_config]\ninterval = \"2ms\"\nmessages_range = [5, 10]\nmax_count = 30\n"
    );
    let sink_file = format!(
        "type = \"sink\"\nkey = \"{sink}\"\nenabled = true\nversion = 0\nname = \"faulty\"\npath = \"faulty\"\n\
         on_error = \"dlq\"\n[dead_letter]\nstream = \"api\"\ntopic = \"{topic}-dead\"\n\
         [[streams]]\nstream = \"api\"\ntopics = [\"{topic}\"]\nschema = \"json\"\npoll_interval = \"2ms\"\n\
         [plugin_config]\noutput = \"{}\"\nreject_containing = '\"seq\":7,'\nreject_while_exists = \"{}\"\n",
        output.display(),
        marker.display()
    );
    let http = HttpConfig {
        api_key: API_KEY.to_owned().into(),
        ..HttpConfig::default()
    };
    let harness = harness_with(
        &[("a.toml", source_file), ("b.toml", sink_file)],
        Vec::new(),
        http,
    )
    .await;
    let all_but_7: Seen = (0..30)
        .filter(|seq| *seq != 7)
        .map(|seq| (seq, 1))
        .collect();
    let started = Instant::now();
    loop {
        let (_, page) = harness.get(&format!("/sinks/{sink}/dlq")).await;
        if page["dead_letters"]
            .as_array()
            .is_some_and(|dead| dead.len() == 1)
            && seqs_in_file(&output) == all_but_7
        {
            break;
        }
        assert!(started.elapsed() < DEADLINE, "no dead letter: {page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Refusing {
        harness,
        sink,
        source,
        output,
        marker,
    }
}

#[tokio::test]
async fn a_refused_record_is_listed_with_its_origin_and_replayed_once_after_the_fix() {
    let refusing = refusing_sink().await;
    let (harness, sink) = (&refusing.harness, &refusing.sink);
    let (status, page) = harness.get(&format!("/sinks/{sink}/dlq?max_bytes=8")).await;
    assert_eq!(status, StatusCode::OK);
    let dead = &page["dead_letters"][0];
    assert_eq!(dead["error_class"], "rejected", "{page}");
    assert_eq!(dead["stage"], "write");
    assert_eq!(dead["attempts"], 1);
    assert_eq!(dead["replayed"], false);
    assert_eq!(dead["origin"]["stream"], "api");
    let origin_offset = dead["origin"]["offset"].as_u64().unwrap();
    let in_topic = harness
        .bus
        .messages("api", dead["origin"]["topic"].as_str().unwrap());
    let seq_7 = serde_json::from_slice::<Value>(&in_topic[origin_offset as usize].payload).unwrap();
    assert_eq!(seq_7["seq"], 7);
    assert_eq!(
        (
            dead["truncated"].as_bool(),
            dead["payload"].as_str().map(str::len)
        ),
        (Some(true), Some(8))
    );
    assert_eq!(page["next"], Value::Null);

    // Still refusing: the replay sets it aside again, one attempt more.
    let (status, report) = harness
        .post(&format!("/sinks/{sink}/dlq/replay"), Some(json!({"to": 0})))
        .await;
    assert_eq!(
        (status, report["replayed"].as_u64()),
        (StatusCode::OK, Some(1)),
        "{report}"
    );
    let (_, page) = harness.get(&format!("/sinks/{sink}/dlq")).await;
    let listed = page["dead_letters"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{page}");
    assert_eq!(
        (
            listed[0]["replayed"].as_bool(),
            listed[1]["attempts"].as_u64()
        ),
        (Some(true), Some(2))
    );

    // Fixed: the replay of what is not replayed yet delivers seq 7, once.
    std::fs::remove_file(&refusing.marker).unwrap();
    let (status, report) = harness
        .post(
            &format!("/sinks/{sink}/dlq/replay"),
            Some(json!({"filter": {"error_class": "rejected"}})),
        )
        .await;
    assert_eq!(
        (status, report["offsets"].clone()),
        (StatusCode::OK, json!([1])),
        "{report}"
    );
    assert_eq!(report["skipped_replayed"], 1);
    let everything: Seen = (0..30).map(|seq| (seq, 1)).collect();
    assert_eq!(seqs_in_file(&refusing.output), everything);
    let (_, report) = harness
        .post(&format!("/sinks/{sink}/dlq/replay"), None)
        .await;
    assert_eq!(report["replayed"], 0, "{report}");
    assert_eq!(seqs_in_file(&refusing.output), everything);
}

#[tokio::test]
async fn the_dead_letter_endpoints_need_the_api_key_and_check_what_they_are_asked() {
    let mut refusing = refusing_sink().await;
    let sink = refusing.sink.clone();
    let harness = &mut refusing.harness;
    let bad = [
        format!("/sinks/{sink}/dlq?limit=0"),
        format!("/sinks/{sink}/dlq?max_bytes=99999999"),
        format!("/sinks/{sink}/dlq?color=red"),
        format!("/sources/{}/dlq", refusing.source),
    ];
    for path in bad {
        let (status, body) = harness.get(&path).await;
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{path}: {body}"
        );
    }
    let (status, body) = harness.get("/sinks/nobody/dlq").await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );
    for body in [
        json!({"target": "elsewhere"}),
        json!({"from": 5, "to": 1}),
        json!({"count": 0}),
    ] {
        let (status, answer) = harness
            .post(&format!("/sinks/{sink}/dlq/replay"), Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
    }
    let (status, _) = harness
        .post(
            &format!("/sinks/{sink}/dlq/replay"),
            Some(json!({"unknown": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // One replay at a time, and none while the connector's lifecycle changes.
    let lock = harness.runtime.lifecycle_lock(ConnectorKind::Sink, &sink);
    let held = lock.lock().await;
    let (status, body) = harness
        .post(&format!("/sinks/{sink}/dlq/replay"), None)
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::CONFLICT, Some("conflict"))
    );
    drop(held);

    harness.api_key = None;
    let (status, _) = harness
        .text(reqwest::Method::GET, &format!("/sinks/{sink}/dlq"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _) = harness
        .text(reqwest::Method::POST, &format!("/sinks/{sink}/dlq/replay"))
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
