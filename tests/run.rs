//! `iggy-connect run` as users run it: the real binary, upstream's config format,
//! the Iggy bus by default, against the in-process Iggy protocol test server.

mod support;

use std::time::Duration;

use support::binary::Workspace;
use support::iggy_server::IggyTestServer;
use support::wait::wait_until;

const LONG: Duration = Duration::from_secs(30);

const RANDOM_SOURCE: &str = r#"
type = "source"
key = "random"
enabled = true
version = 0
name = "Random source"
path = "target/release/libiggy_connector_random_source"

[[streams]]
stream = "example_stream"
topic = "example_topic"
schema = "json"
batch_length = 1000
linger_time = "5ms"

[plugin_config]
interval = "5ms"
max_count = 300
messages_range = [10, 50]
payload_size = 40
"#;

const STDOUT_SINK: &str = r#"
type = "sink"
key = "stdout"
enabled = true
version = 0
name = "Stdout sink"
path = "target/release/libiggy_connector_stdout_sink"

[[streams]]
stream = "example_stream"
topics = ["example_topic"]
schema = "json"
batch_length = 1000
poll_interval = "5ms"
consumer_group = "stdout_sink_connector"

[plugin_config]
print_payload = true
"#;

#[test]
fn run_moves_records_from_an_upstream_source_file_through_iggy_to_an_upstream_sink_file_and_stops_on_sigterm()
 {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector("random_source.toml", RANDOM_SOURCE);
    workspace.add_connector("stdout_sink.toml", STDOUT_SINK);
    let running = workspace.run();

    wait_until("300 records in the topic", LONG, || {
        server.message_count("example_stream", "example_topic") == 300
    });
    wait_until("300 lines on stdout", LONG, || {
        workspace.stdout().matches('\n').count() == 300
    });
    wait_until("the group offset to cover them", LONG, || {
        server.stored_offset(
            "example_stream",
            "example_topic",
            "stdout_sink_connector",
            0,
        ) == Some(299)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let mut seqs: Vec<u64> = workspace
        .stdout()
        .lines()
        .map(|line| {
            serde_json::from_str::<serde_json::Value>(line).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    seqs.sort_unstable();
    assert_eq!(seqs, (0..300).collect::<Vec<_>>());
    assert!(workspace.path("state/source_random.state").exists());
}

#[test]
fn run_refuses_a_config_with_errors_naming_file_and_field() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "broken.toml",
        &RANDOM_SOURCE.replace("linger_time = \"5ms\"", "linger_time = \"soon\""),
    );
    let status = workspace.run().wait_exit(LONG);
    assert_eq!(status.code(), Some(2));
    let stderr = workspace.stderr();
    assert!(
        stderr.contains("broken.toml") && stderr.contains("streams[0].linger_time"),
        "{stderr}"
    );
    assert_eq!(
        server.connection_count(),
        0,
        "nothing may start on a bad config"
    );
}
