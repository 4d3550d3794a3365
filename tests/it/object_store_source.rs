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

fn write(dir: &Path, name: &str, body: &[u8]) {
    let path = dir.join(name);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, body).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_small_objects_of_json_lines_csv_and_gzip_land_once_in_key_order() {
    let iggy = IggyTestServer::start();
    let root = tempfile::tempdir().unwrap();
    let (jsonl, csv_dir, gz) = (
        root.path().join("jsonl"),
        root.path().join("csv"),
        root.path().join("gz"),
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
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let csv_extra = "format = \"csv\"\nbatch_size = 7";
    for (key, dir, extra) in [
        ("jsonl", &jsonl, "batch_size = 13"),
        ("csv", &csv_dir, csv_extra),
        ("gz", &gz, "batch_size = 64"),
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
    })
    .await;
    runtime.shutdown().await;
    for (topic, count) in [("jsonl", 2000u64), ("csv", 1500), ("gz", 1500)] {
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_object_resumes_after_the_last_committed_record() {
    const OBJECTS: u64 = 10;
    const LINES: u64 = 5_000;
    const BATCH: usize = 50;
    let iggy = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    for index in 0..OBJECTS {
        let body = json_lines(index * LINES..(index + 1) * LINES);
        let body = if index % 2 == 0 { gzip(&body) } else { body };
        write(dir.path(), &format!("big-{index:02}.jsonl"), &body);
    }
    let workspace = Workspace::new(&iggy.address().to_string(), "");
    workspace.add_connector(
        "source.toml",
        &source_config(
            "crash",
            "crash",
            &file_url(dir.path()),
            &format!("batch_size = {BATCH}"),
        ),
    );
    let running = workspace.run();
    let running = workspace
        .kill_while_progressing(running, &iggy, ("objects", "crash"), 2)
        .await;
    let total = OBJECTS * LINES;
    wait_for("every record after the restarts", LONG, || {
        iggy.message_count("objects", "crash") >= total
            && covers(&seqs(&iggy.messages("objects", "crash")), 0..total)
    })
    .await;
    running.terminate();
    running.wait_exit(LONG);
    let seen = seqs(&iggy.messages("objects", "crash"));
    assert!(covers(&seen, 0..total), "records lost");
    let duplicates: usize = seen.values().map(|times| times - 1).sum();
    // At most the batches in flight at each kill (16 of BATCH) come again.
    println!("object_store crash: records={total} duplicates={duplicates}");
    assert!(
        duplicates <= 2 * 16 * BATCH,
        "{duplicates} repeated: more than the batches in flight at the kills"
    );
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
    use futures::StreamExt;
    use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
    let (s3, iggy) = (S3Server::start().await, IggyTestServer::start());
    let store = s3_store(&s3, "landing").await;
    futures::stream::iter(0..1000u64)
        .map(|index| {
            let body = json_lines(index * 2..index * 2 + 2);
            let (key, body) = match index % 3 {
                0 => (format!("in/{index:04}.jsonl"), body),
                1 => (format!("in/{index:04}.jsonl.gz"), gzip(&body)),
                _ => (
                    format!("in/{index:04}.jsonl.zst"),
                    zstd::encode_all(&body[..], 1).unwrap(),
                ),
            };
            let store = &store;
            async move {
                store
                    .put(&key.as_str().into(), PutPayload::from(body))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
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
        "glob = \"*.jsonl*\"\nregion = \"us-east-1\"\nendpoint = \"{}\"\naccess_key_id = \"test\"\nsecret_access_key = \"test\"\nafter_commit = \"move\"\ndone_prefix = \"done\"\nbatch_size = 64",
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
    use futures::StreamExt;
    use object_store::{ObjectStoreExt, PutPayload};
    let (azurite, iggy) = (Azurite::start().await, IggyTestServer::start());
    azurite.create_container("landing");
    let mut builder =
        object_store::azure::MicrosoftAzureBuilder::new().with_container_name("landing");
    for (key, value) in azurite.options() {
        builder = builder.with_config(key.parse().unwrap(), value);
    }
    let store = builder.build().unwrap();
    futures::stream::iter(0..1000u64)
        .map(|index| {
            let body = json_lines(index * 2..index * 2 + 2);
            let (key, body) = match index % 3 {
                0 => (format!("in/{index:04}.jsonl"), body),
                1 => (format!("in/{index:04}.jsonl.gz"), gzip(&body)),
                _ => (
                    format!("in/{index:04}.jsonl.zst"),
                    zstd::encode_all(&body[..], 1).unwrap(),
                ),
            };
            let store = &store;
            async move {
                store
                    .put(&key.as_str().into(), PutPayload::from(body))
                    .await
                    .unwrap()
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    let options: String = azurite
        .options()
        .iter()
        .map(|(key, value)| format!("{key} = \"{value}\"\n"))
        .collect();
    let extra = format!("batch_size = 50\n[plugin_config.options]\n{options}");
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
