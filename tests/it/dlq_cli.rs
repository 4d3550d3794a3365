//! `iggy-connect dlq list|replay` as users run them: the real binary against
//! a running runtime's control API, over the in-process Iggy protocol test
//! server. The faulty sink refuses one record while a marker file exists;
//! removing it "fixes the backend", and a replay delivers the record once.
#![cfg(all(feature = "random-source", feature = "faulty-sink"))]

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::support::accounting::{Seen, duplicates, seqs_in_file};
use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(60);
const STREAM: &str = "dlqs";

fn random_source() -> String {
    format!(
        "type = \"source\"\nkey = \"rnd\"\nenabled = true\nversion = 0\nname = \"random\"\npath = \"random\"\n\
         [[streams]]\nstream = \"{STREAM}\"\ntopic = \"events\"\nschema = \"json\"\n\
         [plugin_config]\ninterval = \"2ms\"\nmessages_range = [10, 20]\nmax_count = 100\n"
    )
}

fn refusing_sink(workspace: &Workspace) -> String {
    format!(
        "type = \"sink\"\nkey = \"out\"\nenabled = true\nversion = 0\nname = \"faulty\"\npath = \"faulty\"\n\
         on_error = \"dlq\"\n[dead_letter]\nstream = \"{STREAM}\"\ntopic = \"dead\"\n\
         [[streams]]\nstream = \"{STREAM}\"\ntopics = [\"events\"]\nschema = \"json\"\npoll_interval = \"2ms\"\n\
         [plugin_config]\noutput = \"{}\"\nreject_containing = '\"seq\":13,'\nreject_while_exists = \"{}\"\n",
        workspace.path("out.jsonl").display(),
        workspace.path("refusing").display(),
    )
}

/// Runs `iggy-connect dlq ARGS` against `url`; its stdout as JSON.
fn dlq(url: &str, args: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .arg("dlq")
        .args(args)
        .args(["--url", url, "--api-key", "k3y"])
        .env_remove("IGGY_CONNECTORS_HTTP_API_KEY")
        .output()
        .expect("iggy-connect runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&stdout).expect("one JSON answer")
}

#[test]
fn a_refused_record_is_dead_lettered_with_its_origin_and_a_replay_after_the_fix_lands_it_once() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let config = workspace.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[http]\n", "[http]\napi_key = \"k3y\"\n"),
    )
    .unwrap();
    std::fs::write(workspace.path("refusing"), "").unwrap();
    workspace.add_connector("rnd.toml", &random_source());
    workspace.add_connector("out.toml", &refusing_sink(&workspace));
    let running = workspace.run();
    let output = workspace.path("out.jsonl");
    let all_but_13: Seen = (0..100)
        .filter(|seq| *seq != 13)
        .map(|seq| (seq, 1))
        .collect();
    wait_until("all but seq 13 written", LONG, || {
        seqs_in_file(&output) == all_but_13
    });
    wait_until("seq 13 dead-lettered", LONG, || {
        server.message_count(STREAM, "dead") == 1
    });
    let url = workspace.api_urls().pop().unwrap();

    let listed = dlq(&url, &["list", "out", "--format", "json"]);
    let dead = &listed["dead_letters"];
    assert_eq!(dead.as_array().map(Vec::len), Some(1), "{listed}");
    let offset_13 = server
        .messages(STREAM, "events")
        .iter()
        .find(|message| serde_json::from_slice::<Value>(&message.payload).unwrap()["seq"] == 13)
        .map(|message| message.offset)
        .unwrap();
    assert_eq!(
        dead[0]["origin"],
        serde_json::json!({"stream": STREAM, "topic": "events", "partition": 0, "offset": offset_13}),
        "{listed}"
    );
    assert_eq!(dead[0]["error_class"], "rejected");
    assert_eq!(dead[0]["stage"], "write");
    assert_eq!(dead[0]["attempts"], 1);
    assert_eq!(dead[0]["replayed"], false);
    assert_eq!(dead[0]["headers"]["iggy_connect_connector_key"], "out");
    assert!(dead[0]["payload"].as_str().unwrap().contains("\"seq\":13,"));

    // The backend is fixed: the replay delivers seq 13, once.
    std::fs::remove_file(workspace.path("refusing")).unwrap();
    let replayed = dlq(&url, &["replay", "out", "--filter", "rejected"]);
    assert_eq!(replayed["replayed"], 1, "{replayed}");
    let everything: Seen = (0..100).map(|seq| (seq, 1)).collect();
    assert_eq!(seqs_in_file(&output), everything);

    // A second replay, not asked `--again`, delivers nothing.
    let again = dlq(&url, &["replay", "out"]);
    assert_eq!(
        (
            again["replayed"].as_u64(),
            again["skipped_replayed"].as_u64()
        ),
        (Some(0), Some(1)),
        "{again}"
    );
    let listed = dlq(&url, &["list", "out", "--format", "json"]);
    assert_eq!(listed["dead_letters"][0]["replayed"], true, "{listed}");
    assert_eq!(duplicates(&seqs_in_file(&output)), 0);

    running.terminate();
    assert!(running.wait_exit(LONG).success(), "{}", workspace.stderr());
}
