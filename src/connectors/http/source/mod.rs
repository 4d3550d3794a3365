//! `http` source: clients POST messages (webhooks, services), we produce them
//! into Iggy.
//!
//! With the default `ack = "durable"` a client gets 2xx only once the batch
//! holding its messages is committed (in Iggy). Concurrent requests share one
//! batch, so durability costs one broker round trip per batch, not per request.
//! While the broker is down the engine retries the batch in flight and never
//! polls; new requests wait up to `request_timeout` and then get 503 with
//! `Retry-After`. A request that timed out before its messages were taken into
//! a batch is withdrawn: they are never delivered. One that timed out while its
//! messages were in the batch being retried gets 503 with
//! `"maybe_delivered": true`: that batch may still reach Iggy, so the client's
//! retry may duplicate (at-least-once: duplicates, never loss). Sending an
//! `Idempotency-Key` makes the retry carry the same message ids.
//!
//! `ack = "accepted"` answers 202 as soon as the messages are queued in memory:
//! faster, but what is queued is lost if the process dies.
//!
//! The source keeps no state: what it accepted lives in its clients until they
//! get 2xx. It never stops on NACKs by default (a broker outage must not stop
//! the listener).

mod body;
mod config;
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use axum_server::Handle;
use serde_json::json;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::connectors::{
    BatchPolicy, ConnectorContext, ConnectorError, PluginConfigError, Source, SourceBatch,
    parse_plugin_config,
};
use crate::connectors::{SourceEntry, schema_of};

pub use body::BodyFormat;
pub use config::{AckMode, EndpointConfig, HttpSourceConfig};
pub use server::message_id;

use crate::connectors::kit::inbox::{Inbox, Limits};
use crate::connectors::kit::listener::ConnectionLimits;
use crate::connectors::record_check::RecordCheck;

pub const ENTRY: SourceEntry = SourceEntry {
    name: "http",
    feature: "http-source",
    description: "listens for HTTP POSTs (webhooks) and produces them into Iggy, answering once durable",
    secret_fields: &["endpoints.*.token"],
    sample_config: "address = \"127.0.0.1:8080\"\nack = \"durable\"\n\n[[endpoints]]\npath = \"/events\"\ntoken = \"secret-token\"\n",
    config_schema: schema_of::<HttpSourceConfig>,
    build: |config| Ok(Box::new(HttpSource::new(parse_plugin_config(config)?)?)),
};
inventory::submit!(ENTRY);

/// How long `close` waits for open connections to finish after every waiting
/// client was answered.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct HttpSource {
    config: Arc<HttpSourceConfig>,
    inbox: Arc<Inbox>,
    key: String,
    record_check: RecordCheck,
    server: Option<Server>,
}

struct Server {
    address: SocketAddr,
    stop: Handle<SocketAddr>,
    task: JoinHandle<()>,
}

impl HttpSource {
    pub fn new(config: HttpSourceConfig) -> Result<Self, PluginConfigError> {
        config.validate()?;
        let inbox = Arc::new(Inbox::new(Limits {
            batch_length: config.batch_length,
            linger_time: config.linger_time,
            max_waiting_messages: config.max_waiting_messages,
            unhealthy_after: config.unhealthy_after,
        }));
        Ok(Self {
            config: Arc::new(config),
            inbox,
            key: String::new(),
            record_check: RecordCheck::default(),
            server: None,
        })
    }

    /// The address the listener is bound to, once open.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|server| server.address)
    }
}

#[async_trait]
impl Source for HttpSource {
    async fn open(&mut self, state: Option<&[u8]>) -> Result<(), ConnectorError> {
        if state.is_some() {
            debug!(connector_key = %self.key, "the http source keeps no state; ignoring the stored one");
        }
        let address = &self.config.address;
        let listener = tokio::net::TcpListener::bind(address.as_str())
            .await
            .map_err(|error| {
                ConnectorError::fatal(format!("cannot listen on {address}: {error}"))
            })?;
        let address = listener.local_addr().map_err(|error| {
            ConnectorError::fatal(format!("cannot read the listener's address: {error}"))
        })?;
        let shared = Arc::new(server::Shared::new(
            self.config.clone(),
            self.inbox.clone(),
            self.key.clone(),
            self.record_check.clone(),
        ));
        let listener = listener.into_std().map_err(|error| {
            ConnectorError::fatal(format!("cannot use the listener on {address}: {error}"))
        })?;
        let limits = ConnectionLimits {
            max_connections: self.config.max_connections,
            header_read_timeout: self.config.header_read_timeout,
            idle_timeout: self.config.effective_idle_timeout(),
            retry_after_secs: self.config.retry_after_secs(),
        };
        let refusal = json!({
            "error": "too_many_connections",
            "message": format!(
                "this listener already has its {} connections (max_connections) open; retry later",
                self.config.max_connections
            ),
        });
        let refused = metrics::counter!(
            "iggy_connector_http_connections_refused_total",
            "connector_key" => self.key.clone()
        );
        let stop = Handle::new();
        let server = axum_server::from_tcp(listener)
            .map_err(|error| {
                ConnectorError::fatal(format!("cannot use the listener on {address}: {error}"))
            })?
            .acceptor(limits.acceptor(refusal.to_string(), refused))
            .handle(stop.clone());
        let server = limits.configure(server);
        let serve = server.serve(server::router(shared).into_make_service());
        let key = self.key.clone();
        let task = tokio::spawn(async move {
            if let Err(error) = serve.await {
                warn!(connector_key = %key, %error, "the http source listener failed");
            }
        });
        info!(connector_key = %self.key, %address, ack = ?self.config.ack, "http source listening");
        self.server = Some(Server {
            address,
            stop,
            task,
        });
        Ok(())
    }

    async fn poll(&self) -> Result<SourceBatch, ConnectorError> {
        let records = self.inbox.next_batch().await;
        Ok(SourceBatch {
            records,
            state: None,
            finished: false,
            next_poll: None,
        })
    }

    async fn commit(&self) -> Result<(), ConnectorError> {
        let answered = self.inbox.commit();
        debug!(connector_key = %self.key, answered, "batch committed, clients answered");
        Ok(())
    }

    fn max_in_flight(&self) -> usize {
        crate::config::connector::MAX_IN_FLIGHT as usize
    }

    /// Its accepted input lives in memory (in its clients, with durable acks):
    /// stopping on a broker outage would turn the outage into refused requests
    /// for good.
    fn batch_policy(&self) -> BatchPolicy {
        BatchPolicy::never_stop()
    }

    /// A durable ack tells the client its data is stored; it will not send it again.
    fn destructive(&self) -> bool {
        self.config.ack == AckMode::Durable
    }

    fn attach(&mut self, context: ConnectorContext) {
        self.key = context.key;
        self.record_check = context.record_check;
    }

    async fn close(&mut self) -> Result<(), ConnectorError> {
        let (answered, dropped) = self.inbox.close();
        if dropped > 0 {
            warn!(connector_key = %self.key, messages = dropped, "closing with messages already acknowledged with 202 (ack = \"accepted\") and not yet in Iggy: they are lost");
        }
        let Some(server) = self.server.take() else {
            return Ok(());
        };
        // Connections still open after the grace period are closed.
        server.stop.graceful_shutdown(Some(CLOSE_TIMEOUT));
        let mut task = server.task;
        if tokio::time::timeout(CLOSE_TIMEOUT * 2, &mut task)
            .await
            .is_err()
        {
            warn!(connector_key = %self.key, "open connections did not finish in time; closing them");
            task.abort();
        }
        info!(connector_key = %self.key, address = %server.address, answered, "http source closed");
        Ok(())
    }
}

impl Drop for HttpSource {
    /// A source dropped without `close` (its task aborted) must still answer
    /// its clients and free the port.
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.inbox.close();
            server.stop.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source() -> HttpSource {
        let config = parse_plugin_config(&serde_json::json!({"address": "127.0.0.1:0"})).unwrap();
        HttpSource::new(config).unwrap()
    }

    #[tokio::test]
    async fn given_a_port_in_use_when_opened_should_fail_naming_the_address() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = taken.local_addr().unwrap();
        let config: HttpSourceConfig =
            parse_plugin_config(&serde_json::json!({"address": address.to_string()})).unwrap();
        let mut source = HttpSource::new(config).unwrap();
        let error = source.open(None).await.unwrap_err();
        assert!(!error.is_transient());
        assert!(
            error
                .to_string()
                .contains(&format!("cannot listen on {address}")),
            "{error}"
        );
    }

    #[tokio::test]
    async fn given_an_open_source_when_closed_should_release_the_port() {
        let mut source = source();
        source.open(None).await.unwrap();
        let address = source.local_addr().unwrap();
        source.close().await.unwrap();
        std::net::TcpListener::bind(address).expect("port released");
    }

    #[test]
    fn given_defaults_when_asked_for_batch_policy_should_never_stop() {
        assert_eq!(source().batch_policy(), BatchPolicy::never_stop());
    }
}
