//! The mongodb source against a MongoDB server from `support::mongodb` (the
//! nx-27017 emulator, or the real mongod of `IGGY_CONNECT_TEST_MONGODB_URL`),
//! driven as the engine drives it: open, poll, commit.
#![cfg(feature = "mongodb-source")]

use iggy_connect::connectors::{Registry, Source, decode_state};
use iggy_connect::message::Payload;
use mongodb::bson::{Document, doc};
use serde_json::{Value, json};

use crate::support::mongodb::{MongoServer, unique_database};

fn build(config: &Value) -> Box<dyn Source> {
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "mongodb")
        .expect("the mongodb source is compiled in");
    (entry.build)(config).expect("a valid config")
}

async fn open(config: &Value, state: Option<&[u8]>) -> Box<dyn Source> {
    let mut source = build(config);
    source.open(state).await.expect("open");
    source
}

fn config(server: &MongoServer, database: &str, extra: Value) -> Value {
    let mut config = json!({
        "connection_uri": server.uri(),
        "database": database,
        "collection": "orders",
        "poll_interval": "10ms",
        "batch_size": 2,
        "server_selection_timeout": "2s",
    });
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    config
}

async fn insert(server: &MongoServer, database: &str, documents: Vec<Document>) {
    server
        .client()
        .await
        .database(database)
        .collection::<Document>("orders")
        .insert_many(documents)
        .await
        .unwrap();
}

/// `n` of each payload of one poll.
fn numbers(records: &[iggy_connect::message::SourceRecord]) -> Vec<i64> {
    records
        .iter()
        .map(|record| match &record.payload {
            Payload::Json(value) => value["n"].as_i64().unwrap(),
            other => panic!("expected JSON, got {other:?}"),
        })
        .collect()
}

/// Polls and commits until a poll is empty; the `n`s read and the last state.
async fn drain(source: &dyn Source) -> (Vec<i64>, Option<Vec<u8>>) {
    let mut read = Vec::new();
    let mut state = None;
    for _ in 0..50 {
        let batch = source.poll().await.unwrap();
        source.commit().await.unwrap();
        if batch.records.is_empty() {
            return (read, state);
        }
        read.extend(numbers(&batch.records));
        state = batch.state.or(state);
    }
    panic!("the source never caught up: {read:?}");
}

/// Documents sharing a tracking value across batch boundaries are all read,
/// once, in (tracking value, _id) order.
#[tokio::test]
async fn documents_sharing_a_tracking_value_across_batches_are_all_read_once_in_order() {
    let server = MongoServer::start();
    let database = unique_database("ties");
    let stamps = [1, 1, 1, 2, 2, 3, 3];
    insert(
        &server,
        &database,
        stamps
            .iter()
            .enumerate()
            .rev()
            .map(|(n, ts)| doc! { "_id": n as i64, "n": n as i64, "ts": *ts })
            .chain([doc! { "_id": 100_i64, "n": 100_i64 }])
            .collect(),
    )
    .await;
    let source = open(
        &config(&server, &database, json!({"tracking_field": "ts"})),
        None,
    )
    .await;
    let (read, _) = drain(source.as_ref()).await;
    assert_eq!(
        read,
        vec![0, 1, 2, 3, 4, 5, 6],
        "the document without `ts` is not read"
    );
}

/// The four state checks: a fresh start reads from the beginning (or after
/// `initial_offset`), a restored state resumes after its cursor, the state
/// round-trips through its encoding, and a corrupt state refuses the start.
#[tokio::test]
async fn state_fresh_start_restore_round_trip_and_corrupt_refusal() {
    let server = MongoServer::start();
    let database = unique_database("state");
    insert(
        &server,
        &database,
        (0..5).map(|n: i64| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    let settings = config(&server, &database, json!({}));
    let source = open(&settings, None).await;
    let batch = source.poll().await.unwrap();
    assert_eq!(numbers(&batch.records), vec![0, 1]);
    source.commit().await.unwrap();
    let state = batch.state.expect("a state with the batch");
    let decoded: serde_json::Value = decode_state(&state).unwrap();
    // The emulator hands 64-bit integers back as 32-bit ones when they fit.
    let id = decoded["tracking_id"].as_str().unwrap();
    assert!(
        ["{\"$numberLong\":\"1\"}", "{\"$numberInt\":\"1\"}"].contains(&id),
        "{decoded}"
    );
    assert_eq!(decoded["processed_documents"], json!(2));

    let restored = open(&settings, Some(&state)).await;
    let (read, _) = drain(restored.as_ref()).await;
    assert_eq!(read, vec![2, 3, 4]);

    let offset = open(
        &config(&server, &database, json!({"initial_offset": 2})),
        None,
    )
    .await;
    assert_eq!(drain(offset.as_ref()).await.0, vec![3, 4]);

    let mut corrupt = build(&settings);
    let error = corrupt.open(Some(b"\x01not msgpack")).await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
}

/// An uncommitted batch is read again by the next source (a crash before
/// the commit); the cursor moves only on commit.
#[tokio::test]
async fn a_batch_not_committed_is_read_again_after_a_restart() {
    let server = MongoServer::start();
    let database = unique_database("uncommitted");
    insert(
        &server,
        &database,
        (0..3).map(|n: i64| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    let settings = config(&server, &database, json!({}));
    let first = open(&settings, None).await;
    let committed = first.poll().await.unwrap();
    first.commit().await.unwrap();
    let lost = first.poll().await.unwrap();
    assert_eq!(numbers(&lost.records), vec![2]);
    drop(first);
    let again = open(&settings, committed.state.as_deref()).await;
    assert_eq!(drain(again.as_ref()).await.0, vec![2]);
}

/// `delete_after_read` deletes nothing when polled, only on commit; a
/// processed field is set on commit and marked documents are skipped.
#[tokio::test]
async fn delete_and_mark_happen_on_commit_only() {
    let server = MongoServer::start();
    let database = unique_database("consume");
    insert(
        &server,
        &database,
        (0..3).map(|n: i64| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    let source = open(
        &config(&server, &database, json!({"delete_after_read": true})),
        None,
    )
    .await;
    let batch = source.poll().await.unwrap();
    assert_eq!(numbers(&batch.records), vec![0, 1]);
    assert_eq!(server.documents(&database, "orders").await.len(), 3);
    source.commit().await.unwrap();
    let left = server.documents(&database, "orders").await;
    assert_eq!(left.len(), 1, "{left:?}");

    let marked = unique_database("mark");
    insert(
        &server,
        &marked,
        (0..3)
            .map(|n: i64| doc! { "_id": n, "n": n, "done": n == 1 })
            .collect(),
    )
    .await;
    let source = open(
        &config(&server, &marked, json!({"processed_field": "done"})),
        None,
    )
    .await;
    let batch = source.poll().await.unwrap();
    assert_eq!(numbers(&batch.records), vec![0, 2]);
    let before = server.documents(&marked, "orders").await;
    assert!(!truthy(&before[0], "done"));
    source.commit().await.unwrap();
    let after = server.documents(&marked, "orders").await;
    assert!(
        after.iter().all(|document| truthy(document, "done")),
        "{after:?}"
    );
    assert!(source.poll().await.unwrap().records.is_empty());
}

/// A boolean field: the emulator (SQLite underneath) returns booleans as 0 or 1.
fn truthy(document: &Document, key: &str) -> bool {
    match document.get(key) {
        Some(mongodb::bson::Bson::Boolean(value)) => *value,
        Some(mongodb::bson::Bson::Int32(value)) => *value != 0,
        other => panic!("{key} is not a boolean: {other:?}"),
    }
}

#[tokio::test]
async fn a_filter_selects_the_documents_read() {
    let server = MongoServer::start();
    let database = unique_database("filter");
    insert(
        &server,
        &database,
        (0..4)
            .map(|n: i64| doc! { "_id": n, "n": n, "status": if n % 2 == 0 { "ready" } else { "draft" } })
            .collect(),
    )
    .await;
    let source = open(
        &config(
            &server,
            &database,
            json!({"filter": "{\"status\": \"ready\"}"}),
        ),
        None,
    )
    .await;
    assert_eq!(drain(source.as_ref()).await.0, vec![0, 2]);
}

#[tokio::test]
async fn an_unreachable_server_makes_polls_transient() {
    let server = MongoServer::start();
    let port = server.addr().port();
    drop(server);
    let source = open(
        &json!({
            "connection_uri": format!("mongodb://127.0.0.1:{port}/?directConnection=true"),
            "database": "db",
            "collection": "c",
            "server_selection_timeout": "300ms",
        }),
        None,
    )
    .await;
    let error = source.poll().await.unwrap_err();
    assert!(error.is_transient(), "{error}");
}

/// Polls (committing each batch) until `count` change events are read.
async fn changes(source: &dyn Source, count: usize) -> (Vec<Value>, Option<Vec<u8>>) {
    let mut read = Vec::new();
    let mut state = None;
    for _ in 0..200 {
        let batch = source.poll().await.unwrap();
        source.commit().await.unwrap();
        for record in &batch.records {
            match &record.payload {
                Payload::Json(value) => read.push(value.clone()),
                other => panic!("expected JSON, got {other:?}"),
            }
        }
        state = batch.state.or(state);
        if read.len() >= count {
            return (read, state);
        }
    }
    panic!("only {} of {count} changes arrived: {read:?}", read.len());
}

fn change_of(event: &Value) -> (String, i64) {
    let id = &event["documentKey"]["_id"];
    // nx-27017 sends the key as a string ("3"); mongod as the number.
    let id = id
        .as_i64()
        .or_else(|| id["$numberLong"].as_str().or(id.as_str())?.parse().ok());
    (
        event["operationType"].as_str().unwrap().to_owned(),
        id.unwrap_or_else(|| panic!("no documentKey._id in {event}")),
    )
}

/// Inserts, an update and a delete each arrive once, in order, the update
/// with the document looked up; a restart from the saved token reads only
/// what came after it, changes made while stopped included.
#[tokio::test]
async fn change_stream_delivers_each_change_once_in_order_and_resumes_after_its_token() {
    let server = MongoServer::start();
    let database = unique_database("changes");
    let config = config(&server, &database, json!({"mode": "change_stream"}));
    let source = open(&config, None).await;
    // The stream starts at the first poll.
    assert!(source.poll().await.unwrap().records.is_empty());
    source.commit().await.unwrap();
    insert(
        &server,
        &database,
        (1..=3_i64).map(|n| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    let orders = server
        .client()
        .await
        .database(&database)
        .collection::<Document>("orders");
    orders
        .update_one(doc! { "_id": 2_i64 }, doc! { "$set": { "n": 20_i64 } })
        .await
        .unwrap();
    orders.delete_one(doc! { "_id": 1_i64 }).await.unwrap();
    let (read, state) = changes(source.as_ref(), 5).await;
    let seen: Vec<(String, i64)> = read.iter().map(change_of).collect();
    assert_eq!(
        seen,
        [
            ("insert".to_owned(), 1),
            ("insert".to_owned(), 2),
            ("insert".to_owned(), 3),
            ("update".to_owned(), 2),
            ("delete".to_owned(), 1),
        ]
    );
    assert_eq!(read[3]["fullDocument"]["n"], json!(20), "{}", read[3]);
    drop(source);
    // While stopped.
    insert(&server, &database, vec![doc! { "_id": 4_i64, "n": 4_i64 }]).await;
    let restored = open(&config, state.as_deref()).await;
    insert(&server, &database, vec![doc! { "_id": 5_i64, "n": 5_i64 }]).await;
    let (read, _) = changes(restored.as_ref(), 2).await;
    let seen: Vec<(String, i64)> = read.iter().map(change_of).collect();
    assert_eq!(seen, [("insert".to_owned(), 4), ("insert".to_owned(), 5)]);
    assert!(restored.poll().await.unwrap().records.is_empty());
}

/// A batch polled and not committed is read again by a restart from the
/// committed token.
#[tokio::test]
async fn change_stream_batch_not_committed_is_read_again_after_a_restart() {
    let server = MongoServer::start();
    let database = unique_database("changes_nack");
    let config = config(&server, &database, json!({"mode": "change_stream"}));
    let source = open(&config, None).await;
    assert!(source.poll().await.unwrap().records.is_empty());
    source.commit().await.unwrap();
    insert(
        &server,
        &database,
        (1..=4_i64).map(|n| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    let first = source.poll().await.unwrap();
    source.commit().await.unwrap();
    let committed = first.state.clone();
    let second = source.poll().await.unwrap();
    assert_eq!(second.records.len(), 2);
    drop(source);
    let restored = open(&config, committed.as_deref()).await;
    let (read, _) = changes(restored.as_ref(), 2).await;
    let seen: Vec<i64> = read.iter().map(|event| change_of(event).1).collect();
    assert_eq!(
        seen,
        [3, 4],
        "the uncommitted batch again, nothing before it"
    );
}

/// The oldest-change age the change stream's lag probe measures (`None`
/// when it cannot say).
async fn change_age(probe: &dyn iggy_connect::connectors::LagProbe) -> Option<u64> {
    probe.measure().await.ok().and_then(|lag| lag.oldest_age_ms)
}

/// A change stream's lag is zero when read to its end; while changes wait
/// it is the age of the last committed change's cluster time on the
/// server's clock, growing with it; a polling source has no probe.
#[tokio::test]
async fn change_stream_lag_is_the_age_of_the_last_committed_change_and_zero_at_its_end() {
    let server = MongoServer::start();
    let database = unique_database("changes_lag");
    let polling = open(&config(&server, &database, json!({})), None).await;
    assert!(polling.lag_probe().is_none());
    let config = config(&server, &database, json!({"mode": "change_stream"}));
    let source = open(&config, None).await;
    let probe = source
        .lag_probe()
        .expect("a change stream measures its lag");
    assert!(source.poll().await.unwrap().records.is_empty());
    source.commit().await.unwrap();
    assert_eq!(change_age(probe.as_ref()).await, Some(0));

    insert(
        &server,
        &database,
        (1..=3_i64).map(|n| doc! { "_id": n, "n": n }).collect(),
    )
    .await;
    // A full batch (2 of 3): the stream is not read to its end.
    assert_eq!(source.poll().await.unwrap().records.len(), 2);
    source.commit().await.unwrap();
    let first = change_age(probe.as_ref())
        .await
        .expect("the age of the committed change");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut age = first;
    while age < first + 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the age stays {age} ms"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        age = change_age(probe.as_ref()).await.expect("still measured");
    }

    assert_eq!(source.poll().await.unwrap().records.len(), 1);
    source.commit().await.unwrap();
    assert_eq!(change_age(probe.as_ref()).await, Some(0));
}
