//! The mqtt source and sink over TLS (`mqtts://`, rustls) against a real
//! `mosquitto` with a TLS listener serving a certificate of a test PKI made
//! at test time (tests/support/pki.rs): the pipelines deliver with the
//! certificate checked (and with mutual TLS), and a wrong CA or a missing
//! client certificate is fatal at open, naming the field to fix.
#![cfg(all(feature = "mqtt-source", feature = "mqtt-sink"))]

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use iggy_connect::connectors::{ConnectorError, Registry};
use serde_json::{Value, json};

use crate::support;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::IggyTestServer;
use crate::support::mosquitto::{Collector, Mosquitto, create_session, publish};
use crate::support::pki::TestPki;
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);

/// The TLS fields of `pki` as TOML lines: its CA and, with `client`, its
/// client certificate.
pub(crate) fn tls_fields(pki: &TestPki, client: bool) -> String {
    let mut fields = format!("ca_file = {:?}\n", pki.ca.display().to_string());
    if client {
        fields += &format!(
            "cert_file = {:?}\nkey_file = {:?}\n",
            pki.client_cert.display().to_string(),
            pki.client_key.display().to_string()
        );
    }
    fields
}

async fn pipelines_over_tls(version: &str) {
    let pki = TestPki::generate();
    let broker = Mosquitto::with_tls(&pki, true);
    pipelines_through(&broker, &broker.tls_url(), &tls_fields(&pki, true), version).await;
}

/// A sink and a source reaching `broker` at `url` with the extra plugin
/// config lines `tls`: the sink publishes 200 messages of Iggy to a QoS 1
/// subscriber of the plain listener, the source takes 100 readings published
/// there into Iggy, each once.
pub(crate) async fn pipelines_through(broker: &Mosquitto, url: &str, tls: &str, version: &str) {
    let iggy = IggyTestServer::start();
    let collector = Collector::start(broker.port, "iggy/shop/orders", "iggy/shop/orders").await;
    create_session(broker.port, "iggy-connect-source-from-mqtts", "sensors/+").await;
    let readings = (0..100u64)
        .map(|n| Bytes::from(json!({ "n": n }).to_string()))
        .collect();
    publish(broker.port, "sensors/eu", readings).await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..201).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "to-mqtts"
            path = "mqtt"
            [[streams]]
            stream = "shop"
            topics = ["orders"]
            schema = "json"
            poll_interval = "5ms"
            [plugin_config]
            url = "{url}"
            topic = "iggy/{{stream}}/{{topic}}"
            protocol_version = "{version}"
            {tls}
            "#
        )))
        .unwrap();
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "from-mqtts"
            path = "mqtt"
            [[streams]]
            stream = "sensors"
            topic = "readings"
            schema = "raw"
            [plugin_config]
            url = "{url}"
            topics = ["sensors/+"]
            protocol_version = "{version}"
            {tls}
            "#
        )))
        .unwrap();
    runtime.start_enabled().await;
    wait_for("the sink's offset to cover the topic", LONG, || {
        iggy.stored_offset("shop", "orders", "iggy-connect-sink-to-mqtts", 0) == Some(199)
    })
    .await;
    wait_for("every reading in Iggy", LONG, || {
        iggy.messages("sensors", "readings").len() >= 100
    })
    .await;
    runtime.shutdown().await;
    collector.settled().await.unwrap();
    let expected: Vec<Bytes> = (1..201u64)
        .map(|n| Bytes::from(json!({ "n": n }).to_string()))
        .collect();
    assert_eq!(
        collector.received(),
        expected,
        "each message once, in order"
    );
    let mut seen = BTreeMap::new();
    for message in iggy.messages("sensors", "readings") {
        let value: Value = serde_json::from_slice(&message.payload).unwrap();
        *seen.entry(value["n"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(
        seen,
        (0..100u64).map(|n| (n, 1)).collect(),
        "each reading once"
    );
}

mod a_sink_and_a_source_over_mutual_tls_deliver_with_certificates_checked {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_mqtt_3_1_1() {
        super::pipelines_over_tls("3.1.1").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn on_mqtt_5() {
        super::pipelines_over_tls("5").await;
    }
}

/// Opens the mqtt sink and source built from `fields` (plus url and
/// topics) and returns their errors.
pub(crate) async fn open_errors(fields: Value) -> Vec<ConnectorError> {
    let mut sink_config = fields.clone();
    sink_config["topic"] = json!("t");
    let mut sink = support::sinks::build("mqtt", &sink_config);
    let sink_error = sink.open().await.expect_err("the sink's open must fail");
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "mqtt")
        .unwrap();
    let mut source_config = fields;
    source_config["topics"] = json!(["t"]);
    let mut source = (entry.build)(&source_config).unwrap();
    let source_error = source
        .open(None)
        .await
        .expect_err("the source's open must fail");
    vec![sink_error, source_error]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_at_open_naming_ca_file_and_tls_verify_false_accepts_it() {
    let pki = TestPki::generate();
    let broker = Mosquitto::with_tls(&pki, false);
    wrong_ca_refused_unless_unverified(&pki, &broker.tls_url()).await;
}

/// With `url` served by a certificate `pki.other_ca` did not sign: the sink
/// and the source, on either protocol version, fail for good at open naming
/// `ca_file`; with `tls_verify = false` the sink connects.
pub(crate) async fn wrong_ca_refused_unless_unverified(pki: &TestPki, url: &str) {
    for version in ["3.1.1", "5"] {
        let fields = json!({"url": url, "ca_file": pki.other_ca,
            "protocol_version": version});
        for error in open_errors(fields).await {
            assert!(!error.is_transient(), "{error}");
            let text = error.to_string();
            assert!(text.contains("plugin_config.ca_file"), "{text}");
            assert!(text.contains("UnknownIssuer"), "{text}");
        }
    }
    let mut unverified = support::sinks::build(
        "mqtt",
        &json!({"url": url, "topic": "t", "ca_file": pki.other_ca,
            "tls_verify": false}),
    );
    unverified
        .open()
        .await
        .expect("tls_verify = false connects to any certificate");
    unverified.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_wanting_a_client_certificate_refuses_none_or_a_foreign_one_naming_cert_file() {
    let pki = TestPki::generate();
    let broker = Mosquitto::with_tls(&pki, true);
    let without = json!({"url": broker.tls_url(), "ca_file": pki.ca});
    let foreign = json!({"url": broker.tls_url(), "ca_file": pki.ca,
        "cert_file": pki.other_client_cert, "key_file": pki.other_client_key});
    for fields in [without, foreign] {
        for error in open_errors(fields.clone()).await {
            assert!(!error.is_transient(), "{fields}: {error}");
            assert!(
                error.to_string().contains("plugin_config.cert_file"),
                "{fields}: {error}"
            );
        }
    }
}
