//! The rabbitmq source and sink over TLS (AMQPS, rustls) against a real
//! RabbitMQ broker whose AMQPS listener serves a certificate of a test PKI
//! made at test time (tests/support/rabbitmq.rs, tests/support/pki.rs): the
//! pipelines deliver with the certificate checked (the source with a client
//! certificate the broker verifies), and a wrong CA or a client certificate
//! the broker does not trust is fatal at open, naming the field to fix.
#![cfg(all(feature = "rabbitmq-source", feature = "rabbitmq-sink"))]

use std::collections::BTreeMap;
use std::time::Duration;

use amqprs::channel::ExchangeDeclareArguments;
use iggy_connect::connectors::{ConnectorError, Registry};
use serde_json::{Value, json};

use crate::support;
use crate::support::harness::{connector, iggy_client, produce_ns, runtime};
use crate::support::iggy_server::IggyTestServer;
use crate::support::rabbitmq::{client, publish, shared, unique};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(90);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
/// The sink reaches the broker through an `amqps://` URI, the source through
/// `host`, `port` and the TLS fields.
async fn a_sink_and_a_source_over_amqps_deliver_with_certificates_checked() {
    let (port, tls_port, ca, client_cert, client_key) = {
        let broker = shared();
        let pki = &broker.pki;
        (
            broker.port,
            broker.tls_port,
            pki.ca.display().to_string(),
            pki.client_cert.display().to_string(),
            pki.client_key.display().to_string(),
        )
    };
    let iggy = IggyTestServer::start();
    let (exchange, out_queue, in_queue) = (unique("x"), unique("q"), unique("q"));
    let probe = client(port).await;
    probe
        .channel
        .exchange_declare(
            ExchangeDeclareArguments::new(&exchange, "topic")
                .durable(true)
                .finish(),
        )
        .await
        .unwrap();
    probe.queue(&out_queue, Some((&exchange, "iggy.#"))).await;
    probe.queue(&in_queue, None).await;
    publish(
        port,
        &in_queue,
        (0..100u64).map(|n| json!({ "n": n }).to_string().into_bytes()),
    )
    .await;
    iggy.create_topic("shop", "orders", 1);
    produce_ns(&iggy_client(&iggy).await, "shop", "orders", 1..201).await;
    let state = tempfile::tempdir().unwrap();
    let runtime = runtime(&iggy, state.path());
    runtime
        .add(connector(&format!(
            r#"
            type = "sink"
            key = "to-amqps"
            path = "rabbitmq"
            [[streams]]
            stream = "shop"
            topics = ["orders"]
            schema = "json"
            poll_interval = "5ms"
            [plugin_config]
            uri = "amqps://guest:guest@127.0.0.1:{tls_port}/"
            ca_file = "{ca}"
            exchange = "{exchange}"
            exchange_type = "topic"
            routing_key = "iggy.{{stream}}.{{topic}}"
            "#
        )))
        .unwrap();
    runtime
        .add(connector(&format!(
            r#"
            type = "source"
            key = "from-amqps"
            path = "rabbitmq"
            [[streams]]
            stream = "orders"
            topic = "created"
            schema = "raw"
            [plugin_config]
            host = "localhost"
            port = {tls_port}
            ca_file = "{ca}"
            cert_file = "{client_cert}"
            key_file = "{client_key}"
            queue = "{in_queue}"
            "#
        )))
        .unwrap();
    runtime.start_enabled().await;
    eventually("every Iggy message in the queue", LONG, async || {
        probe.ready(&out_queue).await >= 200
    })
    .await;
    wait_for("every queued message in Iggy", LONG, || {
        iggy.messages("orders", "created").len() >= 100
    })
    .await;
    runtime.shutdown().await;
    let ids: Vec<String> = probe
        .drain(&out_queue)
        .await
        .iter()
        .map(|(properties, _)| properties.message_id().cloned().unwrap_or_default())
        .collect();
    let expected: Vec<String> = (1..201).map(|id: u128| id.to_string()).collect();
    assert_eq!(ids, expected, "each message once, in order");
    let mut seen = BTreeMap::new();
    for message in iggy.messages("orders", "created") {
        let value: Value = serde_json::from_slice(&message.payload).unwrap();
        *seen.entry(value["n"].as_u64().unwrap()).or_insert(0) += 1;
    }
    assert_eq!(seen, (0..100u64).map(|n| (n, 1)).collect(), "each once");
    assert_eq!(probe.ready(&in_queue).await, 0, "every message acked");
}

/// Opens the rabbitmq sink and source built from `fields` (plus what each
/// needs) and returns their errors.
async fn open_errors(fields: Value) -> Vec<ConnectorError> {
    let mut sink_config = fields.clone();
    sink_config["routing_key"] = json!("k");
    let mut sink = support::sinks::build("rabbitmq", &sink_config);
    let sink_error = sink.open().await.expect_err("the sink's open must fail");
    let entry = Registry::sources()
        .iter()
        .find(|entry| entry.name == "rabbitmq")
        .unwrap();
    let mut source_config = fields;
    source_config["queue"] = json!(unique("q"));
    source_config["declare_queue"] = json!(true);
    let mut source = (entry.build)(&source_config).unwrap();
    let source_error = source
        .open(None)
        .await
        .expect_err("the source's open must fail");
    vec![sink_error, source_error]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_an_untrusted_client_certificate_or_a_bad_login_over_tls_is_fatal_naming_the_field()
 {
    let (tls_port, ca, other_ca, other_cert, other_key) = {
        let broker = shared();
        let pki = &broker.pki;
        (
            broker.tls_port,
            pki.ca.clone(),
            pki.other_ca.clone(),
            pki.other_client_cert.clone(),
            pki.other_client_key.clone(),
        )
    };
    for error in open_errors(json!({"port": tls_port, "ca_file": other_ca})).await {
        assert!(!error.is_transient(), "{error}");
        let text = error.to_string();
        assert!(text.contains("plugin_config.ca_file"), "{text}");
        assert!(text.contains("UnknownIssuer"), "{text}");
    }
    let foreign = json!({"port": tls_port, "ca_file": ca.clone(), "cert_file": other_cert,
        "key_file": other_key});
    for error in open_errors(foreign).await {
        assert!(!error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("plugin_config.cert_file"),
            "{error}"
        );
    }
    // Over TLS a refused login still names the credentials, not the certificate.
    let wrong_password = json!({"port": tls_port, "ca_file": ca, "password": "wrong"});
    for error in open_errors(wrong_password).await {
        assert!(!error.is_transient(), "{error}");
        assert!(
            error
                .to_string()
                .contains("plugin_config.username/password"),
            "{error}"
        );
    }
    let mut unverified = support::sinks::build(
        "rabbitmq",
        &json!({"port": tls_port, "ca_file": other_ca, "tls_verify": false,
            "routing_key": "k"}),
    );
    unverified
        .open()
        .await
        .expect("tls_verify = false connects to any certificate");
    unverified.close().await.unwrap();
}
