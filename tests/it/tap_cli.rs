//! `iggy-connect tap` as users run it: the real binary following a running
//! runtime's control API, against the in-process Iggy protocol test server.
// The tests here run the random source and the stdout sink (the default
// features): a build without them leaves them out rather than failing them.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::process::{Command, Output};
use std::time::Duration;

use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(30);

fn random_source(key: &str) -> String {
    format!(
        "type = \"source\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Random\"\npath = \"random\"\n\
         [[streams]]\nstream = \"tapped\"\ntopic = \"t\"\nschema = \"json\"\n\
         [plugin_config]\ninterval = \"10ms\"\nmessages_range = [2, 2]\n"
    )
}

fn stdout_sink(key: &str) -> String {
    format!(
        "type = \"sink\"\nkey = \"{key}\"\nenabled = true\nversion = 0\nname = \"Stdout\"\npath = \"stdout\"\n\
         [[streams]]\nstream = \"tapped\"\ntopics = [\"t\"]\nschema = \"json\"\npoll_interval = \"5ms\"\n\
         consumer_group = \"tap_cli\"\n"
    )
}

fn tap(url: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .arg("tap")
        .args(args)
        .args(["--url", url, "--api-key", "k3y", "--count", "3"])
        .env_remove("IGGY_CONNECTORS_HTTP_API_KEY")
        .output()
        .expect("iggy-connect runs")
}

#[test]
fn tap_prints_live_messages_of_a_running_source_and_sink_found_by_url_or_by_the_runtimes_config() {
    let server = IggyTestServer::start();
    let workspace = Workspace::with_api(&server.address().to_string(), "");
    let config = workspace.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    // A wildcard address on a port of its own: `--config` below reaches it
    // on loopback.
    let port = crate::support::ports::free_port();
    std::fs::write(
        &config,
        text.replace("[http]\n", "[http]\napi_key = \"k3y\"\n")
            .replace("127.0.0.1:0", &format!("0.0.0.0:{port}")),
    )
    .unwrap();
    workspace.add_connector("a.toml", &random_source("gen"));
    workspace.add_connector("b.toml", &stdout_sink("print"));
    let running = workspace.run();
    wait_until("the API", LONG, || !workspace.api_urls().is_empty());
    let url = workspace.api_urls().pop().unwrap();

    let source = tap(&url, &["gen", "--stage", "out", "--format", "json"]);
    let stdout = String::from_utf8_lossy(&source.stdout);
    assert!(
        source.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&source.stderr)
    );
    let frames: Vec<serde_json::Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON frame per line"))
        .collect();
    assert_eq!(frames.len(), 3, "{stdout}");
    for frame in &frames {
        assert_eq!(
            (
                frame["connector"].as_str(),
                frame["stage"].as_str(),
                frame["stream"].as_str()
            ),
            (Some("gen"), Some("out"), Some("tapped")),
        );
    }

    // No --kind: "print" is no source, so the sink with that key is tapped.
    let sink = tap(&url, &["print", "--stage", "out"]);
    let stdout = String::from_utf8_lossy(&sink.stdout);
    assert!(
        sink.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&sink.stderr)
    );
    assert_eq!(stdout.lines().count(), 3, "{stdout}");
    assert!(
        stdout
            .lines()
            .all(|line| line.contains(" out tapped/t partition=")),
        "{stdout}"
    );

    let refused = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["tap", "gen", "--url", &url])
        .env_remove("IGGY_CONNECTORS_HTTP_API_KEY")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("refused the API key"));

    // The runtime's own config gives the URL and the key.
    let configured = Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["tap", "gen", "--count", "2", "--config"])
        .arg(&config)
        .env_remove("IGGY_CONNECTORS_HTTP_API_KEY")
        .env_remove("IGGY_CONNECT_URL")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&configured.stdout);
    assert!(
        configured.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&configured.stderr)
    );
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    running.terminate();
    assert!(running.wait_exit(LONG).success(), "{}", workspace.stderr());
}
