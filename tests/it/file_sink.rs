//! The file sink through the real binary, reading from the in-process Iggy
//! test server: killed (SIGKILL) in the middle of writing, again and again.
//! Whatever offset the group had committed when it died is in the files
//! (the sink reports a write durable only after fsync); a restart writes the
//! rest, so every message ends up in a file.
#![cfg(feature = "file-sink")]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use crate::support::binary::Workspace;
use crate::support::harness::{iggy_client, produce_ns};
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);
const MESSAGES: u64 = 20_000;
const KILLS: usize = 3;

/// How many times each offset is in the files. A file the sink was writing
/// when it was killed may end in a torn frame: what decodes before it counts.
fn offsets_in_files(dir: &Path) -> BTreeMap<u64, usize> {
    let mut seen = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let bytes = std::fs::read(&path).unwrap();
            let mut text = Vec::new();
            let _torn = zstd::stream::read::Decoder::new(&bytes[..])
                .unwrap()
                .read_to_end(&mut text);
            for line in text.split(|byte| *byte == b'\n') {
                if let Ok(value) = serde_json::from_slice::<serde_json::Value>(line) {
                    *seen.entry(value["offset"].as_u64().unwrap()).or_insert(0) += 1;
                }
            }
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_killed_mid_write_again_and_again_loses_no_committed_message() {
    let server = IggyTestServer::start();
    server.create_topic("shop", "orders", 1);
    produce_ns(
        &iggy_client(&server).await,
        "shop",
        "orders",
        0..u128::from(MESSAGES),
    )
    .await;
    let out = tempfile::tempdir().unwrap();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "out.toml",
        &format!(
            "type = \"sink\"\nkey = \"out\"\nenabled = true\npath = \"file\"\n\n\
             [[streams]]\nstream = \"shop\"\ntopics = [\"orders\"]\nschema = \"json\"\n\
             batch_length = 100\npoll_interval = \"5ms\"\n\n\
             [plugin_config]\npath = \"{dir}/{{stream}}/{{topic}}-{{partition}}-{{offset}}.jsonl.zst\"\n\
             compression = \"zstd\"\nmax_file_size = \"32KiB\"\n",
            dir = out.path().display(),
        ),
    );
    let group = "iggy-connect-sink-out";
    let committed = || server.stored_offset("shop", "orders", group, 0);
    let mut running = workspace.run();
    for kill in 0..KILLS {
        let before = committed();
        wait_for("the sink to commit more", LONG, || committed() > before).await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(10..100))).await;
        running.kill();
        let acknowledged = committed().unwrap_or(0);
        let seen = offsets_in_files(out.path());
        let lost: Vec<u64> = (0..=acknowledged)
            .filter(|offset| !seen.contains_key(offset))
            .collect();
        assert!(
            lost.is_empty(),
            "kill {kill}: committed up to {acknowledged} but the files lack {} offsets, first {:?}",
            lost.len(),
            lost.first()
        );
        running = workspace.run();
    }
    wait_for("every message committed", LONG, || {
        committed() == Some(MESSAGES - 1)
    })
    .await;
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let seen = offsets_in_files(out.path());
    let missing: Vec<u64> = (0..MESSAGES)
        .filter(|offset| !seen.contains_key(offset))
        .collect();
    assert!(missing.is_empty(), "lost offsets: {missing:?}");
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    println!("scenario: file sink kills={KILLS} messages={MESSAGES} duplicates={duplicates}");
}
