//! The elasticsearch source against the Elasticsearch / OpenSearch protocol
//! test server of `support::elasticsearch`, through the `Source` interface:
//! paging under a point in time, ties on the timestamp, the cursor in the
//! engine's state only, an expired point in time, credentials, and
//! upstream's example file.
#![cfg(feature = "elasticsearch-source")]

use std::time::Duration;

use iggy_connect::connectors::{Registry, Source};
use iggy_connect::message::Payload;
use serde_json::{Value, json};

use crate::support::elasticsearch::{Flavor, SearchServer, ServerAuth};

const FLAVORS: [Flavor; 2] = [Flavor::Elasticsearch8, Flavor::OpenSearch2];
const DEADLINE: Duration = Duration::from_secs(10);

fn build(config: &Value) -> Box<dyn Source> {
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "elasticsearch")
        .unwrap();
    (entry.build)(config).expect("a valid config")
}

async fn open(config: &Value, state: Option<&[u8]>) -> Box<dyn Source> {
    let mut source = build(config);
    source.open(state).await.expect("open");
    source
}

fn config(server: &SearchServer, batch_size: usize) -> Value {
    json!({
        "url": server.url(),
        "index": "docs",
        "timestamp_field": "@timestamp",
        "polling_interval": "10ms",
        "batch_size": batch_size,
    })
}

/// `count` documents `d0..`, three per second from 2024-03-01T00:00:00Z, so
/// timestamps tie in threes; indexed in reverse order.
fn seed(server: &SearchServer, count: usize) {
    server.create_index(
        "docs",
        json!({"properties": {"@timestamp": {"type": "date"}}}),
    );
    server.put_documents(
        "docs",
        (0..count).rev().map(|n| {
            let source = json!({"n": n, "@timestamp": format!("2024-03-01T00:00:{:02}Z", n / 3)});
            (format!("d{n}"), source)
        }),
    );
}

/// The `n` of each record of one poll.
async fn poll(source: &dyn Source) -> (Vec<u64>, Option<Vec<u8>>) {
    let batch = tokio::time::timeout(DEADLINE, source.poll())
        .await
        .expect("a batch")
        .expect("poll");
    let numbers = batch
        .records
        .iter()
        .map(|record| match &record.payload {
            Payload::Json(value) => value["n"].as_u64().unwrap(),
            other => panic!("not JSON: {other:?}"),
        })
        .collect();
    (numbers, batch.state)
}

#[tokio::test]
async fn every_document_is_read_once_in_timestamp_order_under_a_point_in_time() {
    for flavor in FLAVORS {
        let server = SearchServer::start(flavor).await;
        seed(&server, 25);
        let source = open(&config(&server, 4), None).await;
        let mut read = Vec::new();
        while read.len() < 25 {
            let (numbers, _) = poll(source.as_ref()).await;
            assert!(
                !numbers.is_empty() && numbers.len() <= 4,
                "{flavor:?}: {numbers:?}"
            );
            read.extend(numbers);
            source.commit().await.unwrap();
        }
        // Within a timestamp the order is the tie-breaker's, not `n`'s.
        let mut seconds: Vec<u64> = read.iter().map(|n| n / 3).collect();
        let sorted = {
            let mut copy = seconds.clone();
            copy.sort();
            copy
        };
        assert_eq!(seconds, sorted, "{flavor:?}: in timestamp order");
        read.sort();
        seconds.dedup();
        assert_eq!(read, (0..25).collect::<Vec<u64>>(), "{flavor:?}");
        let searches: Vec<Value> = server
            .seen()
            .iter()
            .filter(|seen| seen.path == "/_search")
            .map(|seen| serde_json::from_slice(&seen.body).unwrap())
            .collect();
        assert!(
            searches.iter().all(|body| body["pit"]["id"].is_string()),
            "{flavor:?}"
        );
        assert!(
            searches
                .iter()
                .skip(1)
                .any(|body| body["search_after"].is_array()),
            "{flavor:?}: pages follow search_after"
        );
        let tie_breaker = match flavor {
            Flavor::Elasticsearch8 => "_shard_doc",
            Flavor::OpenSearch2 => "_id",
        };
        assert!(
            searches[0]["sort"][1].get(tie_breaker).is_some(),
            "{flavor:?}: {}",
            searches[0]["sort"]
        );
    }
}

#[tokio::test]
async fn a_restart_from_the_saved_state_resumes_inside_a_tie_without_loss_or_repeat() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    seed(&server, 12);
    let mut source = open(&config(&server, 4), None).await;
    let (first, state) = poll(source.as_ref()).await;
    assert_eq!(
        first.len(),
        4,
        "the 4th document shares its second with the 5th and 6th"
    );
    source.commit().await.unwrap();
    source.close().await.unwrap();
    assert_eq!(server.open_pits(), 0, "close releases the point in time");

    let restarted = open(&config(&server, 4), state.as_deref()).await;
    let mut rest = Vec::new();
    while first.len() + rest.len() < 12 {
        let (numbers, _) = poll(restarted.as_ref()).await;
        rest.extend(numbers);
        restarted.commit().await.unwrap();
    }
    let mut all: Vec<u64> = first.iter().chain(&rest).copied().collect();
    all.sort();
    assert_eq!(all, (0..12).collect::<Vec<u64>>());
}

#[tokio::test]
async fn an_expired_point_in_time_is_opened_again_at_the_cursor() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    seed(&server, 9);
    let source = open(&config(&server, 3), None).await;
    let (first, _) = poll(source.as_ref()).await;
    server.expire_pits();
    let (second, _) = poll(source.as_ref()).await;
    let (third, _) = poll(source.as_ref()).await;
    let mut all: Vec<u64> = first.into_iter().chain(second).chain(third).collect();
    all.sort();
    assert_eq!(all, (0..9).collect::<Vec<u64>>());
}

#[tokio::test]
async fn documents_indexed_after_catching_up_are_read_by_a_later_poll() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    seed(&server, 2);
    let source = open(&config(&server, 10), None).await;
    let (first, _) = poll(source.as_ref()).await;
    assert_eq!(first.len(), 2);
    source.commit().await.unwrap();
    assert_eq!(
        server.open_pits(),
        0,
        "caught up: the point in time is closed"
    );
    server.put_document(
        "docs",
        "late",
        json!({"n": 99, "@timestamp": "2024-03-02T00:00:00Z"}),
    );
    let (later, _) = poll(source.as_ref()).await;
    assert_eq!(later, vec![99]);
}

#[tokio::test]
async fn bad_credentials_are_fatal_and_name_the_fields() {
    let server = SearchServer::start_with(
        Flavor::Elasticsearch8,
        ServerAuth::Basic {
            username: "elastic".into(),
            password: "changeme".into(),
        },
    )
    .await;
    seed(&server, 1);
    let mut good = config(&server, 5);
    good["username"] = json!("elastic");
    good["password"] = json!("changeme");
    let source = open(&good, None).await;
    assert_eq!(poll(source.as_ref()).await.0, vec![0]);
    good["password"] = json!("wrong");
    let error = build(&good).open(None).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    assert!(
        error.to_string().contains("username/password or api_key"),
        "{error}"
    );
}

#[tokio::test]
async fn upstreams_example_file_runs_against_the_test_server() {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = repo
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/reference/upstream-configs/elasticsearch_source.toml"))
        .find(|path| path.is_file())
        .expect("upstream's elasticsearch_source.toml");
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let mut plugin_config = serde_json::to_value(&table["plugin_config"]).unwrap();
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    plugin_config["url"] = json!(server.url());
    for n in 0..3 {
        server.put_document(
            "test_documents",
            &format!("d{n}"),
            json!({"n": n, "timestamp": format!("2024-03-01T00:00:0{n}Z")}),
        );
    }
    let source = open(&plugin_config, None).await;
    assert_eq!(poll(source.as_ref()).await.0, vec![0, 1, 2]);
}
