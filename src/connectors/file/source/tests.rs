//! The tailer against real files in a temp directory: rotations by rename
//! and by copytruncate, restarts from the saved state, multi-line records,
//! `.gz` files and `read_from`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use serde_json::json;

use super::checkpoint::FileState;
use super::config::Settings;
use super::tailer::Tailer;
use crate::connectors::parse_plugin_config;
use crate::message::Payload;

fn settings(dir: &Path, extra: serde_json::Value) -> Arc<Settings> {
    let mut config = json!({
        "include": [format!("{}/app.log*", dir.display())],
        "poll_interval": "0s",
        "rotate_wait": "0s",
        "multiline_timeout": "0s",
        "fingerprint_bytes": 64,
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    Arc::new(Settings::from_config(&parse_plugin_config(&config).unwrap()).unwrap())
}

/// Reads until two reads in a row give nothing.
fn drain(tailer: &mut Tailer) -> Vec<String> {
    let mut lines = Vec::new();
    let mut empty = 0;
    while empty < 2 {
        let records = tailer.read_batch();
        if records.is_empty() {
            empty += 1;
        }
        for record in records {
            match record.payload {
                Payload::Text(text) => lines.push(text),
                other => panic!("expected text, found {other:?}"),
            }
        }
    }
    lines
}

fn append(path: &Path, lines: std::ops::Range<u32>) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    for line in lines {
        writeln!(file, "line {line:05} of the application log").unwrap();
    }
}

fn expected(lines: std::ops::Range<u32>) -> Vec<String> {
    lines
        .map(|line| format!("line {line:05} of the application log"))
        .collect()
}

/// Each line read, and how often.
fn counts(lines: &[String]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for line in lines {
        *counts.entry(line.clone()).or_default() += 1;
    }
    counts
}

fn assert_once_each(lines: &[String], range: std::ops::Range<u32>) {
    let counts = counts(lines);
    let twice: Vec<_> = counts.iter().filter(|(_, count)| **count > 1).collect();
    assert!(twice.is_empty(), "read more than once: {twice:?}");
    let missing: Vec<_> = expected(range)
        .into_iter()
        .filter(|line| !counts.contains_key(line))
        .collect();
    assert!(missing.is_empty(), "never read: {missing:?}");
    assert_eq!(lines.len(), counts.len());
}

#[test]
fn given_rotations_by_rename_and_copytruncate_and_a_restart_should_read_every_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    let settings = settings(dir.path(), json!({}));
    let mut tailer = Tailer::new(Arc::clone(&settings), None);
    let mut read = Vec::new();

    append(&log, 0..100);
    read.extend(drain(&mut tailer));
    assert_eq!(read, expected(0..100), "one file is read in order");

    // Rename: the writer finishes the old file, then starts a new one.
    append(&log, 100..150);
    std::fs::rename(&log, dir.path().join("app.log.1")).unwrap();
    append(&dir.path().join("app.log.1"), 150..160);
    append(&log, 160..200);
    read.extend(drain(&mut tailer));

    // Copytruncate, with lines the tailer has not read yet at the copy.
    append(&log, 200..250);
    read.extend(drain(&mut tailer));
    append(&log, 250..300);
    std::fs::copy(&log, dir.path().join("app.log.2")).unwrap();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&log)
        .unwrap()
        .set_len(0)
        .unwrap();
    append(&log, 300..320);
    read.extend(drain(&mut tailer));

    // A restart from the saved state, with a rename while it was down.
    let state = crate::connectors::encode_state(&tailer.state()).unwrap();
    drop(tailer);
    append(&log, 320..350);
    std::fs::rename(&log, dir.path().join("app.log.3")).unwrap();
    append(&log, 350..360);
    let restored = FileState::decode(&state).unwrap();
    let mut tailer = Tailer::new(settings, Some(restored));
    read.extend(drain(&mut tailer));

    assert_once_each(&read, 0..360);
}

#[test]
fn given_a_multiline_start_pattern_should_join_continuation_lines_and_checkpoint_the_pending_record()
 {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    let waiting = settings(
        dir.path(),
        json!({"multiline_start": "^ERROR|^INFO", "multiline_timeout": "1h"}),
    );
    let mut tailer = Tailer::new(waiting, None);
    std::fs::write(
        &log,
        "INFO start\nERROR boom\n  at a()\n  at b()\nINFO next\n  more\n",
    )
    .unwrap();
    let read = drain(&mut tailer);
    assert_eq!(read, ["INFO start", "ERROR boom\n  at a()\n  at b()"]);
    // The pending record is not in the checkpoint: a restart reads it again.
    let state = tailer.state();
    assert_eq!(
        state.files[0].offset,
        "INFO start\nERROR boom\n  at a()\n  at b()\n".len() as u64
    );
    let mut restarted = Tailer::new(
        settings(dir.path(), json!({"multiline_start": "^ERROR|^INFO"})),
        Some(state),
    );
    assert_eq!(drain(&mut restarted), ["INFO next\n  more"]);
}

#[test]
fn given_a_gzip_file_should_read_it_whole_once_across_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    for line in expected(0..50) {
        writeln!(encoder, "{line}").unwrap();
    }
    std::fs::write(dir.path().join("app.log.9.gz"), encoder.finish().unwrap()).unwrap();
    let settings = settings(dir.path(), json!({"batch_size": 20}));
    let mut tailer = Tailer::new(Arc::clone(&settings), None);
    let first = tailer.read_batch();
    assert_eq!(first.len(), 20);
    // A restart in the middle of the file goes on after the saved offset.
    let mut tailer = Tailer::new(Arc::clone(&settings), Some(tailer.state()));
    let rest = drain(&mut tailer);
    assert_eq!(rest, expected(20..50));
    let mut tailer = Tailer::new(settings, Some(tailer.state()));
    assert!(
        drain(&mut tailer).is_empty(),
        "a .gz file read whole is not read again"
    );
}

#[test]
fn given_read_from_end_should_skip_what_files_held_at_the_first_start_only() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    append(&log, 0..10);
    let settings = settings(dir.path(), json!({"read_from": "end"}));
    let mut tailer = Tailer::new(Arc::clone(&settings), None);
    assert!(drain(&mut tailer).is_empty());
    append(&log, 10..12);
    assert_eq!(drain(&mut tailer), expected(10..12));
    // A file that appears while the source runs is read from its beginning
    // (its first bytes differ: one starting like a followed file is a copy).
    append(&dir.path().join("app.log.new"), 100..103);
    assert_eq!(drain(&mut tailer), expected(100..103));
    // So is a file found at a start with state.
    let state = tailer.state();
    append(&dir.path().join("app.log.later"), 200..202);
    let mut tailer = Tailer::new(settings, Some(state));
    assert_eq!(drain(&mut tailer), expected(200..202));
}

#[test]
fn given_a_line_without_its_newline_should_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("app.log");
    std::fs::write(&log, "whole\npart").unwrap();
    let mut tailer = Tailer::new(settings(dir.path(), json!({})), None);
    assert_eq!(drain(&mut tailer), ["whole"]);
    let mut file = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    file.write_all(b"ial\n").unwrap();
    assert_eq!(drain(&mut tailer), ["partial"]);
}

#[test]
fn given_lines_longer_than_a_read_should_read_them_whole_and_cut_only_past_max_line_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let long = "a".repeat(150_000);
    let longer = "b".repeat(450_000);
    std::fs::write(
        dir.path().join("app.log"),
        format!("{long}\n{longer}\nend\n"),
    )
    .unwrap();
    let mut tailer = Tailer::new(
        settings(dir.path(), json!({"max_line_bytes": 200_000})),
        None,
    );
    let read = drain(&mut tailer);
    let lengths: Vec<usize> = read.iter().map(String::len).collect();
    assert_eq!(lengths, [150_000, 200_000, 200_000, 50_000, 3]);
}
