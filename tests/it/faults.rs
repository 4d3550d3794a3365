//! The fault suite: the real `iggy-connect` binary against the in-process Iggy
//! test server, with faults injected in the broker, the state directory, the
//! sink and the process itself. Every scenario checks exact accounting by the
//! random source's `seq` numbers and prints one summary line
//! (`scenario: NAME produced=N delivered=N lost=0 duplicates=D ...`);
//! `scripts/fault-suite` runs the suite and shows the lines.
#![cfg(all(feature = "random-source", feature = "faulty-sink"))]

use std::time::{Duration, Instant};

use iggy_connect::connectors::decode_state;
use iggy_connect::connectors::random::source::RandomState;
use iggy_connect::state::{FileStateStore, StateStore};
use serde_json::Value;

use crate::support;
use crate::support::accounting::{
    Seen, duplicates, missing, report, report_set_aside, seqs_in_file, seqs_in_topic,
};
use crate::support::binary::{Running, Workspace};
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::{Check, eventually, try_eventually, wait_for};

const STREAM: &str = "faults";
const TOPIC: &str = "events";
const LONG: Duration = Duration::from_secs(60);
const SINK_GROUP: &str = "iggy-connect-sink-out";

fn random_source(max_count: Option<u64>, extra: &str) -> String {
    let max_count = max_count
        .map(|count| format!("max_count = {count}"))
        .unwrap_or_default();
    format!(
        r#"
type = "source"
key = "rnd"
enabled = true
version = 0
name = "random"
path = "random"
{extra}
[[streams]]
stream = "{STREAM}"
topic = "{TOPIC}"
schema = "json"
[plugin_config]
interval = "2ms"
messages_range = [20, 50]
payload_size = 64
{max_count}
"#
    )
}

fn faulty_sink(key: &str, workspace: &Workspace, extra: &str, plugin_extra: &str) -> String {
    format!(
        r#"
type = "sink"
key = "{key}"
enabled = true
version = 0
name = "faulty"
path = "faulty"
{extra}
[[streams]]
stream = "{STREAM}"
topics = ["{TOPIC}"]
schema = "json"
batch_length = 100
poll_interval = "2ms"
[plugin_config]
output = "{output}"
fail_while_exists = "{marker}"
{plugin_extra}
"#,
        output = workspace.path(&format!("{key}.jsonl")).display(),
        marker = workspace.path(&format!("{key}.fail")).display(),
    )
}

/// The random source's committed count, as its state file says.
async fn committed(workspace: &Workspace) -> Option<u64> {
    committed_in(workspace.path("state")).await
}

/// The random source's committed count in the state directory `dir`.
async fn committed_in(dir: std::path::PathBuf) -> Option<u64> {
    let store = FileStateStore::new(dir).ok()?;
    let stored = store.load("rnd").await.ok()??;
    Some(
        decode_state::<RandomState>(&stored.data)
            .ok()?
            .messages_produced,
    )
}

fn topic(server: &IggyTestServer) -> Seen {
    seqs_in_topic(server, STREAM, TOPIC)
}

fn sink_output(workspace: &Workspace, key: &str) -> Seen {
    seqs_in_file(&workspace.path(&format!("{key}.jsonl")))
}

/// The state never covers a record that is not in the topic.
async fn assert_state_not_ahead(workspace: &Workspace, server: &IggyTestServer) {
    // State first: both only grow, so the topic read after it can only be larger.
    let state = committed(workspace).await.unwrap_or(0);
    let in_topic = topic(server);
    let missing = missing(&in_topic, state);
    assert!(
        missing.is_empty(),
        "the state covers {state} records but the topic lacks {missing:?}"
    );
}

async fn api_get(workspace: &Workspace, start: usize, path: &str) -> (u16, Value) {
    wait_for("the API to listen", LONG, || {
        workspace.api_urls().len() >= start
    })
    .await;
    let url = format!("{}{path}", workspace.api_urls()[start - 1]);
    let response = reqwest::get(&url).await.expect("the API answers");
    let status = response.status().as_u16();
    let text = response.text().await.expect("a body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

async fn metric(workspace: &Workspace, start: usize, name: &str, labels: &[(&str, &str)]) -> f64 {
    let (_, body) = api_get(workspace, start, "/metrics").await;
    let text = body.as_str().expect("metrics text").to_owned();
    support::prometheus::parse_metrics(&text)
        .into_iter()
        .filter(|(metric, metric_labels, _)| {
            metric == name
                && labels
                    .iter()
                    .all(|(key, value)| metric_labels.get(*key).map(String::as_str) == Some(*value))
        })
        .map(|(_, _, value)| value)
        .sum()
}

async fn nacks(workspace: &Workspace) -> f64 {
    metric(
        workspace,
        1,
        "iggy_connector_nacks_total",
        &[("connector_key", "rnd")],
    )
    .await
}

/// The suite's usual pipeline: a random source of `max_count` records into the
/// faulty sink `out`, started, and returned once `flowing` records are in the
/// topic.
async fn run_random_into_out(
    server: &IggyTestServer,
    workspace: &Workspace,
    max_count: u64,
    source_extra: &str,
    flowing: u64,
) -> Running {
    workspace.add_connector("rnd.toml", &random_source(Some(max_count), source_extra));
    workspace.add_connector("out.toml", &faulty_sink("out", workspace, "", ""));
    let running = workspace.run();
    wait_for("records to flow", LONG, || {
        server.message_count(STREAM, TOPIC) >= flowing
    })
    .await;
    running
}

fn stop(running: Running, workspace: &Workspace) {
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_sends_for_a_while_is_retried_within_the_nack_limit_and_loses_nothing() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    let running = run_random_into_out(&server, &workspace, 3000, "", 500).await;
    let refusals_before = server.request_count(101);
    server.faults().refuse_sends(3);
    while server.request_count(101) < refusals_before + 4 {
        assert_state_not_ahead(&workspace, &server).await;
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    wait_for("all 3000 in the topic", LONG, || {
        topic(&server).len() == 3000
    })
    .await;
    wait_for("all 3000 at the sink", LONG, || {
        sink_output(&workspace, "out").len() == 3000
    })
    .await;
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("refused_sends_within_limit", 3000, &in_topic, &at_sink);
    assert!(missing(&at_sink, 3000).is_empty());
    assert_eq!(
        duplicates(&in_topic),
        0,
        "a refused send stores nothing and is sent once more"
    );
    assert_eq!(committed(&workspace).await, Some(3000));
    assert!(
        workspace.stderr().contains("batch NACKed"),
        "the NACKs are logged"
    );
}

/// Long enough that the source is still producing when the broker starts
/// refusing (a short run can complete first).
const PAST_LIMIT_RUN: u64 = 10_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_refusing_sends_past_the_limit_stops_the_source_visibly_and_a_restart_loses_nothing()
 {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let running = run_random_into_out(
        &server,
        &workspace,
        PAST_LIMIT_RUN,
        "max_consecutive_nacks = 3",
        300,
    )
    .await;
    server.faults().refuse_sends_until_cleared();
    let source = try_eventually("the source to stop", LONG, || async {
        let (_, source) = api_get(&workspace, 1, "/sources/rnd").await;
        if source["status"] == "error" {
            Check::Ready(source)
        } else {
            Check::Pending(source.to_string())
        }
    })
    .await
    .unwrap_or_else(|message| panic!("{message}"));
    assert_eq!(source["stop_reason"], "nack_limit", "{source}");
    let (health, body) = api_get(&workspace, 1, "/health").await;
    assert_eq!(health, 503, "{body}");
    assert!(body.to_string().contains("nack_limit"), "{body}");
    let stops = metric(
        &workspace,
        1,
        "iggy_connector_stops_total",
        &[("connector_key", "rnd"), ("reason", "nack_limit")],
    )
    .await;
    assert_eq!(stops, 1.0);
    assert_state_not_ahead(&workspace, &server).await;
    stop(running, &workspace);

    // The broker is back; a restart resumes from the committed state.
    server.faults().clear();
    let running = workspace.run();
    wait_for("all records in the topic", LONG, || {
        topic(&server).len() as u64 == PAST_LIMIT_RUN
    })
    .await;
    wait_for("all records at the sink", LONG, || {
        sink_output(&workspace, "out").len() as u64 == PAST_LIMIT_RUN
    })
    .await;
    let (health, body) = api_get(&workspace, 2, "/health").await;
    assert!(health == 200, "{body}");
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report(
        "refused_sends_past_limit",
        PAST_LIMIT_RUN,
        &in_topic,
        &at_sink,
    );
    assert_eq!(duplicates(&in_topic), 0);
    assert!(missing(&at_sink, PAST_LIMIT_RUN).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_state_save_keeps_the_batch_unacknowledged_and_the_pipeline_resumes_after() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let running =
        // One batch in flight: the claims below are about that batch, retried
        // in place.
        run_random_into_out(&server, &workspace, 2000, "max_consecutive_nacks = 0\nmax_in_flight = 1", 300).await;
    // A directory where the state file is: every save fails, for root too.
    // The file moves aside first (a save that lands in between creates it
    // again: move that one aside too), so the state it held can be read.
    let (state_file, aside) = (
        workspace.path("state/source_rnd.state"),
        workspace.path("aside"),
    );
    std::fs::create_dir(&aside).unwrap();
    loop {
        match std::fs::rename(&state_file, aside.join("source_rnd.state")) {
            Ok(()) => {}
            Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::NotFound, "{error}"),
        }
        match std::fs::create_dir(&state_file) {
            Ok(()) => break,
            Err(error) => {
                assert_eq!(error.kind(), std::io::ErrorKind::AlreadyExists, "{error}");
                std::thread::yield_now();
            }
        }
    }
    eventually("a failed save", LONG, async || {
        nacks(&workspace).await >= 2.0
    })
    .await;
    let state_before = committed_in(aside.clone()).await.unwrap_or(0);
    let topic_before = topic(&server);
    let sent_unsaved = topic_before.len() as u64;
    assert!(
        sent_unsaved > state_before,
        "the batch whose save fails is in the topic but not covered by the state"
    );
    while nacks(&workspace).await < 6.0 {
        assert_eq!(
            topic(&server),
            topic_before,
            "something was polled past the unsaved batch"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    std::fs::remove_dir(&state_file).unwrap();
    wait_for("all 2000 in the topic", LONG, || {
        topic(&server).len() == 2000
    })
    .await;
    wait_for("all 2000 at the sink", LONG, || {
        sink_output(&workspace, "out").len() == 2000
    })
    .await;
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("state_save_fails", 2000, &in_topic, &at_sink);
    assert_eq!(
        duplicates(&in_topic),
        0,
        "the sent batch is not sent again when only its save is retried"
    );
    assert_eq!(committed(&workspace).await, Some(2000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_at_random_points_loses_nothing_on_either_side() {
    let kills: usize = std::env::var("IGGY_CONNECT_SOAK_KILLS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(20);
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector("rnd.toml", &random_source(None, ""));
    workspace.add_connector(
        "out.toml",
        &faulty_sink("out", &workspace, "", "write_delay = \"5ms\""),
    );
    for _ in 0..kills {
        let running = workspace.run();
        let before = server.message_count(STREAM, TOPIC);
        wait_for("the restarted binary to make progress", LONG, || {
            server.message_count(STREAM, TOPIC) > before
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(20..300))).await;
        running.kill();
    }
    // A last, clean run: the source produces 500 more and finishes, and the
    // sink catches up with everything in the topic.
    let finish_at = committed(&workspace).await.unwrap_or(0) + 500;
    workspace.add_connector("rnd.toml", &random_source(Some(finish_at), ""));
    let running = workspace.run();
    wait_for("the source to finish", LONG, || {
        topic(&server).len() as u64 >= finish_at
    })
    .await;
    wait_for("the sink to catch up", LONG, || {
        let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
        in_topic.keys().all(|seq| at_sink.contains_key(seq))
    })
    .await;
    stop(running, &workspace);

    let produced = committed(&workspace).await.expect("a state");
    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sigkill_loop", produced, &in_topic, &at_sink);
    assert!(
        missing(&in_topic, produced).is_empty(),
        "records the state covers are missing from the topic"
    );
    let unsunk: Vec<u64> = in_topic
        .keys()
        .filter(|seq| !at_sink.contains_key(seq))
        .copied()
        .collect();
    assert!(
        unsunk.is_empty(),
        "records in the topic never reached the sink: {unsunk:?}"
    );
    // At most max_in_flight source batches (50 each) and one sink batch (100)
    // again per kill.
    let in_flight = iggy_connect::config::connector::DEFAULT_MAX_IN_FLIGHT as usize;
    assert!(
        duplicates(&in_topic) <= kills * 50 * in_flight,
        "{} topic duplicates",
        duplicates(&in_topic)
    );
    assert!(
        duplicates(&at_sink) <= kills * 100 + duplicates(&in_topic),
        "{} sink duplicates",
        duplicates(&at_sink)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_failing_for_a_while_keeps_its_offsets_then_writes_everything() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    workspace.add_connector("rnd.toml", &random_source(Some(1000), ""));
    workspace.add_connector("out.toml", &faulty_sink("out", &workspace, "", ""));
    std::fs::write(workspace.path("out.fail"), b"").unwrap();
    let running = workspace.run();

    wait_for("all 1000 in the topic", LONG, || {
        topic(&server).len() == 1000
    })
    .await;
    eventually("the sink to retry", LONG, async || {
        let labels = [("connector_key", "out")];
        metric(&workspace, 1, "iggy_connector_retries_total", &labels).await >= 3.0
    })
    .await;
    assert_eq!(
        server.stored_offset(STREAM, TOPIC, SINK_GROUP, 0),
        None,
        "offsets moved while writes failed"
    );
    assert!(sink_output(&workspace, "out").is_empty());
    std::fs::remove_file(workspace.path("out.fail")).unwrap();
    wait_for("everything written", LONG, || {
        sink_output(&workspace, "out").len() == 1000
    })
    .await;
    wait_for("the offset to cover it", LONG, || {
        server.stored_offset(STREAM, TOPIC, SINK_GROUP, 0) == Some(999)
    })
    .await;
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sink_transient_failures", 1000, &in_topic, &at_sink);
    assert_eq!(duplicates(&at_sink), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_sink_refuses_for_good_is_handled_by_on_error_stop_skip_and_dlq() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    workspace.add_connector("rnd.toml", &random_source(Some(500), ""));
    let poison = r#"reject_containing = "\"seq\":13,""#;
    workspace.add_connector(
        "stop.toml",
        &faulty_sink("stop", &workspace, r#"on_error = "stop""#, poison),
    );
    workspace.add_connector(
        "skip.toml",
        &faulty_sink("skip", &workspace, r#"on_error = "skip""#, poison),
    );
    let dead_letter = "on_error = \"dlq\"\n[dead_letter]\nstream = \"faults\"\ntopic = \"dead\"\n";
    workspace.add_connector(
        "dlq.toml",
        &faulty_sink("dlq", &workspace, dead_letter, poison),
    );
    let running = workspace.run();

    wait_for("all 500 in the topic", LONG, || topic(&server).len() == 500).await;
    let expected: Seen = (0..500)
        .filter(|seq| *seq != 13)
        .map(|seq| (seq, 1))
        .collect();
    wait_for("skip to write all but seq 13", LONG, || {
        sink_output(&workspace, "skip") == expected
    })
    .await;
    wait_for("dlq to write all but seq 13", LONG, || {
        sink_output(&workspace, "dlq") == expected
    })
    .await;
    wait_for("seq 13 in the dead-letter topic", LONG, || {
        server.message_count(STREAM, "dead") == 1
    })
    .await;
    let dead = &server.messages(STREAM, "dead")[0];
    let headers: std::collections::BTreeMap<String, String> = dead
        .user_headers_map()
        .into_iter()
        .map(|(key, value)| (key.to_string_value(), value.to_string_value()))
        .collect();
    assert_eq!(
        headers.get("iggy_connect_error_stage").map(String::as_str),
        Some("write")
    );
    assert!(
        headers
            .get("iggy_connect_error")
            .is_some_and(|error| error.contains("seq")),
        "{headers:?}"
    );
    assert_eq!(
        headers.get("iggy_connect_origin_topic").map(String::as_str),
        Some(TOPIC)
    );
    let dead_record: Value = serde_json::from_slice(&dead.payload).unwrap();
    assert_eq!(dead_record["seq"], 13);

    // Not stopped by the deadline: the asserts below say how it stands.
    let _ = try_eventually("the sink to stop", LONG, || async {
        let (_, sink) = api_get(&workspace, 1, "/sinks/stop").await;
        if sink["status"] == "error" {
            Check::Ready(())
        } else {
            Check::Pending(sink.to_string())
        }
    })
    .await;
    let (_, stopped) = api_get(&workspace, 1, "/sinks/stop").await;
    assert_eq!(stopped["status"], "error", "{stopped}");
    assert_eq!(stopped["stop_reason"], "rejected", "{stopped}");
    let written_by_stop = sink_output(&workspace, "stop");
    assert!(!written_by_stop.contains_key(&13));
    let offset_13 = server
        .messages(STREAM, TOPIC)
        .iter()
        .find(|message| serde_json::from_slice::<Value>(&message.payload).unwrap()["seq"] == 13)
        .map(|message| message.offset)
        .unwrap();
    let stored = server.stored_offset(STREAM, TOPIC, "iggy-connect-sink-stop", 0);
    assert!(
        stored.is_none_or(|offset| offset < offset_13),
        "the stopped sink committed past the refused message"
    );
    let skipped = metric(
        &workspace,
        1,
        "iggy_connector_messages_skipped_total",
        &[("connector_key", "skip")],
    )
    .await;
    assert_eq!(skipped, 1.0);
    let dead_lettered = metric(
        &workspace,
        1,
        "iggy_connector_messages_dead_lettered_total",
        &[("connector_key", "dlq")],
    )
    .await;
    assert_eq!(dead_lettered, 1.0);
    stop(running, &workspace);

    let in_topic = topic(&server);
    let set_aside: &[u64] = &[13];
    let skip_line = report_set_aside(
        "sink_rejects_one_message_skip",
        500,
        &in_topic,
        &sink_output(&workspace, "skip"),
        Some(("skipped", set_aside)),
    );
    let dlq_line = report_set_aside(
        "sink_rejects_one_message_dlq",
        500,
        &in_topic,
        &sink_output(&workspace, "dlq"),
        Some(("dead_lettered", set_aside)),
    );
    assert!(skip_line.contains(" lost=0 ") && dlq_line.contains(" lost=0 "));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_commits_the_batch_in_flight_and_a_restart_continues_without_gap_or_duplicate() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(
        &server.address().to_string(),
        "[engine]\nshutdown_timeout = \"5s\"\n",
    );
    workspace.add_connector("rnd.toml", &random_source(None, ""));
    workspace.add_connector("out.toml", &faulty_sink("out", &workspace, "", ""));
    for round in 1..=3 {
        let running = workspace.run();
        let target = server.message_count(STREAM, TOPIC) + 1000;
        wait_for("steady flow", LONG, || {
            server.message_count(STREAM, TOPIC) >= target
        })
        .await;
        let asked = Instant::now();
        running.terminate();
        let status = running.wait_exit(LONG);
        assert!(
            status.success(),
            "round {round}: exit {status:?}\n{}",
            workspace.stderr()
        );
        assert!(
            asked.elapsed() < Duration::from_secs(5) + Duration::from_secs(2),
            "took {:?} to stop",
            asked.elapsed()
        );
        let produced = committed(&workspace).await.expect("a state");
        let in_topic = topic(&server);
        assert_eq!(
            in_topic.len() as u64,
            produced,
            "round {round}: the topic holds records the state does not cover, or lacks some"
        );
    }
    // The sink stops with the process, behind the source; one more start with a
    // source that has nothing left to produce lets it catch up.
    let produced = committed(&workspace).await.unwrap();
    workspace.add_connector("rnd.toml", &random_source(Some(produced), ""));
    let starts = workspace.stderr().matches("iggy-connect starting").count();
    let running = workspace.run();
    // The sink may have caught up in the rounds above: wait for this run to
    // be up (its signal handlers are installed before it logs this line), or
    // the SIGTERM can come first and kill it.
    wait_for("the runtime to start", LONG, || {
        workspace.stderr().matches("iggy-connect starting").count() > starts
    })
    .await;
    wait_for("the sink to catch up", LONG, || {
        sink_output(&workspace, "out").len() as u64 >= produced
    })
    .await;
    stop(running, &workspace);
    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sigterm_steady_flow", produced, &in_topic, &at_sink);
    assert!(missing(&in_topic, produced).is_empty());
    assert_eq!(
        duplicates(&in_topic),
        0,
        "a graceful stop sends nothing twice"
    );
    assert!(
        missing(&at_sink, produced).is_empty(),
        "the sink lacks records"
    );
    assert_eq!(
        duplicates(&at_sink),
        0,
        "a graceful stop commits what the sink wrote"
    );
}

/// Rule K6 (docs/ARCHITECTURE.md): a sink that buffers (the faulty sink with
/// `buffer_messages`) has its offsets committed only as far as it made data
/// durable; killed with data buffered, a restart reads that data again and
/// nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_a_deferred_sink_with_data_buffered_loses_nothing_after_a_restart() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    workspace.add_connector("rnd.toml", &random_source(Some(1000), ""));
    let buffered = |extra: &str| {
        faulty_sink(
            "out",
            &workspace,
            "",
            &format!("buffer_messages = 300\n{extra}"),
        )
    };
    workspace.add_connector("out.toml", &buffered(""));
    let running = workspace.run();
    wait_for("all 1000 in the topic", LONG, || {
        topic(&server).len() == 1000
    })
    .await;
    eventually("the sink to have accepted all 1000", LONG, async || {
        let labels = [("connector_key", "out")];
        metric(
            &workspace,
            1,
            "iggy_connector_messages_processed_total",
            &labels,
        )
        .await
            >= 1000.0
    })
    .await;
    wait_for("three files of 300 durable", LONG, || {
        sink_output(&workspace, "out").len() == 900
    })
    .await;
    wait_for("the offset to cover the durable files", LONG, || {
        server.stored_offset(STREAM, TOPIC, SINK_GROUP, 0) == Some(899)
    })
    .await;
    // The last 100 are only buffered: their offsets stay uncommitted.
    running.kill();
    assert_eq!(
        server.stored_offset(STREAM, TOPIC, SINK_GROUP, 0),
        Some(899)
    );
    assert_eq!(sink_output(&workspace, "out").len(), 900);

    workspace.add_connector("out.toml", &buffered("flush_interval = \"100ms\""));
    let running = workspace.run();
    wait_for("the buffered 100 read again and flushed", LONG, || {
        sink_output(&workspace, "out").len() >= 1000
    })
    .await;
    wait_for("the offset to cover everything", LONG, || {
        server.stored_offset(STREAM, TOPIC, SINK_GROUP, 0) == Some(999)
    })
    .await;
    stop(running, &workspace);
    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sigkill_deferred_sink", 1000, &in_topic, &at_sink);
    assert!(missing(&at_sink, 1000).is_empty(), "the sink lacks records");
    assert_eq!(duplicates(&at_sink), 0);
}

/// Rule O1: the sink's backend is down when the runtime starts. The sink
/// stays `starting` (with the error and the attempt count in the API and
/// `/health`) while its opens are retried, then writes everything with no
/// restart and no API call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_whose_backend_is_down_at_start_is_opened_once_it_is_up_and_loses_nothing() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let marker = workspace.path("out.down");
    std::fs::write(&marker, b"").unwrap();
    workspace.add_connector("rnd.toml", &random_source(Some(1000), ""));
    let plugin_extra = format!("down_while_exists = \"{}\"", marker.display());
    workspace.add_connector(
        "out.toml",
        &faulty_sink("out", &workspace, "", &plugin_extra),
    );
    let running = workspace.run();

    eventually("the sink to retry its open", LONG, async || {
        let (_, sink) = api_get(&workspace, 1, "/sinks/out").await;
        sink["status"] == "starting" && sink["open_attempts"].as_u64() >= Some(2)
    })
    .await;
    let (code, health) = api_get(&workspace, 1, "/health").await;
    let reported = health["connectors"]
        .as_array()
        .and_then(|connectors| {
            connectors
                .iter()
                .find(|connector| connector["key"] == "out")
        })
        .cloned()
        .unwrap_or_default();
    assert_eq!(code, 503, "{health}");
    assert_eq!(reported["status"], "starting", "{health}");
    let error = reported["last_error"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(error.contains("connection refused"), "{health}");
    assert!(sink_output(&workspace, "out").is_empty());

    std::fs::remove_file(&marker).unwrap();
    wait_for("everything written", LONG, || {
        sink_output(&workspace, "out").len() == 1000
    })
    .await;
    let (_, sink) = api_get(&workspace, 1, "/sinks/out").await;
    assert_eq!(sink["status"], "running", "{sink}");
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sink_backend_down_at_start", 1000, &in_topic, &at_sink);
    assert!(missing(&at_sink, 1000).is_empty());
    assert_eq!(duplicates(&at_sink), 0);
}

/// Rule O2: the sink's connection drops mid-run and its backend stays down
/// for a while. The sink is closed and opened again from its committed
/// offsets once the backend is back, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_whose_connection_drops_mid_run_is_reopened_and_loses_nothing() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let marker = workspace.path("out.down");
    workspace.add_connector("rnd.toml", &random_source(Some(3000), ""));
    // A slow backend: the source is not done when the connection drops.
    let plugin_extra = format!(
        "down_while_exists = \"{}\"\nwrite_delay = \"50ms\"",
        marker.display()
    );
    workspace.add_connector(
        "out.toml",
        &faulty_sink("out", &workspace, "", &plugin_extra),
    );
    let running = workspace.run();

    wait_for("the sink to write", LONG, || {
        sink_output(&workspace, "out").len() >= 300
    })
    .await;
    std::fs::write(&marker, b"").unwrap();
    eventually("the sink to reopen and fail to open", LONG, async || {
        let labels = [("connector_key", "out")];
        metric(&workspace, 1, "iggy_connector_reopens_total", &labels).await >= 1.0
            && metric(&workspace, 1, "iggy_connector_open_retries_total", &labels).await >= 2.0
    })
    .await;
    std::fs::remove_file(&marker).unwrap();
    wait_for("everything written", LONG, || {
        sink_output(&workspace, "out").len() >= 3000
    })
    .await;
    stop(running, &workspace);

    let (in_topic, at_sink) = (topic(&server), sink_output(&workspace, "out"));
    report("sink_connection_dropped_mid_run", 3000, &in_topic, &at_sink);
    assert!(missing(&at_sink, 3000).is_empty());
}
