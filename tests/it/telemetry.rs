//! `[telemetry]`: the real binary exports its batch spans and logs over OTLP
//! (gRPC and HTTP/protobuf) to a local receiver (tests/support/otlp_receiver.rs),
//! links an http source's batch to the request's W3C trace, and with
//! telemetry off connects to nothing.
#![cfg(all(
    feature = "telemetry",
    feature = "random-source",
    feature = "stdout-sink",
    feature = "http-source",
    feature = "otlp-source",
    feature = "faulty-sink"
))]

use std::collections::HashMap;
use std::time::Duration;

use opentelemetry_proto::tonic::trace::v1::Span;

use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::otlp_receiver::{OtlpReceiver, int_attribute, string_attribute};
use crate::support::wait::wait_until;

const LONG: Duration = Duration::from_secs(30);
const RECORDS: u64 = 300;

const RANDOM_SOURCE: &str = r#"
type = "source"
key = "random"
enabled = true
version = 0
name = "Random source"
path = "random"

[[streams]]
stream = "traced"
topic = "numbers"
schema = "json"
batch_length = 100
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
path = "stdout"

[[streams]]
stream = "traced"
topics = ["numbers"]
schema = "json"
batch_length = 100
poll_interval = "5ms"
consumer_group = "traced_stdout"

[plugin_config]
print_payload = true
"#;

fn telemetry(enabled: bool, transport: &str, endpoint: &str) -> String {
    format!(
        "[telemetry]\nenabled = {enabled}\nservice_name = \"telemetry-test\"\n\
         [telemetry.logs]\ntransport = \"{transport}\"\nendpoint = \"{endpoint}\"\n\
         [telemetry.traces]\ntransport = \"{transport}\"\nendpoint = \"{endpoint}\"\n"
    )
}

/// Runs random -> stdout until every record is committed, then stops the
/// binary (SIGTERM) and returns its workspace.
fn run_pipeline(server: &IggyTestServer, telemetry: &str) -> Workspace {
    let workspace = Workspace::new(&server.address().to_string(), telemetry);
    workspace.add_connector("random.toml", RANDOM_SOURCE);
    workspace.add_connector("stdout.toml", STDOUT_SINK);
    let running = workspace.run();
    wait_until("every record written and committed", LONG, || {
        server.stored_offset("traced", "numbers", "traced_stdout", 0) == Some(RECORDS - 1)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    workspace
}

/// The batch spans named `name` and, per batch, the names of its children.
fn batches<'a>(spans: &'a [Span], name: &str) -> Vec<(&'a Span, Vec<&'a str>)> {
    let mut children: HashMap<&[u8], Vec<&str>> = HashMap::new();
    for span in spans {
        children
            .entry(&span.parent_span_id[..])
            .or_default()
            .push(&span.name);
    }
    spans
        .iter()
        .filter(|span| span.name == name)
        .map(|span| {
            let mut names = children.remove(&span.span_id[..]).unwrap_or_default();
            names.sort_unstable();
            (span, names)
        })
        .collect()
}

/// Every source and sink batch arrived (the last ones flushed at shutdown),
/// with its attributes and stage children.
fn assert_batch_spans(receiver: &OtlpReceiver) {
    let received = receiver.spans();
    assert!(
        received
            .iter()
            .all(|(service, _)| service == "telemetry-test"),
        "service.name is the configured one"
    );
    let spans: Vec<Span> = received.into_iter().map(|(_, span)| span).collect();
    for (name, key, kind, stages) in [
        (
            "source batch",
            "random",
            "source",
            &["commit", "poll", "send", "state_save", "transform"][..],
        ),
        (
            "sink batch",
            "stdout",
            "sink",
            &["commit", "decode", "write"][..],
        ),
    ] {
        let found = batches(&spans, name);
        assert!(!found.is_empty(), "no {name} span in {spans:#?}");
        let mut records = 0;
        for (span, children) in &found {
            assert_eq!(
                string_attribute(&span.attributes, "connector_key").as_deref(),
                Some(key)
            );
            assert_eq!(
                string_attribute(&span.attributes, "connector_type").as_deref(),
                Some(kind)
            );
            assert_eq!(
                string_attribute(&span.attributes, "outcome").as_deref(),
                Some("ok")
            );
            assert_eq!(children, stages, "the stages of a {name}");
            records += int_attribute(&span.attributes, "records").unwrap();
        }
        assert_eq!(records as u64, RECORDS, "every {name} exported");
    }
    let children_share_the_trace = spans.iter().all(|span| {
        span.parent_span_id.is_empty()
            || spans.iter().any(|parent| {
                parent.span_id == span.parent_span_id && parent.trace_id == span.trace_id
            })
    });
    assert!(
        children_share_the_trace,
        "every stage is in its batch's trace"
    );
}

/// Runs the pipeline exporting over `protocol` to the receiver's endpoint
/// for it, and checks the batch spans and the startup log arrived.
fn assert_spans_and_logs_over(protocol: &str, endpoint: fn(&OtlpReceiver) -> &str) {
    let server = IggyTestServer::start();
    let receiver = OtlpReceiver::start();
    let workspace = run_pipeline(&server, &telemetry(true, protocol, endpoint(&receiver)));
    assert_batch_spans(&receiver);
    let logs = receiver.log_bodies();
    assert!(
        logs.iter()
            .any(|body| body.contains("iggy-connect starting")),
        "{logs:?}\n{}",
        workspace.stderr()
    );
}

#[test]
fn batch_spans_with_their_stages_and_the_logs_reach_an_otlp_grpc_receiver() {
    assert_spans_and_logs_over("grpc", OtlpReceiver::grpc_url);
}

#[test]
fn batch_spans_and_logs_reach_an_otlp_http_receiver_at_the_signal_paths() {
    assert_spans_and_logs_over("http", OtlpReceiver::http_url);
}

#[test]
fn a_sink_batch_span_counts_its_nacks_and_says_when_records_were_rejected() {
    let server = IggyTestServer::start();
    let receiver = OtlpReceiver::start();
    let workspace = Workspace::new(
        &server.address().to_string(),
        &telemetry(true, "grpc", receiver.grpc_url()),
    );
    let failing = workspace.path("writes.fail");
    std::fs::write(&failing, "").unwrap();
    workspace.add_connector("random.toml", RANDOM_SOURCE);
    workspace.add_connector(
        "faulty.toml",
        &format!(
            r#"
type = "sink"
key = "faulty"
path = "faulty"
on_error = "skip"
[[streams]]
stream = "traced"
topics = ["numbers"]
schema = "json"
batch_length = 1000
poll_interval = "5ms"
consumer_group = "traced_faulty"
[plugin_config]
fail_while_exists = "{failing}"
reject_containing = "\"seq\":13,"
"#,
            failing = failing.display()
        ),
    );
    let running = workspace.run();
    wait_until("a write NACKed", LONG, || {
        workspace
            .stderr()
            .contains("retrying what is not written yet")
    });
    std::fs::remove_file(&failing).unwrap();
    wait_until("every record committed", LONG, || {
        server.stored_offset("traced", "numbers", "traced_faulty", 0) == Some(RECORDS - 1)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let spans: Vec<Span> = receiver.spans().into_iter().map(|(_, span)| span).collect();
    let sink_batches = batches(&spans, "sink batch");
    let outcome = |span: &Span| string_attribute(&span.attributes, "outcome").unwrap();
    assert!(
        sink_batches
            .iter()
            .any(|(span, _)| int_attribute(&span.attributes, "nacks").unwrap() >= 1),
        "a batch was NACKed: {sink_batches:#?}"
    );
    let rejected: Vec<_> = sink_batches
        .iter()
        .filter(|(span, _)| outcome(span) == "rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "the batch holding seq 13");
    assert!(
        sink_batches
            .iter()
            .all(|(span, _)| matches!(outcome(span).as_str(), "ok" | "rejected"))
    );
}

#[test]
fn with_telemetry_off_nothing_is_exported_and_no_connection_is_made() {
    let server = IggyTestServer::start();
    // A listener that would see any connection attempt.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let workspace = run_pipeline(&server, &telemetry(false, "grpc", &endpoint));
    assert_eq!(workspace.stdout().lines().count() as u64, RECORDS);
    match listener.accept() {
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => {}
        other => panic!("the runtime connected to the OTLP endpoint: {other:?}"),
    }
}

#[test]
fn an_unreachable_collector_costs_the_pipeline_nothing_and_is_reported() {
    let server = IggyTestServer::start();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let started = std::time::Instant::now();
    let workspace = run_pipeline(&server, &telemetry(true, "grpc", &endpoint));
    assert_eq!(workspace.stdout().lines().count() as u64, RECORDS);
    let stderr = workspace.stderr();
    assert!(
        stderr.contains("opentelemetry"),
        "the failed export is logged: {stderr}"
    );
    // Not a timing target: the exit must not wait out retries forever.
    assert!(started.elapsed() < LONG, "{:?}", started.elapsed());
}

#[test]
fn a_bad_endpoint_is_a_config_error_naming_the_field() {
    let server = IggyTestServer::start();
    let workspace = Workspace::new(
        &server.address().to_string(),
        &telemetry(true, "grpc", "not a url"),
    );
    let status = workspace.run().wait_exit(LONG);
    assert_eq!(status.code(), Some(2), "{}", workspace.stderr());
    let stderr = workspace.stderr();
    assert!(
        stderr.contains("telemetry.logs.endpoint") || stderr.contains("telemetry.traces.endpoint"),
        "{stderr}"
    );
    assert_eq!(server.connection_count(), 0, "nothing starts");
}

#[test]
fn an_http_source_batch_links_to_the_trace_of_the_request_it_came_from() {
    let server = IggyTestServer::start();
    let receiver = OtlpReceiver::start();
    let workspace = Workspace::new(
        &server.address().to_string(),
        &telemetry(true, "grpc", receiver.grpc_url()),
    );
    let address = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    workspace.add_connector(
        "hooks.toml",
        &format!(
            r#"
type = "source"
key = "hooks"
path = "http"
[[streams]]
stream = "hooks"
topic = "events"
schema = "json"
[plugin_config]
address = "{address}"
"#
        ),
    );
    let running = workspace.run();
    let client = reqwest::Client::new();
    let http = tokio::runtime::Runtime::new().unwrap();
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let traceparent = format!("00-{trace_id}-b7ad6b7169203331-01");
    wait_until("the source accepts the request", LONG, || {
        let sent = http.block_on(
            client
                .post(format!("http://{address}/messages"))
                .header("traceparent", &traceparent)
                .header("tracestate", "vendor=opaque")
                .json(&serde_json::json!({"order": 1}))
                .send(),
        );
        sent.is_ok_and(|response| response.status() == 200)
    });
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let spans = receiver.spans();
    let batch = spans
        .iter()
        .map(|(_, span)| span)
        .find(|span| span.name == "source batch")
        .unwrap_or_else(|| panic!("no source batch span in {spans:#?}"));
    let [link] = &batch.links[..] else {
        panic!("one link expected: {:?}", batch.links);
    };
    let hex: String = link
        .trace_id
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect();
    assert_eq!(hex, trace_id);
    assert_eq!(link.trace_state, "vendor=opaque");
}
