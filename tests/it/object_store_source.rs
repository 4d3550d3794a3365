//! The object_store source against local directories (`file://`) and moto's
//! S3 server (`support::s3`, a real S3 API on a loopback port), producing to
//! the in-process Iggy test server over the real `iggy` client; the crash
//! test runs the real binary and kills it with SIGKILL mid-object.
#![cfg(feature = "object-store-source")]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::support::azurite::Azurite;
use crate::support::binary::Workspace;
use crate::support::harness::{connector, runtime};
use crate::support::iggy_server::{IggyTestServer, StoredMessage};
use crate::support::s3::S3Server;
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(90);

fn source_config(key: &str, topic: &str, url: &str, extra: &str) -> String {
    format!(
        r#"
        type = "source"
        key = "{key}"
        path = "object_store"
        max_consecutive_nacks = 0
        [[streams]]
        stream = "objects"
        topic = "{topic}"
        schema = "json"
        [plugin_config]
        url = "{url}"
        poll_interval = "50ms"
        {extra}
        "#
    )
}

fn file_url(dir: &Path) -> String {
    format!("file://{}", dir.display())
}

/// `seq` of a record: a number (JSON lines) or a string (CSV).
fn seq_of(message: &StoredMessage) -> u64 {
    let record: serde_json::Value = serde_json::from_slice(&message.payload).expect("JSON");
    match &record["seq"] {
        serde_json::Value::Number(number) => number.as_u64().unwrap(),
        serde_json::Value::String(text) => text.parse().unwrap(),
        other => panic!("no seq in {record} ({other})"),
    }
}

fn seqs(messages: &[StoredMessage]) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    for message in messages {
        *seen.entry(seq_of(message)).or_insert(0) += 1;
    }
    seen
}

fn covers(seen: &BTreeMap<u64, usize>, range: std::ops::Range<u64>) -> bool {
    range.into_iter().all(|seq| seen.contains_key(&seq))
}

fn header(message: &StoredMessage, name: &str) -> Option<String> {
    message
        .user_headers_map()
        .iter()
        .find(|(key, _)| key.to_string_value() == name)
        .map(|(_, value)| value.to_string_value())
}

fn json_lines(seqs: std::ops::Range<u64>) -> Vec<u8> {
    let mut body = Vec::new();
    for seq in seqs {
        writeln!(body, "{{\"seq\":{seq},\"pad\":\"some text to read\"}}").unwrap();
    }
    body
}

fn csv(seqs: std::ops::Range<u64>) -> Vec<u8> {
    let mut body = b"seq,name\n".to_vec();
    for seq in seqs {
        writeln!(body, "{seq},\"name, {seq}\"").unwrap();
    }
    body
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    encoder.write_all(data).unwrap();
    encoder.finish().unwrap()
}

/// A Parquet file of `(seq, pad)` rows (snappy, as most writers do).
fn parquet(seqs: std::ops::Range<u64>) -> Vec<u8> {
    use std::sync::Arc;

    use arrow_array::{ArrayRef, Int64Array, RecordBatch, StringArray};
    let batch = RecordBatch::try_from_iter([
        (
            "seq",
            Arc::new(Int64Array::from_iter_values(
                seqs.clone().map(|seq| seq as i64),
            )) as ArrayRef,
        ),
        (
            "pad",
            Arc::new(StringArray::from_iter_values(
                seqs.map(|seq| format!("row {seq}")),
            )) as ArrayRef,
        ),
    ])
    .unwrap();
    let properties = parquet::file::properties::WriterProperties::builder()
        .set_compression(parquet::basic::Compression::SNAPPY)
        .set_max_row_group_row_count(Some(1000))
        .build();
    let mut out = Vec::new();
    let mut writer =
        parquet::arrow::ArrowWriter::try_new(&mut out, batch.schema(), Some(properties)).unwrap();
    writer.write(&batch).unwrap();
    writer.close().unwrap();
    out
}

/// Object `index` of a mixed prefix read with `format = "auto"`: JSON
/// lines plain, gzip and zstd, CSV and Parquet in turn. Returns its key
/// below the prefix and its body.
fn mixed(index: u64, seqs: std::ops::Range<u64>) -> (String, Vec<u8>) {
    match index % 5 {
        0 => (format!("{index:04}.jsonl"), json_lines(seqs)),
        1 => (format!("{index:04}.jsonl.gz"), gzip(&json_lines(seqs))),
        2 => (
            format!("{index:04}.jsonl.zst"),
            zstd::encode_all(&json_lines(seqs)[..], 1).unwrap(),
        ),
        3 => (format!("{index:04}.csv"), csv(seqs)),
        _ => (format!("{index:04}.parquet"), parquet(seqs)),
    }
}

fn write(dir: &Path, name: &str, body: &[u8]) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_small_objects_of_json_lines_csv_parquet_and_gzip_land_once_in_key_order() {
    let iggy = IggyTestServer::start();
    let root = tempfile::tempdir().unwrap();
    let (jsonl, csv_dir, gz, mix) = (
        root.path().join("jsonl"),
        root.path().join("csv"),
        root.path().join("gz"),
        root.path().join("mixed"),
    );
    // 400 JSON lines objects, 300 CSV, 300 gzipped JSON lines (half of
    // them without the .gz extension: found by their magic bytes); 5
    // records each. Written out of key order.
    for index in (0..400u64).rev() {
        write(
            &jsonl,
            &format!("part-{index:04}.jsonl"),
            &json_lines(index * 5..index * 5 + 5),
        );
    }
    for index in 0..300u64 {
        write(
            &csv_dir,
            &format!("part-{index:04}.csv"),
            &csv(index * 5..index * 5 + 5),
        );
    }
    for index in 0..300u64 {
        let name = if index % 2 == 0 {
            format!("part-{index:04}.jsonl.gz")
        } else {
            format!("part-{index:04}.jsonl")
        };
        write(&gz, &name, &gzip(&json_lines(index * 5..index * 5 + 5)));
    }
    // And 1,000 mixed ones (JSON lines plain, gzip and zstd, CSV, Parquet)
    // in one prefix, read with `format = "auto"`.
    for index in 0..1000u64 {
        let (name, body) = mixed(index, index * 5..index * 5 + 5);
        write(&mix, &name, &body);
    }
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let csv_extra = "format = \"csv\"\nbatch_size = 7";
    for (key, dir, extra) in [
        ("jsonl", &jsonl, "batch_size = 13"),
        ("csv", &csv_dir, csv_extra),
        ("gz", &gz, "batch_size = 64"),
        ("mixed", &mix, "format = \"auto\"\nbatch_size = 64"),
    ] {
        runtime
            .add(connector(&source_config(key, key, &file_url(dir), extra)))
            .unwrap();
    }
    runtime.start_enabled().await;
    wait_for("every record of the three prefixes", LONG, || {
        iggy.message_count("objects", "jsonl") >= 2000
            && iggy.message_count("objects", "csv") >= 1500
            && iggy.message_count("objects", "gz") >= 1500
            && iggy.message_count("objects", "mixed") >= 5000
    })
    .await;
    runtime.shutdown().await;
    for (topic, count) in [
        ("jsonl", 2000u64),
        ("csv", 1500),
        ("gz", 1500),
        ("mixed", 5000),
    ] {
        let messages = iggy.messages("objects", topic);
        let in_order: Vec<u64> = messages.iter().map(seq_of).collect();
        assert_eq!(
            in_order,
            (0..count).collect::<Vec<_>>(),
            "{topic}: every record once, in key order"
        );
    }
    let first = &iggy.messages("objects", "csv")[6];
    assert!(
        header(first, "object_key")
            .unwrap()
            .ends_with("csv/part-0001.csv"),
        "{:?}",
        first.user_headers_map()
    );
    assert_eq!(header(first, "object_record").as_deref(), Some("1"));
    assert!(header(first, "object_etag").is_some());
    let row: serde_json::Value =
        serde_json::from_slice(&iggy.messages("objects", "mixed")[21].payload).unwrap();
    assert_eq!(
        row,
        serde_json::json!({"seq": 21, "pad": "row 21"}),
        "a Parquet row as a JSON object"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_object_in_the_middle_of_a_prefix_is_skipped_and_the_rest_read() {
    let iggy = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    for index in 0..5u64 {
        let mut body = gzip(&json_lines(index * 10..index * 10 + 10));
        if index == 2 {
            let middle = body.len() / 2;
            body[middle] ^= 0xff;
            body.truncate(body.len() - 4);
        }
        write(dir.path(), &format!("part-{index}.jsonl.gz"), &body);
    }
    // And one that is not JSON at all.
    write(dir.path(), "part-3b.jsonl", b"{\"seq\": 1000}\nnot json\n");
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&source_config(
            "corrupt",
            "corrupt",
            &file_url(dir.path()),
            "",
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the objects after the corrupt ones", LONG, || {
        iggy.message_count("objects", "corrupt") >= 40
    })
    .await;
    runtime.shutdown().await;
    let seen = seqs(&iggy.messages("objects", "corrupt"));
    let expected: Vec<u64> = (0..20).chain(30..50).collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), expected);
    assert!(seen.values().all(|times| *times == 1), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_objects_are_dead_lettered_with_their_key_and_the_rest_read() {
    let iggy = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    for index in 0..6u64 {
        let (name, mut body) = mixed(index, index * 10..index * 10 + 10);
        // A broken gzip stream and a truncated Parquet file.
        if index == 1 || index == 4 {
            body.truncate(body.len() / 2);
        }
        write(dir.path(), &name, &body);
    }
    write(dir.path(), "0002b.jsonl", b"{\"seq\": 1000}\nnot json\n");
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = "format = \"auto\"\non_error = \"dlq\"\nbatch_size = 4\n[dead_letter]\nstream = \"objects\"\ntopic = \"dead\"";
    runtime
        .add(connector(&source_config(
            "dlq",
            "dlq",
            &file_url(dir.path()),
            extra,
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the good objects and the dead letters", LONG, || {
        iggy.message_count("objects", "dlq") >= 40 && iggy.message_count("objects", "dead") >= 3
    })
    .await;
    runtime.shutdown().await;
    let seen = seqs(&iggy.messages("objects", "dlq"));
    let expected: Vec<u64> = (0..10).chain(20..40).chain(50..60).collect();
    assert_eq!(seen.keys().copied().collect::<Vec<_>>(), expected);
    assert!(seen.values().all(|times| *times == 1), "{seen:?}");
    let dead = iggy.messages("objects", "dead");
    let keys: Vec<String> = dead
        .iter()
        .map(|message| header(message, "object_key").unwrap())
        .map(|key| key.rsplit('/').next().unwrap().to_owned())
        .collect();
    assert_eq!(keys, ["0001.jsonl.gz", "0002b.jsonl", "0004.parquet"]);
    for message in &dead {
        let error = header(message, "iggy_connect_error").unwrap();
        assert!(
            error.contains(&header(message, "object_key").unwrap()),
            "{error}"
        );
        assert_eq!(
            header(message, "iggy_connect_error_class").as_deref(),
            Some("decode")
        );
        let payload: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        assert!(
            payload["reason"]
                .as_str()
                .is_some_and(|reason| !reason.is_empty()),
            "{payload}"
        );
    }
    assert!(
        header(&dead[2], "iggy_connect_error")
            .unwrap()
            .contains("Parquet"),
        "{:?}",
        header(&dead[2], "iggy_connect_error")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_reads_only_objects_added_since_and_never_a_finished_one_again() {
    let iggy = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    for index in 0..3u64 {
        write(
            dir.path(),
            &format!("a-{index}.jsonl"),
            &json_lines(index * 10..index * 10 + 10),
        );
    }
    let state = tempfile::tempdir().unwrap();
    let config = source_config("again", "again", &file_url(dir.path()), "batch_size = 4");
    let first = runtime(&iggy, state.path());
    first.add(connector(&config)).unwrap();
    first.start_enabled().await;
    wait_for("the first objects", LONG, || {
        iggy.message_count("objects", "again") >= 30
    })
    .await;
    first.shutdown().await;
    // A key above the watermark and one below it (not read: see doc.md).
    write(dir.path(), "b-0.jsonl", &json_lines(30..40));
    write(dir.path(), "0-late.jsonl", &json_lines(900..910));
    let second = runtime(&iggy, state.path());
    second.add(connector(&config)).unwrap();
    second.start_enabled().await;
    wait_for("the new object", LONG, || {
        iggy.message_count("objects", "again") >= 40
    })
    .await;
    second.shutdown().await;
    let seen = seqs(&iggy.messages("objects", "again"));
    assert_eq!(
        seen.keys().copied().collect::<Vec<_>>(),
        (0..40).collect::<Vec<_>>()
    );
    assert!(seen.values().all(|times| *times == 1), "{seen:?}");
}

const CRASH_OBJECTS: u64 = 10;
const CRASH_LINES: u64 = 5_000;
const CRASH_BATCH: usize = 50;

/// The bodies of the crash tests: `CRASH_OBJECTS` big mixed objects (JSON
/// lines plain, gzip and zstd, CSV, Parquet) of `CRASH_LINES` records.
fn crash_objects() -> Vec<(String, Vec<u8>)> {
    (0..CRASH_OBJECTS)
        .map(|index| mixed(index, index * CRASH_LINES..(index + 1) * CRASH_LINES))
        .collect()
}

/// Runs the binary on `url` (`format = "auto"`, `extra` after it), kills
/// it with SIGKILL twice while it produces, lets it finish, and checks
/// nothing was lost and at most the batches in flight came again.
async fn kill_9_twice_mid_object(iggy: &IggyTestServer, topic: &str, url: &str, extra: &str) {
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    let extra = format!("format = \"auto\"\nbatch_size = {CRASH_BATCH}\n{extra}");
    workspace.add_connector("source.toml", &source_config(topic, topic, url, &extra));
    let running = workspace.run();
    let running = workspace
        .kill_while_progressing(running, iggy, ("objects", topic), 2)
        .await;
    let total = CRASH_OBJECTS * CRASH_LINES;
    wait_for("every record after the restarts", LONG, || {
        iggy.message_count("objects", topic) >= total
            && covers(&seqs(&iggy.messages("objects", topic)), 0..total)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    let seen = seqs(&iggy.messages("objects", topic));
    assert!(covers(&seen, 0..total), "records lost");
    let duplicates: usize = seen.values().map(|times| times - 1).sum();
    // At most the batches in flight at each kill (16 of CRASH_BATCH) come again.
    println!("object_store crash ({topic}): records={total} duplicates={duplicates}");
    assert!(
        duplicates <= 2 * 16 * CRASH_BATCH,
        "{duplicates} repeated: more than the batches in flight at the kills"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_object_resumes_after_the_last_committed_record() {
    let iggy = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    for (name, body) in crash_objects() {
        write(dir.path(), &format!("big-{name}"), &body);
    }
    kill_9_twice_mid_object(&iggy, "crash", &file_url(dir.path()), "").await;
}

/// Puts every `(key, body)` under `prefix/`, eight at a time.
async fn put_all(
    store: &dyn object_store::ObjectStore,
    prefix: &str,
    objects: Vec<(String, Vec<u8>)>,
) {
    use futures::StreamExt;
    use object_store::{ObjectStoreExt, PutPayload};
    futures::stream::iter(objects)
        .map(|(key, body)| async move {
            store
                .put(
                    &format!("{prefix}/{key}").as_str().into(),
                    PutPayload::from(body),
                )
                .await
                .unwrap()
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_object_in_moto_resumes_after_the_last_committed_record() {
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    let store = s3_store(&s3, "crash").await;
    put_all(&store, "in", crash_objects()).await;
    let extra = format!(
        "region = \"us-east-1\"\nendpoint = \"{}\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"",
        s3.endpoint()
    );
    kill_9_twice_mid_object(&iggy, "moto_crash", "s3://crash/in", &extra).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_object_in_azurite_resumes_after_the_last_committed_record() {
    let (azurite, iggy) = (Azurite::start().await, IggyTestServer::start());
    azurite.create_container("crash");
    let store = azurite_store(&azurite, "crash");
    put_all(&store, "in", crash_objects()).await;
    kill_9_twice_mid_object(
        &iggy,
        "azure_crash",
        "az://crash/in",
        &azurite_options(&azurite),
    )
    .await;
}

fn azurite_store(azurite: &Azurite, container: &str) -> object_store::azure::MicrosoftAzure {
    let mut builder =
        object_store::azure::MicrosoftAzureBuilder::new().with_container_name(container);
    for (key, value) in azurite.options() {
        builder = builder.with_config(key.parse().unwrap(), value);
    }
    builder.build().unwrap()
}

/// The `[plugin_config.options]` table for Azurite (last in a config).
fn azurite_options(azurite: &Azurite) -> String {
    let options: String = azurite
        .options()
        .iter()
        .map(|(key, value)| format!("{key} = \"{value}\"\n"))
        .collect();
    format!("[plugin_config.options]\n{options}")
}

async fn s3_store(s3: &S3Server, bucket: &str) -> object_store::aws::AmazonS3 {
    s3.create_bucket(bucket).await;
    object_store::aws::AmazonS3Builder::new()
        .with_bucket_name(bucket)
        .with_region("us-east-1")
        .with_endpoint(s3.endpoint())
        .with_allow_http(true)
        .with_virtual_hosted_style_request(false)
        .with_access_key_id("test")
        .with_secret_access_key("test")
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_s3_objects_in_moto_land_once_and_are_moved_to_the_done_prefix_after_commit() {
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    let store = s3_store(&s3, "landing").await;
    // JSON lines (plain, gzip, zstd), CSV and Parquet, 200 of each.
    let objects = (0..1000u64).map(|index| mixed(index, index * 2..index * 2 + 2));
    put_all(&store, "in", objects.collect()).await;
    store
        .put(
            &"in/skip-me.txt".into(),
            PutPayload::from_static(b"not matched"),
        )
        .await
        .unwrap();
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!(
        "glob = \"[0-9]*\"\nformat = \"auto\"\nregion = \"us-east-1\"\nendpoint = \"{}\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\nafter_commit = \"move\"\ndone_prefix = \"done\"\nbatch_size = 64",
        s3.endpoint()
    );
    runtime
        .add(connector(&source_config(
            "moto",
            "moto",
            "s3://landing/in",
            &extra,
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every record from moto", LONG, || {
        iggy.message_count("objects", "moto") >= 2000
    })
    .await;
    let listed = async |prefix: &str| -> Vec<String> {
        use futures::TryStreamExt;
        let listed: Vec<_> = store
            .list(Some(&prefix.into()))
            .try_collect()
            .await
            .unwrap();
        listed
            .into_iter()
            .map(|meta| meta.location.to_string())
            .collect()
    };
    crate::support::wait::eventually("every object moved to done/", LONG, async || {
        listed("done/").await.len() == 1000
    })
    .await;
    runtime.shutdown().await;
    let in_order: Vec<u64> = iggy
        .messages("objects", "moto")
        .iter()
        .map(seq_of)
        .collect();
    assert_eq!(in_order, (0..2000).collect::<Vec<_>>());
    assert_eq!(listed("in/").await, ["in/skip-me.txt"]);
    assert!(
        listed("done/")
            .await
            .contains(&"done/0000.jsonl".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_blobs_in_azurite_land_once_in_key_order() {
    let (azurite, iggy) = (Azurite::start().await, IggyTestServer::start());
    azurite.create_container("landing");
    let store = azurite_store(&azurite, "landing");
    // JSON lines (plain, gzip, zstd), CSV and Parquet, 200 of each.
    let objects = (0..1000u64).map(|index| mixed(index, index * 2..index * 2 + 2));
    put_all(&store, "in", objects.collect()).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let extra = format!(
        "format = \"auto\"\nbatch_size = 50\n{}",
        azurite_options(&azurite)
    );
    runtime
        .add(connector(&source_config(
            "azure",
            "azure",
            "az://landing/in",
            &extra,
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("every record from azurite", LONG, || {
        iggy.message_count("objects", "azure") >= 2000
    })
    .await;
    runtime.shutdown().await;
    let messages = iggy.messages("objects", "azure");
    let in_order: Vec<u64> = messages.iter().map(seq_of).collect();
    assert_eq!(in_order, (0..2000).collect::<Vec<_>>());
    assert_eq!(
        header(&messages[3], "object_key").as_deref(),
        Some("in/0001.jsonl.gz")
    );
}
