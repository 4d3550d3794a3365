//! The mqtt source and sink over WebSocket (`ws://`, and `wss://` with
//! rustls) against a real `mosquitto` with WebSocket listeners, the TLS one
//! serving a certificate of a test PKI made at test time
//! (tests/support/pki.rs): the pipelines deliver each message once over both,
//! with mutual TLS on `wss://`, and a wrong CA is fatal at open naming
//! `ca_file`.
#![cfg(all(feature = "mqtt-source", feature = "mqtt-sink"))]

use serde_json::json;

use crate::mqtt_tls::{
    open_errors, pipelines_through, tls_fields, wrong_ca_refused_unless_unverified,
};
use crate::support::mosquitto::Mosquitto;
use crate::support::pki::TestPki;

mod a_sink_and_a_source_over_websocket_deliver_each_message_once {
    use super::*;

    async fn plain(version: &str) {
        let pki = TestPki::generate();
        let broker = Mosquitto::with_websockets(&pki, false);
        pipelines_through(&broker, &broker.ws_url(), "", version).await;
    }

    async fn mutual_tls(version: &str) {
        let pki = TestPki::generate();
        let broker = Mosquitto::with_websockets(&pki, true);
        pipelines_through(&broker, &broker.wss_url(), &tls_fields(&pki, true), version).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ws_on_mqtt_3_1_1() {
        plain("3.1.1").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ws_on_mqtt_5() {
        plain("5").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wss_with_mutual_tls_on_mqtt_3_1_1() {
        mutual_tls("3.1.1").await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn wss_with_mutual_tls_on_mqtt_5() {
        mutual_tls("5").await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_over_wss_is_refused_at_open_naming_ca_file_and_tls_verify_false_accepts_it() {
    let pki = TestPki::generate();
    let broker = Mosquitto::with_websockets(&pki, false);
    wrong_ca_refused_unless_unverified(&pki, &broker.wss_url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wss_broker_wanting_a_client_certificate_refuses_none_naming_cert_file() {
    let pki = TestPki::generate();
    let broker = Mosquitto::with_websockets(&pki, true);
    for error in open_errors(json!({"url": broker.wss_url(), "ca_file": pki.ca})).await {
        assert!(!error.is_transient(), "{error}");
        assert!(
            error.to_string().contains("plugin_config.cert_file"),
            "{error}"
        );
    }
}
