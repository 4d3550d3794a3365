//! `[state] storage = "http"` (upstream's HTTP state backend) against a real
//! HTTP state server written here (tests/support/state_server.rs) that keeps
//! the protocol: conditional writes (`If-None-Match: *`, `If-Match`), 412 on
//! a stale write, idempotent replays by `Idempotency-Key`. Each store here
//! stands for one runtime; the last test runs two real runtimes on one key.
#![cfg(feature = "http-state")]

use std::time::Duration;

use axum::http::Method;
use iggy_connect::config::state::StateConfig;
use iggy_connect::connectors::http::state::HttpStateStore;
use iggy_connect::state::{StateError, StateStore, StoredState};

use crate::support::binary::Workspace;
use crate::support::http_server::ScriptedServer;
use crate::support::iggy_server::IggyTestServer;
use crate::support::state_server::StateServer;
use crate::support::wait::wait_for;

fn config(url: &str, extra: &str) -> StateConfig {
    toml::from_str(&format!(
        "storage = \"http\"\n[http]\nurl = \"{url}\"\ntimeout = \"2s\"\n{extra}"
    ))
    .expect("upstream's [state] for the http store")
}

fn store(server: &StateServer) -> HttpStateStore {
    HttpStateStore::open(&config(&server.url(), "")).expect("the store opens")
}

fn state(data: &[u8]) -> StoredState {
    StoredState {
        connector: "random".into(),
        data: data.to_vec(),
    }
}

#[tokio::test]
async fn given_no_state_when_saving_should_create_it_then_replace_it_by_its_etag() {
    let server = StateServer::start().await;
    let runtime = store(&server);
    assert_eq!(runtime.load("src").await.unwrap(), None);
    runtime.save("src", &state(b"one")).await.unwrap();
    runtime.save("src", &state(b"two")).await.unwrap();
    let writes = server.writes("source_src");
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].if_none_match.as_deref(), Some("*"));
    assert_eq!(writes[0].if_match, None);
    assert_eq!(writes[1].if_match.as_deref(), Some("\"v1\""));
    assert_eq!(writes[0].method, Method::PUT);
    let keys: Vec<_> = writes
        .iter()
        .map(|seen| seen.idempotency_key.clone())
        .collect();
    assert!(keys.iter().all(Option::is_some), "{keys:?}");
    assert_ne!(keys[0], keys[1], "two saves, two idempotency keys");
    assert_eq!(writes[0].path, "/connectors/state/source_src");
    // Another runtime reads what this one saved.
    assert_eq!(
        store(&server).load("src").await.unwrap(),
        Some(state(b"two"))
    );
    assert!(
        runtime
            .location("src")
            .ends_with("/connectors/state/source_src")
    );
}

#[tokio::test]
async fn given_a_state_another_runtime_wrote_since_the_load_when_saving_should_refuse_for_good() {
    let server = StateServer::start().await;
    let (first, second) = (store(&server), store(&server));
    first.load("src").await.unwrap();
    first.save("src", &state(b"first")).await.unwrap();
    assert_eq!(second.load("src").await.unwrap(), Some(state(b"first")));
    first.save("src", &state(b"first again")).await.unwrap();
    // The second runtime read version 1; the server holds version 2.
    let refused = second.save("src", &state(b"stale")).await.unwrap_err();
    assert!(
        matches!(refused, StateError::Refused { .. }) && refused.is_permanent(),
        "{refused}"
    );
    assert!(refused.to_string().contains("412"), "{refused}");
    // Latched: no request for the next save of that key.
    let writes = server.writes("source_src").len();
    assert!(second.save("src", &state(b"stale")).await.is_err());
    assert_eq!(server.writes("source_src").len(), writes);
    assert_eq!(
        first.load("src").await.unwrap(),
        Some(state(b"first again"))
    );
    // A load reads the new version and lifts the latch.
    second.load("src").await.unwrap();
    second.save("src", &state(b"taken over")).await.unwrap();
}

#[tokio::test]
async fn given_a_save_whose_answer_was_lost_when_saved_again_should_send_the_same_idempotency_key()
{
    let server = StateServer::start().await;
    let runtime = store(&server);
    runtime.load("src").await.unwrap();
    server.lose_answers(1);
    let failed = runtime.save("src", &state(b"one")).await.unwrap_err();
    assert!(
        matches!(failed, StateError::Unreachable { .. }) && !failed.is_permanent(),
        "{failed}"
    );
    assert!(failed.to_string().contains("503"), "{failed}");
    // The engine retries the same save: the server stored it already, and
    // answers the retry as it answered the first (a new key would get a 412).
    runtime.save("src", &state(b"one")).await.unwrap();
    let writes = server.writes("source_src");
    assert_eq!(writes.len(), 2, "{writes:?}");
    assert_eq!(writes[0].idempotency_key, writes[1].idempotency_key);
    assert_eq!(writes[1].if_none_match.as_deref(), Some("*"));
    assert_eq!(server.stored("source_src").unwrap().0, 1);
    runtime.save("src", &state(b"two")).await.unwrap();
    assert_eq!(
        server.writes("source_src")[2].if_match.as_deref(),
        Some("\"v1\"")
    );
    assert_eq!(
        store(&server).load("src").await.unwrap(),
        Some(state(b"two"))
    );
    // Lost again, and the next save carries a newer state (more batches
    // were acknowledged meanwhile): the write in doubt is sent again first.
    server.lose_answers(1);
    assert!(runtime.save("src", &state(b"three")).await.is_err());
    runtime.save("src", &state(b"four")).await.unwrap();
    let writes = server.writes("source_src");
    assert_eq!(writes.len(), 6, "{writes:?}");
    assert_eq!(writes[3].idempotency_key, writes[4].idempotency_key);
    assert_eq!(writes[5].if_match.as_deref(), Some("\"v3\""));
    assert_eq!(
        store(&server).load("src").await.unwrap(),
        Some(state(b"four"))
    );
}

#[tokio::test]
async fn given_a_corrupt_or_foreign_state_on_the_server_when_loaded_should_refuse_it() {
    let server = StateServer::start().await;
    server.put_directly("source_src", b"\xc1 not messagepack");
    let refused = store(&server).load("src").await.unwrap_err();
    assert!(matches!(refused, StateError::CorruptAt { .. }), "{refused}");
    // A state saved for another key, copied under this one.
    let runtime = store(&server);
    runtime.load("other").await.unwrap();
    runtime.save("other", &state(b"x")).await.unwrap();
    let copied = server.stored("source_other").unwrap().1;
    server.put_directly("source_copy", &copied);
    let refused = runtime.load("copy").await.unwrap_err();
    assert!(
        refused.to_string().contains("belongs to source \"other\""),
        "{refused}"
    );
}

#[tokio::test]
async fn given_credentials_when_the_server_asks_for_them_should_send_them_and_refuse_without() {
    let server = StateServer::start().await;
    server.require_token("Bearer secret-token");
    let without = store(&server).load("src").await.unwrap_err();
    assert!(
        without.is_permanent() && without.to_string().contains("401"),
        "{without}"
    );
    let with = HttpStateStore::open(&config(
        &server.url(),
        "[http.request_headers]\nauthorization = \"Bearer secret-token\"\n",
    ))
    .unwrap();
    assert_eq!(with.load("src").await.unwrap(), None);
    with.save("src", &state(b"one")).await.unwrap();
}

#[tokio::test]
async fn given_a_server_that_does_not_answer_when_loading_should_be_transient() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!(
        "http://user:pw@{}/state?token=q",
        closed.local_addr().unwrap()
    );
    drop(closed);
    let runtime = HttpStateStore::open(&config(&url, "")).unwrap();
    let failed = runtime.load("src").await.unwrap_err();
    assert!(failed.is_transient(), "{failed}");
    let shown = failed.to_string();
    assert!(
        !shown.contains("pw") && !shown.contains("token=q"),
        "{shown}"
    );
}

#[tokio::test]
async fn given_a_server_that_does_not_keep_the_protocol_when_loading_should_refuse() {
    // A 200 without an ETag: nothing to write against later.
    let server = ScriptedServer::start(Vec::new()).await;
    let runtime = HttpStateStore::open(&config(&server.url("/state"), "")).unwrap();
    let refused = runtime.load("src").await.unwrap_err();
    assert!(
        refused.is_permanent() && refused.to_string().contains("ETag"),
        "{refused}"
    );
}

const WAIT: Duration = Duration::from_secs(60);

/// A runtime whose random source `key` keeps its state on `server`.
fn runtime(iggy: &IggyTestServer, server: &StateServer, key: &str) -> Workspace {
    let workspace = Workspace::with_state(
        &iggy.address().to_string(),
        &format!(
            "storage = \"http\"\n[state.http]\nurl = \"{}\"\n",
            server.url()
        ),
    );
    workspace.add_connector(
        "random.toml",
        &format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"random\"\n\
             [[streams]]\nstream = \"{key}\"\ntopic = \"t\"\nschema = \"json\"\n\
             [plugin_config]\ninterval = \"20ms\"\n"
        ),
    );
    workspace
}

/// Saves of `source_{key}` the server accepted so far.
fn accepted(server: &StateServer, key: &str) -> usize {
    server
        .writes(&format!("source_{key}"))
        .iter()
        .filter(|seen| seen.status < 300)
        .count()
}

#[tokio::test]
async fn two_runtimes_on_one_source_key_one_stops_on_the_412_and_the_other_keeps_saving() {
    let iggy = IggyTestServer::start();
    let server = StateServer::start().await;
    let key = format!("shared_{}", uuid::Uuid::new_v4().simple());
    let (first, second) = (runtime(&iggy, &server, &key), runtime(&iggy, &server, &key));
    let _first_running = first.run();
    wait_for("the first runtime to save state", WAIT, || {
        accepted(&server, &key) >= 3
    })
    .await;
    let _second_running = second.run();
    const REFUSED: &str = "state save refused";
    wait_for("one runtime to stop on a refused save", WAIT, || {
        first.stderr().contains(REFUSED) || second.stderr().contains(REFUSED)
    })
    .await;
    let conflicts = server
        .writes(&format!("source_{key}"))
        .iter()
        .filter(|seen| seen.status == 412)
        .count();
    assert!(conflicts >= 1, "the refusal came from the server's 412");
    // The other one still runs, and its saves still go through.
    let saved = accepted(&server, &key);
    wait_for("the other runtime to keep saving", WAIT, || {
        accepted(&server, &key) >= saved + 3
    })
    .await;
    let stopped = [first.stderr(), second.stderr()]
        .iter()
        .filter(|log| log.contains(REFUSED))
        .count();
    assert_eq!(
        stopped,
        1,
        "first:\n{}\nsecond:\n{}",
        first.stderr(),
        second.stderr()
    );
}

#[tokio::test]
async fn a_runtime_whose_state_save_gets_a_503_saves_again_and_delivers_on() {
    let iggy = IggyTestServer::start();
    let server = StateServer::start().await;
    let key = format!("retried_{}", uuid::Uuid::new_v4().simple());
    let workspace = runtime(&iggy, &server, &key);
    let _running = workspace.run();
    wait_for("a first save", WAIT, || accepted(&server, &key) >= 1).await;
    server.lose_answers(2);
    let saved = accepted(&server, &key);
    wait_for("saves after the 503s", WAIT, || {
        accepted(&server, &key) >= saved + 3
    })
    .await;
    let writes = server.writes(&format!("source_{key}"));
    let lost: Vec<usize> = (0..writes.len())
        .filter(|&index| writes[index].status == 503)
        .collect();
    assert_eq!(lost.len(), 2, "{writes:?}");
    for index in lost {
        // The engine saved again, with the same key: the server replayed its answer.
        assert_eq!(
            writes[index + 1].idempotency_key,
            writes[index].idempotency_key
        );
        assert!(writes[index + 1].status < 300, "{writes:?}");
    }
    assert!(
        !workspace.stderr().contains("state save refused"),
        "{}",
        workspace.stderr()
    );
    assert!(
        workspace.stderr().contains("state save failed"),
        "{}",
        workspace.stderr()
    );
}
