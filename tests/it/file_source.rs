//! The file source through the real binary into the in-process Iggy test
//! server: a log written while it is rotated by rename and by copytruncate,
//! and the binary stopped and started again (SIGTERM) or killed (SIGKILL).
//! Every line arrives; a clean restart repeats none, a kill at most the
//! batches that were in flight.
#![cfg(feature = "file-source")]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::time::Duration;

use crate::support::binary::{Running, Workspace};
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);
const LINES: u32 = 3000;
const BATCH: usize = 50;
const IN_FLIGHT: usize = 4;

fn line(number: u32) -> String {
    format!("{number:06} the application did something worth a line")
}

/// How many times each line is in the topic.
fn lines_in_topic(server: &IggyTestServer, stream: &str) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for message in server.messages(stream, "lines") {
        let text = String::from_utf8(message.payload.to_vec()).unwrap();
        *seen.entry(text).or_insert(0) += 1;
    }
    seen
}

fn append(path: &Path, lines: std::ops::Range<u32>) {
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .unwrap();
    let mut text = String::new();
    for number in lines {
        text.push_str(&line(number));
        text.push('\n');
    }
    file.write_all(text.as_bytes()).unwrap();
}

/// Writes `LINES` lines in small steps; rotates by rename at a third, by
/// copytruncate at two thirds, and at the half stops the binary (SIGTERM,
/// waiting for its exit) or kills it (SIGKILL: the first half written in
/// one burst, so it dies with batches in flight), and starts it again.
async fn write_rotate_and_restart(workspace: &Workspace, dir: &Path, kill: bool) -> Running {
    let log = dir.join("app.log");
    let mut running = workspace.run();
    for first in (0..LINES).step_by(25) {
        append(&log, first..first + 25);
        match first {
            1000 => std::fs::rename(&log, dir.join("app.log.1")).unwrap(),
            1500 if kill => {
                // The first half went in one burst: batches are in flight.
                tokio::time::sleep(Duration::from_millis(rand::random_range(20..80))).await;
                running.kill();
                running = workspace.run();
            }
            1500 => {
                running.terminate();
                let status = running.wait_exit(LONG);
                assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
                running = workspace.run();
            }
            2000 => {
                // copytruncate: the copy, then the file cut to nothing while
                // the writer keeps its handle (O_APPEND writes at the start).
                std::fs::copy(&log, dir.join("app.log.2")).unwrap();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&log)
                    .unwrap()
                    .set_len(0)
                    .unwrap();
            }
            _ => {}
        }
        if !(kill && first < 1500) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    running
}

async fn tail_through_rotations_and_a_restart(kill: bool) -> (usize, String) {
    let server = IggyTestServer::start();
    let dir = tempfile::tempdir().unwrap();
    let stream = format!("file_{}_{}", std::process::id(), u8::from(kill));
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "file.toml",
        &format!(
            "type = \"source\"\nkey = \"tail\"\nenabled = true\npath = \"file\"\n\
             max_in_flight = {IN_FLIGHT}\nmax_consecutive_nacks = 0\n\n\
             [[streams]]\nstream = \"{stream}\"\ntopic = \"lines\"\nschema = \"text\"\n\n\
             [plugin_config]\ninclude = [\"{dir}/app.log*\"]\npoll_interval = \"20ms\"\n\
             batch_size = {BATCH}\nrotate_wait = \"2s\"\n",
            dir = dir.path().display(),
        ),
    );
    let running = write_rotate_and_restart(&workspace, dir.path(), kill).await;
    wait_for("every line", LONG, || {
        lines_in_topic(&server, &stream).len() >= LINES as usize
    })
    .await;
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let seen = lines_in_topic(&server, &stream);
    let missing: Vec<u32> = (0..LINES)
        .filter(|number| !seen.contains_key(&line(*number)))
        .collect();
    assert!(missing.is_empty(), "lost lines: {missing:?}");
    assert_eq!(seen.len(), LINES as usize, "lines that were never written");
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    println!("scenario: file tail kill={kill} lines={LINES} duplicates={duplicates}");
    (duplicates, workspace.stderr())
}

/// The copytruncate happened while the source followed the file.
fn assert_copy_followed(log: &str) {
    assert!(
        log.contains("found a file truncated") && log.contains("follows a file at its new place"),
        "the copytruncate was not seen:\n{log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_rotated_by_rename_and_copytruncate_across_a_clean_restart_arrives_once_line_by_line()
{
    let (duplicates, log) = tail_through_rotations_and_a_restart(false).await;
    assert_eq!(duplicates, 0, "a clean restart sends nothing twice");
    assert_copy_followed(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_rotated_twice_with_the_binary_killed_in_between_loses_no_line() {
    let (duplicates, log) = tail_through_rotations_and_a_restart(true).await;
    assert!(
        duplicates <= IN_FLIGHT * BATCH,
        "{duplicates} duplicates after one kill, more than the {IN_FLIGHT} batches of {BATCH} in flight"
    );
    assert_copy_followed(&log);
}
