//! The elasticsearch sink against the Elasticsearch / OpenSearch protocol test
//! server of `support::elasticsearch`: directly through the `Sink` interface
//! (what one `write` returns) and through the `Runtime` with a `MemoryBus`
//! (offsets, `on_error`, outages).
#![cfg(feature = "elasticsearch-sink")]

use std::sync::Arc;
use std::time::Duration;

use iggy_connect::codec::Schema;
use iggy_connect::config::{ConnectorConfig, DeadLetterTarget, KindConfig, OnError, SinkStream};
use iggy_connect::connectors::{ConnectorError, ConnectorKind, Partial, Sink, SinkError};
use iggy_connect::engine::{Runtime, Status};
use iggy_connect::iggy::MemoryBus;
use iggy_connect::message::{HeaderValue, Payload, SinkMessage};
use iggy_connect::state::MemoryStateStore;
use serde_json::{Value, json};

use crate::support;
use crate::support::elasticsearch::{Flavor, SearchServer, ServerAuth};
use crate::support::sinks::{self, topic};
use crate::support::wait::eventually;

const DEADLINE: Duration = Duration::from_secs(30);
const TOPIC: &str = "events";
const GROUP: &str = "es-sink-test";
const FLAVORS: [Flavor; 2] = [Flavor::Elasticsearch8, Flavor::OpenSearch2];

fn config(server: &SearchServer, extra: Value) -> Value {
    let mut config = json!({
        "url": server.url(),
        "index": "iggy",
        "retry_delay": "10ms",
        "max_retry_delay": "50ms",
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        config.extend(extra.clone());
    }
    config
}

async fn open(config: &Value) -> Box<dyn Sink> {
    sinks::open("elasticsearch", config).await
}

fn build(config: &Value) -> Box<dyn Sink> {
    sinks::build("elasticsearch", config)
}

fn messages(payloads: Vec<Value>) -> Vec<SinkMessage> {
    payloads
        .into_iter()
        .enumerate()
        .map(|(n, payload)| SinkMessage {
            id: 1000 + n as u128,
            offset: n as u64,
            partition_id: 1,
            // 2024-02-29T13:45:00Z plus n seconds.
            timestamp: 1_709_214_300_000_000 + n as u64 * 1_000_000,
            origin_timestamp: 0,
            checksum: 0,
            headers: Vec::new(),
            payload: Payload::Json(payload),
        })
        .collect()
}

fn numbered(count: usize) -> Vec<Value> {
    (0..count).map(|n| json!({"n": n})).collect()
}

fn id(message: &SinkMessage) -> String {
    format!("{:032x}", message.id)
}

/// (durable, rejected) indexes of a per-message answer, sorted, and what
/// became of the rest.
fn partial(result: Result<(), SinkError>) -> (Vec<usize>, Vec<usize>, SinkError) {
    let Err(SinkError::Partial(partial)) = result else {
        panic!("expected a per-message answer, got {result:?}");
    };
    let Partial {
        mut durable,
        rejected,
        rest,
    } = *partial;
    durable.sort();
    let mut rejected: Vec<usize> = rejected.iter().map(|r| r.index).collect();
    rejected.sort();
    (durable, rejected, rest)
}

/// The messages of `batch` at `indexes`: what the engine writes again.
fn at(batch: &[SinkMessage], indexes: &[usize]) -> Vec<SinkMessage> {
    indexes.iter().map(|&index| batch[index].clone()).collect()
}

/// Upstream's example `plugin_config` for this sink.
fn upstream_plugin_config() -> Value {
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = repo
        .ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/reference/upstream-configs/elasticsearch_sink.toml"))
        .find(|path| path.is_file())
        .expect("upstream's elasticsearch_sink.toml");
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    serde_json::to_value(&table["plugin_config"]).unwrap()
}

#[tokio::test]
async fn documents_carry_the_message_id_and_upstream_metadata_on_both_flavors() {
    for flavor in FLAVORS {
        let server = SearchServer::start(flavor).await;
        let mapping = json!({"mappings": {"properties": {"n": {"type": "long"}}}});
        let sink = open(&config(&server, json!({"index_mapping": mapping}))).await;
        assert_eq!(
            server.mappings("iggy").unwrap()["properties"]["n"]["type"],
            "long",
            "{flavor:?}: created at open with index_mapping"
        );
        let mut batch = messages(numbered(3));
        batch[1].headers = vec![("tenant".into(), HeaderValue::String("acme".into()))];
        sink.write(&topic(), &batch).await.unwrap();
        let documents = server.documents("iggy");
        assert_eq!(documents.len(), 3, "{flavor:?}");
        let second = server.document("iggy", &id(&batch[1])).unwrap();
        assert_eq!(
            second.source,
            json!({
                "n": 1, "_iggy_offset": 1, "_iggy_stream": "s", "_iggy_topic": "t",
                "_iggy_partition": 1, "_iggy_timestamp": 1_709_214_301_000u64,
                "_iggy_headers": {"tenant": "acme"}
            })
        );
        let bulk = server
            .seen()
            .into_iter()
            .find(|seen| seen.path == "/_bulk")
            .unwrap();
        assert_eq!(bulk.headers["content-type"], "application/x-ndjson");
        assert_eq!(server.bulk_requests().len(), 1, "one request for the batch");
    }
}

#[tokio::test]
async fn a_replayed_batch_overwrites_its_documents_instead_of_duplicating_them() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let sink = open(&config(&server, json!({}))).await;
    let batch = messages(numbered(5));
    sink.write(&topic(), &batch).await.unwrap();
    sink.write(&topic(), &batch).await.unwrap();
    let documents = server.documents("iggy");
    assert_eq!(documents.len(), 5);
    assert!(
        documents.iter().all(|doc| doc.version == 2),
        "{documents:?}"
    );
}

#[tokio::test]
async fn items_answered_429_or_503_are_left_for_the_engine_and_the_stored_ones_named_durable() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let sink = open(&config(&server, json!({}))).await;
    let batch = messages(numbered(5));
    server.fail_id(&id(&batch[1]), 429, 1);
    server.fail_id(&id(&batch[3]), 503, 1);
    let (durable, rejected, rest) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 2, 4]);
    assert!(rejected.is_empty());
    assert!(
        matches!(&rest, SinkError::Transient { error, .. } if error.to_string().contains("es_rejected_execution_exception")),
        "{rest:?}"
    );
    assert_eq!(server.bulk_requests().len(), 1, "one request per write");
    assert_eq!(server.documents("iggy").len(), 3);
    // What the engine does next: write the rest again, only the rest.
    sink.write(&topic(), &at(&batch, &[1, 3])).await.unwrap();
    let requests = server.bulk_requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[1].len(), 2, "{:?}", requests[1]);
    assert_eq!(server.documents("iggy").len(), 5);
}

#[tokio::test]
async fn a_request_answered_503_ends_the_write_there_with_its_retry_after() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let sink = open(&config(&server, json!({"batch_size": 2}))).await;
    let batch = messages(numbered(6));
    server.pass_next_bulk();
    server.fail_next_bulk(503, Some(7));
    let (durable, rejected, rest) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 1]);
    assert!(rejected.is_empty());
    assert!(
        matches!(rest, SinkError::Transient { retry_after: Some(wait), .. } if wait == Duration::from_secs(7)),
        "{rest:?}"
    );
    assert_eq!(
        server.bulk_requests().len(),
        2,
        "nothing more is sent to a cluster that asked to wait"
    );
    // Nothing of the rest stored: transient as it is, with the wait asked for.
    server.fail_next_bulk(503, Some(7));
    let error = sink
        .write(&topic(), &at(&batch, &[2, 3, 4, 5]))
        .await
        .unwrap_err();
    assert!(
        matches!(error, SinkError::Transient { retry_after: Some(wait), .. } if wait == Duration::from_secs(7)),
        "{error:?}"
    );
    assert_eq!(server.bulk_requests().len(), 3);
}

#[tokio::test]
async fn mapping_errors_are_rejected_by_index_and_the_rest_is_written_once() {
    let server = SearchServer::start(Flavor::OpenSearch2).await;
    let mapping = json!({"mappings": {"properties": {"n": {"type": "long"}}}});
    let sink = open(&config(&server, json!({"index_mapping": mapping}))).await;
    let mut payloads = numbered(5);
    payloads[1] = json!({"n": "one"});
    payloads[3] = json!({"n": {"nested": true}});
    let batch = messages(payloads);
    let (durable, rejected, _) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 2, 4]);
    assert_eq!(rejected, vec![1, 3]);
    assert_eq!(server.documents("iggy").len(), 3);
    assert_eq!(
        server.bulk_requests().len(),
        1,
        "nothing is left for the engine to write again"
    );
}

#[tokio::test]
async fn payloads_that_cannot_be_documents_are_rejected_not_dropped() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let sink = open(&config(&server, json!({}))).await;
    let mut batch = messages(vec![json!({"ok": 1}), json!([1, 2]), json!("text")]);
    batch.push(SinkMessage {
        payload: Payload::Text("plain words".into()),
        ..batch[0].clone()
    });
    batch[3].id = 77;
    batch[3].offset = 3;
    let (durable, rejected, _) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 3]);
    assert_eq!(rejected, vec![1, 2]);
    let text = server.document("iggy", &format!("{:032x}", 77)).unwrap();
    assert_eq!(text.source["text"], "plain words");
    assert_eq!(text.source["data_type"], "text");
}

#[tokio::test]
async fn index_templates_route_by_field_and_date_and_create_each_index() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let mapping = json!({"mappings": {"properties": {"n": {"type": "long"}}}});
    let sink = open(&config(
        &server,
        json!({"index": "logs-{service}-%Y.%m.%d", "index_mapping": mapping}),
    ))
    .await;
    assert!(server.index_names().is_empty(), "nothing to create at open");
    let batch = messages(vec![
        json!({"service": "api", "n": 0}),
        json!({"service": "db", "n": 1}),
        json!({"n": 2}),
        json!({"service": "Bad Name", "n": 3}),
    ]);
    let (durable, rejected, _) = partial(sink.write(&topic(), &batch).await);
    assert_eq!(durable, vec![0, 1]);
    assert_eq!(rejected, vec![2, 3]);
    assert_eq!(
        server.index_names(),
        vec!["logs-api-2024.02.29", "logs-db-2024.02.29"]
    );
    assert_eq!(
        server.mappings("logs-db-2024.02.29").unwrap()["properties"]["n"]["type"],
        "long"
    );
}

#[tokio::test]
async fn the_ingest_pipeline_is_named_on_every_bulk_request() {
    let server = SearchServer::start(Flavor::OpenSearch2).await;
    server.put_pipeline(
        "enrich",
        json!({"processors": [{"set": {"field": "enriched", "value": true}}]}),
    );
    let sink = open(&config(&server, json!({"pipeline": "enrich"}))).await;
    let batch = messages(numbered(2));
    sink.write(&topic(), &batch).await.unwrap();
    let bulk = server
        .seen()
        .into_iter()
        .find(|seen| seen.path == "/_bulk")
        .unwrap();
    assert_eq!(bulk.query, "pipeline=enrich");
    assert!(
        server
            .documents("iggy")
            .iter()
            .all(|doc| doc.source["enriched"] == true)
    );
}

#[tokio::test]
async fn basic_auth_and_api_keys_are_sent_and_bad_credentials_are_fatal() {
    let server = SearchServer::start_with(
        Flavor::Elasticsearch8,
        ServerAuth::Basic {
            username: "elastic".into(),
            password: "changeme".into(),
        },
    )
    .await;
    let good = open(&config(
        &server,
        json!({"username": "elastic", "password": "changeme"}),
    ))
    .await;
    good.write(&topic(), &messages(numbered(1))).await.unwrap();
    let mut bad = build(&config(
        &server,
        json!({"username": "elastic", "password": "wrong"}),
    ));
    let error = bad.open().await.unwrap_err();
    assert!(!error.is_transient(), "{error}");
    let message = error.to_string();
    assert!(
        message.contains("401") && message.contains("username/password or api_key"),
        "{message}"
    );
    assert!(!message.contains("wrong"), "the password leaked: {message}");

    let keyed =
        SearchServer::start_with(Flavor::OpenSearch2, ServerAuth::ApiKey("aWQ6a2V5".into())).await;
    let sink = open(&config(&keyed, json!({"api_key": "aWQ6a2V5"}))).await;
    sink.write(&topic(), &messages(numbered(1))).await.unwrap();
    assert_eq!(keyed.seen()[0].headers["authorization"], "ApiKey aWQ6a2V5");
}

#[tokio::test]
async fn a_missing_index_the_cluster_will_not_create_is_fatal_and_names_the_fix() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    server.set_auto_create_index(false);
    let sink = open(&config(
        &server,
        json!({"create_index_if_not_exists": false}),
    ))
    .await;
    let error = sink
        .write(&topic(), &messages(numbered(2)))
        .await
        .unwrap_err();
    let SinkError::Fatal(reason) = error else {
        panic!("expected fatal, got {error:?}");
    };
    assert!(
        reason.to_string().contains("create_index_if_not_exists"),
        "{reason}"
    );
}

#[tokio::test]
async fn a_starting_cluster_at_open_is_transient() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    server.set_down(true);
    let mut sink = build(&config(&server, json!({})));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
}

#[tokio::test]
async fn nothing_listening_at_open_is_transient_and_a_fresh_sink_opens_and_writes_once_the_cluster_is_up()
 {
    let socket = support::elasticsearch::reserve();
    let mut plugin_config = upstream_plugin_config();
    plugin_config["url"] = json!(format!("http://{}", socket.local_addr().unwrap()));
    let mut sink = build(&plugin_config);
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Transient(_)), "{error:?}");
    assert!(
        error
            .to_string()
            .contains(&socket.local_addr().unwrap().to_string()),
        "names the cluster: {error}"
    );
    let server = SearchServer::start_on(Flavor::Elasticsearch8, ServerAuth::None, socket).await;
    // The engine opens a fresh instance.
    let sink = open(&plugin_config).await;
    sink.write(&topic(), &messages(numbered(3))).await.unwrap();
    assert_eq!(server.documents("iggy_messages").len(), 3);
}

#[tokio::test]
async fn a_refused_index_config_at_open_is_fatal_and_names_index_mapping() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let mapping = json!({"mappings": {"properties": {"n": {"type": "lnog"}}}});
    let mut sink = build(&config(&server, json!({"index_mapping": mapping})));
    let error = sink.open().await.unwrap_err();
    assert!(matches!(error, ConnectorError::Fatal(_)), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("mapper_parsing_exception") && message.contains("index_mapping"),
        "{message}"
    );
}

#[tokio::test]
async fn upstreams_example_file_runs_against_the_test_server() {
    let mut plugin_config = upstream_plugin_config();
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    plugin_config["url"] = json!(server.url());
    let sink = open(&plugin_config).await;
    sink.write(&topic(), &messages(numbered(3))).await.unwrap();
    assert_eq!(server.documents("iggy_messages").len(), 3);
}

// Through the runtime.

struct Pipeline {
    bus: MemoryBus,
    runtime: Arc<Runtime>,
    stream: String,
    key: String,
}

impl Pipeline {
    async fn start(
        name: &str,
        payloads: Vec<Value>,
        plugin_config: Value,
        on_error: OnError,
    ) -> Self {
        let stream = format!("es-sink-{name}");
        let bus = MemoryBus::new();
        support::sinks::send(
            &bus,
            &stream,
            TOPIC,
            1,
            payloads
                .iter()
                .map(|payload| serde_json::to_vec(payload).unwrap()),
        )
        .await;
        let runtime = Runtime::new(
            Arc::new(bus.clone()),
            Arc::new(MemoryStateStore::new()),
            Duration::from_secs(2),
        );
        runtime
            .add(ConnectorConfig {
                kind: ConnectorKind::Sink,
                key: name.into(),
                enabled: true,
                version: 0,
                name: name.into(),
                path: "libiggy_connector_elasticsearch_sink".into(),
                connector: "elasticsearch".into(),
                plugin_config_format: None,
                plugin_config,
                verbose: false,
                benchmark: false,
                transforms: Vec::new(),
                dead_letter: Some(DeadLetterTarget {
                    stream: stream.clone(),
                    topic: "dead".into(),
                }),
                kind_config: KindConfig::Sink {
                    streams: vec![SinkStream {
                        stream: stream.clone(),
                        topics: vec![TOPIC.into()],
                        schema: Schema::Json,
                        batch_length: 1000,
                        poll_interval: Duration::from_millis(5),
                        consumer_group: GROUP.into(),
                    }],
                    on_error,
                },
                file: None,
            })
            .unwrap();
        runtime.start_enabled().await;
        Self {
            bus,
            runtime,
            stream,
            key: name.into(),
        }
    }

    fn drained(&self) -> bool {
        self.bus.is_drained(&self.stream, TOPIC, GROUP)
    }

    fn committed(&self) -> Option<u64> {
        self.bus.committed_offset(&self.stream, TOPIC, GROUP, 0)
    }

    fn view(&self) -> iggy_connect::engine::runtime::ConnectorView {
        self.runtime.view(ConnectorKind::Sink, &self.key).unwrap()
    }
}

#[tokio::test]
async fn a_refused_document_is_dead_lettered_and_the_rest_committed() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    let mapping = json!({"mappings": {"properties": {"n": {"type": "long"}}}});
    let mut payloads = numbered(4);
    payloads[2] = json!({"n": "two"});
    let pipeline = Pipeline::start(
        "dlq",
        payloads,
        config(&server, json!({"index_mapping": mapping})),
        OnError::Dlq,
    )
    .await;
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(server.documents("iggy").len(), 3);
    let dead = pipeline.bus.messages(&pipeline.stream, "dead");
    assert_eq!(dead.len(), 1);
    assert_eq!(pipeline.view().metrics.dead_lettered.get(), 1);
    assert_eq!(
        server.bulk_requests().len(),
        1,
        "written documents are not sent again"
    );
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn offsets_stay_put_while_the_cluster_is_down_and_move_once_it_is_back() {
    let server = SearchServer::start(Flavor::OpenSearch2).await;
    for _ in 0..10_000 {
        server.fail_next_bulk(503, None);
    }
    let pipeline = Pipeline::start(
        "outage",
        numbered(3),
        config(&server, json!({"max_retries": 1})),
        OnError::Stop,
    )
    .await;
    eventually("the engine retried the batch", DEADLINE, async || {
        pipeline.view().metrics.retries.get() >= 2
    })
    .await;
    assert_eq!(pipeline.committed(), None, "nothing committed while down");
    assert_eq!(pipeline.view().status.status, Status::Running);
    server.clear_faults();
    eventually("the batch is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(pipeline.committed(), Some(2));
    assert_eq!(server.documents("iggy").len(), 3);
    pipeline.runtime.shutdown().await;
}

#[tokio::test]
async fn a_whole_request_429_is_transient_with_its_retry_after_and_nothing_waits_inside_the_sink() {
    let server = SearchServer::start(Flavor::Elasticsearch8).await;
    server.fail_next_bulk(429, Some(1));
    let sink = open(&config(&server, json!({}))).await;
    let batch = messages(numbered(2));
    let error = sink.write(&topic(), &batch).await.unwrap_err();
    assert!(
        matches!(error, SinkError::Transient { retry_after: Some(wait), .. } if wait == Duration::from_secs(1)),
        "{error:?}"
    );
    assert_eq!(server.bulk_requests().len(), 1);
    sink.write(&topic(), &batch).await.unwrap();
    assert_eq!(server.documents("iggy").len(), 2);
}

#[tokio::test]
async fn upstreams_file_against_a_cluster_that_comes_up_after_the_runtime_indexes_every_record() {
    let socket = support::elasticsearch::reserve();
    let mut plugin_config = upstream_plugin_config();
    plugin_config["url"] = json!(format!("http://{}", socket.local_addr().unwrap()));
    let pipeline = Pipeline::start("late", numbered(5), plugin_config, OnError::Stop).await;
    eventually(
        "a failed open while nothing listens",
        DEADLINE,
        async || {
            let view = pipeline.view();
            view.status.status == Status::Starting && view.metrics.open_retries.get() >= 1
        },
    )
    .await;
    let server = SearchServer::start_on(Flavor::Elasticsearch8, ServerAuth::None, socket).await;
    eventually("every record is committed", DEADLINE, async || {
        pipeline.drained()
    })
    .await;
    assert_eq!(server.documents("iggy_messages").len(), 5);
    assert_eq!(pipeline.view().status.status, Status::Running);
    pipeline.runtime.shutdown().await;
}
