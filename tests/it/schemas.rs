//! Avro, Protocol Buffers and FlatBuffers stream schemas against independent
//! encoders: fastavro and Google's protobuf runtime (Python, from PyPI,
//! prepared by `scripts/py-fixtures`, which `scripts/test` runs) and `flatc`
//! (Debian's flatbuffers-compiler, which `scripts/test` installs) write the
//! fixtures; we decode them, encode the same values back, and run a sink over
//! them with a bad payload in the middle.

#![cfg(all(
    feature = "schema-avro",
    feature = "schema-proto",
    feature = "schema-flatbuffer",
    feature = "schema-registry",
    feature = "stdout-sink",
    feature = "random-source"
))]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::codec::{Schema, avro};
use iggy_connect::config::env::EnvVars;
use iggy_connect::config::{ConnectorConfig, KindConfig, parse_connector_file};
use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::{Bus, MemoryBus, ProducerTarget};
use iggy_connect::message::{OutgoingMessage, Payload};
use iggy_connect::state::MemoryStateStore;
use iggy_connect::transforms::TransformChain;
use serde_json::Value;

use crate::support::schema_registry::SchemaRegistryServer;
use crate::support::wait::wait_for;

/// The fixtures, written once per test into its own directory.
struct Fixtures {
    dir: tempfile::TempDir,
}

impl Fixtures {
    fn write() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/py-fixtures"))
            .output()
            .expect("scripts/py-fixtures runs");
        assert!(
            prepared.status.success(),
            "scripts/py-fixtures failed: {}",
            String::from_utf8_lossy(&prepared.stderr)
        );
        let python = String::from_utf8(prepared.stdout).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let written = Command::new(python.trim())
            .arg(root.join("tests/fixtures/schemas/write_fixtures.py"))
            .arg(dir.path())
            .output()
            .unwrap();
        assert!(
            written.status.success(),
            "write_fixtures.py failed: {}",
            String::from_utf8_lossy(&written.stderr)
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// (value, its bytes as the independent encoder wrote them) per line.
    fn rows(&self, name: &str) -> Vec<(Value, Vec<u8>)> {
        std::fs::read_to_string(self.path(name))
            .unwrap()
            .lines()
            .map(|line| {
                let row: Value = serde_json::from_str(line).unwrap();
                (row["json"].clone(), hex(row["hex"].as_str().unwrap()))
            })
            .collect()
    }
}

fn hex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|at| u8::from_str_radix(&text[at..at + 2], 16).unwrap())
        .collect()
}

/// The schema of the one stream of a sink file with these stream fields.
fn stream_schema(stream_fields: &str) -> Schema {
    let config = parse_sink("schema_sink.toml", "s", stream_fields);
    match config.kind_config {
        KindConfig::Sink { streams, .. } => streams[0].schema.clone(),
        other => panic!("{other:?}"),
    }
}

fn parse_sink(name: &str, stream: &str, stream_fields: &str) -> ConnectorConfig {
    let text = format!(
        "type = \"sink\"\nkey = \"schema_sink\"\npath = \"stdout\"\n\
         [[streams]]\nstream = \"{stream}\"\ntopics = [\"t\"]\nconsumer_group = \"g\"\n\
         {stream_fields}\n[plugin_config]\n"
    );
    match parse_connector_file(Path::new(name), &text, &EnvVars::default()) {
        Ok((config, warnings)) => {
            assert!(warnings.is_empty(), "{warnings:?}");
            config
        }
        Err(issues) => panic!("{issues}"),
    }
}

fn assert_round_trips(schema: &Schema, rows: &[(Value, Vec<u8>)]) {
    assert!(rows.len() >= 3);
    for (value, bytes) in rows {
        let decoded = schema.decode(Bytes::copy_from_slice(bytes)).unwrap();
        assert_eq!(decoded, Payload::Json(value.clone()), "{schema}");
        let encoded = schema.encode(&Payload::Json(value.clone())).unwrap();
        assert_eq!(&encoded[..], &bytes[..], "{schema} {value}");
    }
}

#[test]
fn avro_datums_written_by_fastavro_decode_to_their_json_and_encode_back_to_the_same_bytes() {
    let fixtures = Fixtures::write();
    let rows = fixtures.rows("avro.jsonl");
    let from_file = stream_schema(&format!(
        "schema = \"avro\"\navro_schema_path = {:?}",
        fixtures.path("user.avsc")
    ));
    assert_round_trips(&from_file, &rows);
    let text = std::fs::read_to_string(fixtures.path("user.avsc")).unwrap();
    let inline = stream_schema(&format!("schema = \"avro\"\navro_schema_json = {text:?}"));
    assert_round_trips(&inline, &rows);
}

#[test]
fn avro_datums_written_with_an_older_schema_resolve_into_a_newer_reader_schema() {
    let fixtures = Fixtures::write();
    let read = |name: &str| {
        let text = std::fs::read_to_string(fixtures.path(name)).unwrap();
        avro::AvroCodec::parse(&text).unwrap()
    };
    let (writer, reader) = (read("user.avsc"), read("user_v2.avsc"));
    for (mut value, bytes) in fixtures.rows("avro.jsonl") {
        let resolved = avro::decode_datum(writer.schema(), Some(reader.schema()), &bytes).unwrap();
        let object = value.as_object_mut().unwrap();
        object.shift_remove("score");
        object.insert("country".into(), "nz".into());
        assert_eq!(resolved, value);
    }
}

#[test]
fn protobuf_messages_written_by_the_python_runtime_decode_and_encode_back_from_a_proto_file_and_a_descriptor_set()
 {
    let fixtures = Fixtures::write();
    let rows = fixtures.rows("proto.jsonl");
    let compiled = stream_schema(&format!(
        "schema = \"proto\"\nproto_schema_path = {:?}\nproto_message_type = \"shop.v1.Order\"",
        fixtures.path("order.proto")
    ));
    assert_round_trips(&compiled, &rows);
    let described = stream_schema(&format!(
        "schema = \"proto\"\nproto_descriptor_set = {:?}\nproto_message_type = \".shop.v1.Order\"",
        fixtures.path("order.desc")
    ));
    assert_round_trips(&described, &rows);
}

#[test]
fn schemas_that_cannot_be_loaded_are_config_errors_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let proto = dir.path().join("a.proto");
    std::fs::write(&proto, "syntax = \"proto3\";\nmessage A { int32 x = 1; }\n").unwrap();
    let flatc = Flatc::new();
    let fbs = flatc.dir.path().join("order.fbs");
    let cases = [
        ("schema = \"avro\"", "streams[0].avro_schema_json"),
        (
            "schema = \"avro\"\navro_schema_json = '{\"type\":\"recor\"}'",
            "streams[0].avro_schema_json",
        ),
        (
            "schema = \"avro\"\navro_schema_path = \"/nonexistent/u.avsc\"",
            "streams[0].avro_schema_path",
        ),
        (
            "schema = \"proto\"\nproto_message_type = \"A\"",
            "streams[0].proto_schema_path",
        ),
        (
            &*format!("schema = \"proto\"\nproto_schema_path = {proto:?}"),
            "streams[0].proto_message_type",
        ),
        (
            &*format!(
                "schema = \"proto\"\nproto_schema_path = {proto:?}\nproto_message_type = \"B\""
            ),
            "streams[0].proto_message_type",
        ),
        (
            "schema = \"flat_buffer\"",
            "streams[0].flatbuffer_schema_path",
        ),
        (
            &*format!("schema = \"flat_buffer\"\nflatbuffer_schema_path = {fbs:?}"),
            "streams[0].flatbuffer_schema_path",
        ),
        (
            &*format!("schema = \"flat_buffer\"\nflatbuffer_schema_path = {proto:?}"),
            "streams[0].flatbuffer_schema_path",
        ),
        (
            &*format!(
                "schema = \"flat_buffer\"\nflatbuffer_schema_path = {:?}\n\
                 flatbuffer_root_table_name = \"Nope\"",
                flatc.bfbs()
            ),
            "streams[0].flatbuffer_root_table_name",
        ),
    ];
    for (fields, field) in cases {
        let text = format!(
            "type = \"sink\"\nkey = \"k\"\npath = \"stdout\"\n[[streams]]\nstream = \"s\"\n\
             topics = [\"t\"]\n{fields}\n[plugin_config]\n"
        );
        let issues = parse_connector_file(Path::new("bad.toml"), &text, &EnvVars::default())
            .err()
            .unwrap_or_else(|| panic!("{fields} was accepted"))
            .to_string();
        assert!(
            issues.contains(&format!("bad.toml: field `{field}`: ")),
            "{fields}: {issues}"
        );
    }
}

#[tokio::test]
async fn a_sink_on_an_avro_stream_gets_the_decoded_records_and_counts_and_skips_a_payload_that_is_not_a_datum()
 {
    let fixtures = Fixtures::write();
    let rows = fixtures.rows("avro.jsonl");
    let bus = MemoryBus::new();
    let mut payloads: Vec<&[u8]> = rows.iter().map(|(_, bytes)| bytes.as_slice()).collect();
    // Truncated: the first record cut inside its e-mail string.
    let truncated = &rows[0].1[..10];
    payloads.insert(1, truncated);
    put(&bus, "avro_stream", &payloads).await;
    let config = parse_sink(
        "avro_sink.toml",
        "avro_stream",
        &format!(
            "schema = \"avro\"\navro_schema_path = {:?}",
            fixtures.path("user.avsc")
        ),
    );
    let runtime = run_sink_until_drained(&bus, config, "avro_stream").await;
    let view = runtime.view(ConnectorKind::Sink, "schema_sink").unwrap();
    assert_eq!(view.metrics.consumed.get(), 4);
    assert_eq!(view.metrics.processed.get(), 3);
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    runtime.shutdown().await;
}

async fn put(bus: &MemoryBus, stream: &str, payloads: &[&[u8]]) {
    let producer = bus
        .producer(&ProducerTarget {
            stream: stream.into(),
            topic: "t".into(),
            partitions: 1,
            batch_length: 100,
            linger_time: Duration::ZERO,
        })
        .await
        .unwrap();
    let messages: Vec<OutgoingMessage> = payloads
        .iter()
        .map(|payload| OutgoingMessage {
            id: None,
            headers: Vec::new(),
            payload: Bytes::copy_from_slice(payload),
            partition: None,
            origin_timestamp: None,
        })
        .collect();
    producer.send(&messages).await.unwrap();
}

const RECORD_AVRO: &str = r#"{"type":"record","name":"Record","fields":[{"name":"id","type":"string"},{"name":"seq","type":"long"},{"name":"title","type":"string"},{"name":"name","type":"string"},{"name":"text","type":"string"}]}"#;

#[tokio::test]
async fn a_source_on_an_avro_stream_stores_datums_that_fastavro_reads_back() {
    let fixtures = Fixtures::write();
    let schema_path = fixtures.path("record.avsc");
    std::fs::write(&schema_path, RECORD_AVRO).unwrap();
    let stream_fields = format!("schema = \"avro\"\navro_schema_path = {schema_path:?}");
    let stored = run_random_source("avro_src", &stream_fields).await;
    let python = fixtures.read_back(&["--read-avro", schema_path.to_str().unwrap()], &stored);
    assert_random_records(&python, |record| record["seq"].as_u64());
}

#[tokio::test]
async fn a_source_on_a_proto_stream_stores_messages_that_the_python_runtime_parses_back() {
    let fixtures = Fixtures::write();
    let desc = fixtures.path("order.desc");
    let stream_fields = format!(
        "schema = \"proto\"\nproto_schema_path = {:?}\nproto_message_type = \"shop.v1.Record\"",
        fixtures.path("order.proto")
    );
    let stored = run_random_source("proto_src", &stream_fields).await;
    let python = fixtures.read_back(
        &["--read-proto", desc.to_str().unwrap(), "shop.v1.Record"],
        &stored,
    );
    // protobuf's JSON writes a uint64 as a string and leaves out zeros.
    assert_random_records(&python, |record| match &record["seq"] {
        Value::Null => Some(0),
        seq => seq.as_str()?.parse().ok(),
    });
}

impl Fixtures {
    /// What the independent decoder (write_fixtures.py `args`) reads from
    /// each stored payload.
    fn read_back(&self, args: &[&str], payloads: &[Bytes]) -> Vec<Value> {
        let lines: String = payloads
            .iter()
            .map(|payload| {
                let mut line: String = payload.iter().map(|byte| format!("{byte:02x}")).collect();
                line.push('\n');
                line
            })
            .collect();
        let input = self.path("stored.hex");
        std::fs::write(&input, lines).unwrap();
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let python = String::from_utf8(
            Command::new(root.join("scripts/py-fixtures"))
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        let output = Command::new(python.trim())
            .arg(root.join("tests/fixtures/schemas/write_fixtures.py"))
            .args(args)
            .arg(&input)
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "reading back failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

/// Runs the random source for 20 records onto `stream` and returns the stored payloads.
async fn run_random_source(stream: &str, stream_fields: &str) -> Vec<Bytes> {
    let text = format!(
        "type = \"source\"\nkey = \"schema_source\"\npath = \"random\"\n\
         [[streams]]\nstream = \"{stream}\"\ntopic = \"records\"\n{stream_fields}\n\
         [plugin_config]\ninterval = \"0ms\"\nmax_count = 20\nmessages_range = [20, 20]\n"
    );
    let config = match parse_connector_file(Path::new("source.toml"), &text, &EnvVars::default()) {
        Ok((config, warnings)) => {
            assert!(warnings.is_empty(), "{warnings:?}");
            config
        }
        Err(issues) => panic!("{issues}"),
    };
    let bus = MemoryBus::new();
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    runtime
        .wait_until_stopped(ConnectorKind::Source, "schema_source")
        .await
        .unwrap();
    let view = runtime
        .view(ConnectorKind::Source, "schema_source")
        .unwrap();
    assert_eq!(view.metrics.errors.get(), 0);
    runtime.shutdown().await;
    let stored: Vec<Bytes> = bus
        .messages(stream, "records")
        .into_iter()
        .map(|message| message.payload)
        .collect();
    assert_eq!(stored.len(), 20);
    stored
}

fn assert_random_records(records: &[Value], seq: impl Fn(&Value) -> Option<u64>) {
    let seqs: Vec<Option<u64>> = records.iter().map(&seq).collect();
    assert_eq!(seqs, (0..20).map(Some).collect::<Vec<_>>());
    for record in records {
        assert_eq!(record["title"], "Hello", "{record}");
        assert_eq!(record["name"], "World", "{record}");
        assert!(!record["text"].as_str().unwrap().is_empty(), "{record}");
        assert_eq!(record["id"].as_str().unwrap().len(), 36, "{record}");
    }
}

fn registry_fields(
    fixtures: &Fixtures,
    schema: &str,
    server: &SchemaRegistryServer,
    password: &str,
) -> String {
    format!(
        "schema = \"avro\"\navro_schema_path = {:?}\nschema_registry_url = \"{}\"\n\
         schema_registry_username = \"reader\"\nschema_registry_password = \"{password}\"",
        fixtures.path(schema),
        server.url
    )
}

fn framed(id: u32, datum: &[u8]) -> Vec<u8> {
    let mut bytes = vec![0];
    bytes.extend_from_slice(&id.to_be_bytes());
    bytes.extend_from_slice(datum);
    bytes
}

fn count(server: &SchemaRegistryServer, request: &str) -> usize {
    server
        .requests()
        .iter()
        .filter(|made| *made == request)
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_framed_datums_decode_with_the_writer_schema_fetched_once_per_id_and_resolve_into_the_stream_schema()
 {
    let fixtures = Fixtures::write();
    let server = SchemaRegistryServer::start(Some(("reader", "s3cret"))).await;
    let v1 = std::fs::read_to_string(fixtures.path("user.avsc")).unwrap();
    let v2 = std::fs::read_to_string(fixtures.path("user_v2.avsc")).unwrap();
    let old_id = server.register("users-value", &v1);
    let new_id = server.register("users-value", &v2);
    let schema = stream_schema(&registry_fields(
        &fixtures,
        "user_v2.avsc",
        &server,
        "s3cret",
    ));
    let rows = fixtures.rows("avro.jsonl");
    let own = avro::AvroCodec::parse(&v2).unwrap();
    let decoded = tokio::spawn(async move {
        let mut decoded = Vec::new();
        for _ in 0..10 {
            for (value, bytes) in &rows {
                let old = schema.decode(Bytes::from(framed(old_id, bytes))).unwrap();
                let mut current = value.clone();
                current.as_object_mut().unwrap().shift_remove("score");
                let datum = own.encode(&Payload::Json(current)).unwrap();
                let new = schema.decode(Bytes::from(framed(new_id, &datum))).unwrap();
                decoded.push((value.clone(), old, new));
            }
        }
        let unknown = schema.decode(Bytes::from(framed(99, b"\x02"))).unwrap_err();
        let unframed = schema
            .decode(Bytes::from_static(b"\x02\x06ann"))
            .unwrap_err();
        (decoded, unknown.to_string(), unframed.to_string())
    })
    .await
    .unwrap();
    let (decoded, unknown, unframed) = decoded;
    assert_eq!(decoded.len(), 30);
    for (mut value, old, new) in decoded {
        let object = value.as_object_mut().unwrap();
        object.shift_remove("score");
        object.insert("country".into(), "nz".into());
        assert_eq!(old, Payload::Json(value.clone()));
        assert_eq!(new, Payload::Json(value));
    }
    assert!(unknown.contains("404"), "{unknown}");
    assert!(unframed.contains("wire format"), "{unframed}");
    assert_eq!(count(&server, &format!("GET /schemas/ids/{old_id}")), 1);
    assert_eq!(count(&server, &format!("GET /schemas/ids/{new_id}")), 1);
    assert_eq!(server.requests().len(), 3, "{:?}", server.requests());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_avro_stream_registers_its_schema_once_and_frames_each_datum_with_the_id() {
    let fixtures = Fixtures::write();
    let server = SchemaRegistryServer::start(Some(("reader", "s3cret"))).await;
    server.register("other-value", r#"{"type":"string"}"#);
    let stream_fields = registry_fields(&fixtures, "user.avsc", &server, "s3cret")
        + "\nschema_registry_subject = \"users-value\"";
    let text = format!(
        "type = \"source\"\nkey = \"k\"\npath = \"random\"\n[[streams]]\nstream = \"s\"\n\
         topic = \"t\"\n{stream_fields}\n[plugin_config]\n"
    );
    let (config, _) =
        parse_connector_file(Path::new("source.toml"), &text, &EnvVars::default()).unwrap();
    let KindConfig::Source { streams, .. } = config.kind_config else {
        panic!("not a source");
    };
    let schema = streams[0].schema.clone();
    let rows = fixtures.rows("avro.jsonl");
    let expected: Vec<Vec<u8>> = rows.iter().map(|(_, bytes)| framed(2, bytes)).collect();
    let encoded = tokio::spawn(async move {
        rows.iter()
            .map(|(value, _)| {
                schema
                    .encode(&Payload::Json(value.clone()))
                    .unwrap()
                    .to_vec()
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(encoded, expected);
    assert_eq!(server.requests(), ["POST /subjects/users-value/versions"]);
    let registered = server.schema(2).unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(&registered).unwrap(),
        serde_json::from_str::<Value>(
            &std::fs::read_to_string(fixtures.path("user.avsc")).unwrap()
        )
        .unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_on_a_registry_stream_skips_per_message_what_the_registry_refuses() {
    let fixtures = Fixtures::write();
    let server = SchemaRegistryServer::start(Some(("reader", "s3cret"))).await;
    let v1 = std::fs::read_to_string(fixtures.path("user.avsc")).unwrap();
    let id = server.register("users-value", &v1);
    let rows = fixtures.rows("avro.jsonl");
    let mut payloads: Vec<Vec<u8>> = rows.iter().map(|(_, bytes)| framed(id, bytes)).collect();
    payloads.insert(1, framed(42, &rows[0].1));
    let payloads: Vec<&[u8]> = payloads.iter().map(Vec::as_slice).collect();
    let bus = MemoryBus::new();
    put(&bus, "registry_stream", &payloads).await;
    let config = parse_sink(
        "registry_sink.toml",
        "registry_stream",
        &registry_fields(&fixtures, "user.avsc", &server, "s3cret"),
    );
    let runtime = run_sink_until_drained(&bus, config, "registry_stream").await;
    let view = runtime.view(ConnectorKind::Sink, "schema_sink").unwrap();
    assert_eq!(view.metrics.processed.get(), 3);
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    runtime.shutdown().await;
    assert_eq!(count(&server, &format!("GET /schemas/ids/{id}")), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_with_wrong_credentials_fails_the_message_with_the_status() {
    let fixtures = Fixtures::write();
    let server = SchemaRegistryServer::start(Some(("reader", "s3cret"))).await;
    let v1 = std::fs::read_to_string(fixtures.path("user.avsc")).unwrap();
    let id = server.register("users-value", &v1);
    let schema = stream_schema(&registry_fields(&fixtures, "user.avsc", &server, "wrong"));
    let datum = fixtures.rows("avro.jsonl")[0].1.clone();
    let error =
        tokio::spawn(async move { schema.decode(Bytes::from(framed(id, &datum))).unwrap_err() })
            .await
            .unwrap();
    assert!(error.to_string().contains("401"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_over_tls_is_trusted_through_its_ca_file_and_refused_without_it() {
    let fixtures = Fixtures::write();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_pem = generated.cert.pem();
    let server = SchemaRegistryServer::start_tls(
        Some(("reader", "s3cret")),
        &cert_pem,
        &generated.signing_key.serialize_pem(),
    )
    .await;
    let ca_file = fixtures.path("registry-ca.pem");
    std::fs::write(&ca_file, &cert_pem).unwrap();
    let v1 = std::fs::read_to_string(fixtures.path("user.avsc")).unwrap();
    let id = server.register("users-value", &v1);
    let (value, datum) = fixtures.rows("avro.jsonl")[0].clone();
    let fields = registry_fields(&fixtures, "user.avsc", &server, "s3cret");
    let trusted = stream_schema(&format!("{fields}\nschema_registry_ca_file = {ca_file:?}"));
    let untrusted = stream_schema(&fields);
    let framed = Bytes::from(framed(id, &datum));
    let (decoded, refused) = tokio::spawn(async move {
        (
            trusted.decode(framed.clone()).unwrap(),
            untrusted.decode(framed).unwrap_err(),
        )
    })
    .await
    .unwrap();
    assert_eq!(decoded, Payload::Json(value));
    assert!(
        refused.to_string().to_lowercase().contains("certificate"),
        "{refused}"
    );
    assert_eq!(count(&server, &format!("GET /schemas/ids/{id}")), 1);
}

/// Runs a sink on the bus until its group has committed everything in `stream`.
async fn run_sink_until_drained(
    bus: &MemoryBus,
    config: ConnectorConfig,
    stream: &str,
) -> Arc<Runtime> {
    let runtime = Runtime::new(
        Arc::new(bus.clone()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(5),
    );
    runtime.add(config).unwrap();
    runtime.start_enabled().await;
    wait_for("the sink to commit", Duration::from_secs(30), || {
        bus.is_drained(stream, "t", "g")
    })
    .await;
    runtime
}

/// `flatc` (Debian's flatbuffers-compiler): the independent FlatBuffers
/// encoder and decoder, with tests/fixtures/schemas/order.fbs compiled to a
/// binary schema in a directory of the test's own.
struct Flatc {
    dir: tempfile::TempDir,
    files: AtomicUsize,
}

impl Flatc {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let fbs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/schemas/order.fbs");
        std::fs::copy(fbs, dir.path().join("order.fbs")).unwrap();
        let flatc = Self {
            dir,
            files: AtomicUsize::new(0),
        };
        flatc.run(&["-b", "--schema", "order.fbs"]);
        flatc
    }

    fn bfbs(&self) -> PathBuf {
        self.dir.path().join("order.bfbs")
    }

    fn run(&self, args: &[&str]) {
        let output = Command::new("flatc")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("flatc runs (scripts/test installs Debian's flatbuffers-compiler)");
        assert!(
            output.status.success(),
            "flatc {args:?}: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }

    fn name(&self) -> String {
        format!("f{}", self.files.fetch_add(1, Ordering::Relaxed))
    }

    /// The buffer flatc writes for `value` (root `shop.v1.Order`).
    fn write(&self, value: &Value) -> Vec<u8> {
        let name = self.name();
        std::fs::write(
            self.dir.path().join(format!("{name}.json")),
            value.to_string(),
        )
        .unwrap();
        self.run(&["-b", "order.fbs", &format!("{name}.json")]);
        std::fs::read(self.dir.path().join(format!("{name}.bin"))).unwrap()
    }

    /// What flatc prints for a buffer whose root is `root_type`.
    fn read(&self, bytes: &[u8], root_type: &str) -> Value {
        let name = self.name();
        std::fs::write(self.dir.path().join(format!("{name}.bin")), bytes).unwrap();
        let binary = format!("{name}.bin");
        self.run(&[
            "--json",
            "--strict-json",
            "--defaults-json",
            "--raw-binary",
            "--root-type",
            root_type,
            "order.fbs",
            "--",
            &binary,
        ]);
        let text = std::fs::read_to_string(self.dir.path().join(format!("{name}.json"))).unwrap();
        serde_json::from_str(&text).unwrap()
    }

    fn schema(&self, root_table: Option<&str>) -> Schema {
        let root = root_table
            .map(|name| format!("\nflatbuffer_root_table_name = \"{name}\""))
            .unwrap_or_default();
        stream_schema(&format!(
            "schema = \"flat_buffer\"\nflatbuffer_schema_path = {:?}{root}",
            self.bfbs()
        ))
    }
}

/// Orders without structs (which the encoder refuses), from empty to every
/// other kind of field.
fn flatbuffer_orders() -> Vec<Value> {
    vec![
        serde_json::json!({}),
        serde_json::json!({"id": 5, "customer": "c", "color": "Blue", "paid": true}),
        serde_json::json!({"id": -9_007_199_254_740_993_i64, "big": u64::MAX, "total": -0.25,
            "ratio": 3.5, "discount": 0, "scores": [-32768, 0, 32767],
            "tags": ["x", "", "ü"], "lines": [{"sku": "a", "quantity": 4_294_967_295_u32}, {}],
            "extra_type": "Coupon", "extra": {"code": "SAVE", "percent": 255}}),
        serde_json::json!({"extra_type": "Gift", "extra": {"note": "hi"}, "lines": [],
            "color": "Red", "discount": -7}),
    ]
}

#[test]
fn flatbuffers_written_by_flatc_decode_to_what_flatc_prints_for_them() {
    let flatc = Flatc::new();
    let schema = flatc.schema(None);
    // Upstream's docs also spell the schema without the underscore.
    assert_eq!(
        stream_schema(&format!(
            "schema = \"flatbuffer\"\nflatbuffer_schema_path = {:?}",
            flatc.bfbs()
        )),
        schema
    );
    let mut orders = flatbuffer_orders();
    orders.push(serde_json::json!({"pos": {"x": 1.5, "y": -2.0},
        "points": [{"x": 0.1, "y": 2}, {"x": -3, "y": 4}], "id": 1,
        "span": {"bounds": [-1, 2_147_483_647], "open": true}}));
    for order in orders {
        let bytes = flatc.write(&order);
        let printed = flatc.read(&bytes, "shop.v1.Order");
        let decoded = schema.decode(Bytes::from(bytes)).unwrap();
        assert_eq!(decoded, Payload::Json(printed), "{order}");
    }
}

#[test]
fn json_encoded_as_flatbuffers_reads_back_in_flatc_as_the_record_flatc_would_write() {
    let flatc = Flatc::new();
    let schema = flatc.schema(None);
    for order in flatbuffer_orders() {
        let expected = flatc.read(&flatc.write(&order), "shop.v1.Order");
        let encoded = schema.encode(&Payload::Json(order.clone())).unwrap();
        assert_eq!(&encoded[4..8], b"ORDR", "the schema's file identifier");
        assert_eq!(flatc.read(&encoded, "shop.v1.Order"), expected, "{order}");
        assert_eq!(schema.decode(encoded).unwrap(), Payload::Json(expected));
    }
}

#[test]
fn flatbuffers_that_do_not_fit_the_schema_fail_the_message_without_a_panic() {
    let flatc = Flatc::new();
    let schema = flatc.schema(None);
    let full = flatc.write(
        &serde_json::json!({"id": 3, "customer": "cust", "tags": ["a", "b"],
        "lines": [{"sku": "s", "quantity": 2}], "scores": [1, 2], "pos": {"x": 1, "y": 2},
        "extra_type": "Coupon", "extra": {"code": "c"}}),
    );
    // Every prefix and every single corrupted byte: an answer, never a panic;
    // short prefixes cannot hold the root's offsets.
    for len in 0..full.len() {
        let result = schema.decode(Bytes::copy_from_slice(&full[..len]));
        if len < 8 {
            assert!(result.is_err(), "{len} bytes decoded");
        }
    }
    let mut refused = 0;
    for at in 0..full.len() {
        let mut bytes = full.clone();
        bytes[at] ^= 0xff;
        refused += usize::from(schema.decode(Bytes::from(bytes)).is_err());
    }
    assert!(refused > 0, "no corrupted byte was noticed");
    // A vector claiming four billion strings in a small buffer.
    let tags = flatc.write(&serde_json::json!({"tags": ["a"]}));
    // The vector (one offset, 4, to the string next to it), then the string.
    let length_at = tags
        .windows(13)
        .position(|window| window == b"\x01\0\0\0\x04\0\0\0\x01\0\0\0a")
        .expect("the tags vector");
    let mut huge = tags.clone();
    huge[length_at..length_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    let error = schema.decode(Bytes::from(huge)).unwrap_err().to_string();
    assert!(error.contains("runs past the end"), "{error}");

    let refusals = [
        (
            serde_json::json!({"pos": {"x": 1, "y": 2}}),
            "struct shop.v1.Vec2",
        ),
        (serde_json::json!({"nope": 1}), "no field \"nope\""),
        (
            serde_json::json!({"lines": [{"quantity": -1}]}),
            "out of its range",
        ),
        (serde_json::json!({"color": "Purple"}), "Order.color"),
        (
            serde_json::json!({"extra": {"note": "n"}}),
            "needs extra_type",
        ),
        (
            serde_json::json!({"extra_type": "Coupon", "extra": {}}),
            "required field",
        ),
        (serde_json::json!([1]), "expected an object"),
    ];
    for (value, expected) in refusals {
        let error = schema
            .encode(&Payload::Json(value.clone()))
            .unwrap_err()
            .to_string();
        assert!(error.contains(expected), "{value}: {error}");
    }
}

#[tokio::test]
async fn a_sink_on_a_flat_buffer_stream_counts_and_skips_a_buffer_that_does_not_fit() {
    let flatc = Flatc::new();
    let buffers: Vec<Vec<u8>> = flatbuffer_orders()
        .iter()
        .map(|order| flatc.write(order))
        .collect();
    let bus = MemoryBus::new();
    let mut payloads: Vec<&[u8]> = buffers.iter().map(Vec::as_slice).collect();
    payloads.insert(1, &buffers[2][..6]);
    put(&bus, "fb_stream", &payloads).await;
    let config = parse_sink(
        "fb_sink.toml",
        "fb_stream",
        &format!(
            "schema = \"flat_buffer\"\nflatbuffer_schema_path = {:?}",
            flatc.bfbs()
        ),
    );
    let runtime = run_sink_until_drained(&bus, config, "fb_stream").await;
    let view = runtime.view(ConnectorKind::Sink, "schema_sink").unwrap();
    assert_eq!(view.metrics.consumed.get(), 5);
    assert_eq!(view.metrics.processed.get(), 4);
    assert_eq!(view.metrics.errors.get(), 1);
    assert_eq!(view.metrics.skipped.get(), 1);
    assert_eq!(view.status.status, Status::Running);
    runtime.shutdown().await;
}

#[tokio::test]
async fn a_source_on_a_flat_buffer_stream_stores_buffers_that_flatc_reads_back() {
    let flatc = Flatc::new();
    let stream_fields = format!(
        "schema = \"flat_buffer\"\nflatbuffer_schema_path = {:?}\n\
         flatbuffer_root_table_name = \"Record\"",
        flatc.bfbs()
    );
    let stored = run_random_source("fb_src", &stream_fields).await;
    let records: Vec<Value> = stored
        .iter()
        .map(|payload| flatc.read(payload, "shop.v1.Record"))
        .collect();
    assert_random_records(&records, |record| record["seq"].as_u64());
}

#[test]
fn flat_buffer_convert_encodes_and_decodes_inside_the_transform_chain() {
    let flatc = Flatc::new();
    let chain = |settings: Value| {
        let mut settings = settings;
        settings["enabled"] = true.into();
        TransformChain::build(&[("flat_buffer_convert".to_owned(), settings)]).unwrap()
    };
    let bfbs = flatc.bfbs();
    let encode = chain(serde_json::json!({"source_format": "json",
        "target_format": "flat_buffer", "schema_path": bfbs, "root_table_name": "shop.v1.Line",
        "field_mappings": {"item": "sku"}}));
    let decode = chain(
        serde_json::json!({"schema_path": bfbs, "root_table_name": "Line",
        "source_format": "flatbuffer", "target_format": "text"}),
    );
    let mut payload = Payload::Json(serde_json::json!({"item": "a", "quantity": 3}));
    encode.apply(&mut payload).unwrap();
    let Payload::Raw(bytes) = &payload else {
        panic!("{payload:?}")
    };
    assert_eq!(
        flatc.read(bytes, "shop.v1.Line"),
        serde_json::json!({"sku": "a", "quantity": 3})
    );
    decode.apply(&mut payload).unwrap();
    assert_eq!(payload, Payload::Text(r#"{"sku":"a","quantity":3}"#.into()));
}
