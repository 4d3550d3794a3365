//! The engine as the broker tests drive it: a connector file parsed from
//! text, a `Runtime` producing to and consuming from an Iggy test server over
//! the real `iggy` client, and a plain client of that server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iggy::prelude::{
    Client as _, Identifier, IggyClient, IggyMessage, MessageClient, Partitioning,
};
use iggy_connect::config::ConnectorConfig;
use iggy_connect::config::connector::parse_connector_file;
use iggy_connect::config::env::EnvVars;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;
use serde_json::json;

use super::iggy_server::IggyTestServer;

/// A connector file's text as its config (which must be valid).
pub fn connector(text: &str) -> ConnectorConfig {
    parse_connector_file(Path::new("test.toml"), text, &EnvVars::default())
        .unwrap_or_else(|issues| panic!("bad test config: {issues}"))
        .0
}

/// A runtime on `iggy` (user iggy/iggy), its state in `state`, a shutdown
/// timeout of 5 s.
pub fn runtime(iggy: &IggyTestServer, state: &Path) -> Arc<Runtime> {
    Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            iggy.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state).unwrap()),
        Duration::from_secs(5),
    )
}

/// A connected client of `server`.
pub async fn iggy_client(server: &IggyTestServer) -> IggyClient {
    let client = IggyClient::from_connection_string(&server.connection_string()).unwrap();
    client.connect().await.unwrap();
    client
}

/// Sends `{"n": id}` with Iggy id `id` for each id of `ids` to partition 0
/// of `stream`/`topic`, 500 per request.
pub async fn produce_ns(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    ids: std::ops::Range<u128>,
) {
    produce(client, stream, topic, ids, |id| {
        json!({ "n": id as u64 }).to_string()
    })
    .await;
}

/// Sends a message with id `id` and payload `payload(id)` for each of `ids`
/// to partition 0 of `stream`/`topic`.
pub async fn produce(
    client: &IggyClient,
    stream: &str,
    topic: &str,
    ids: std::ops::Range<u128>,
    payload: impl Fn(u128) -> String,
) {
    let mut messages: Vec<IggyMessage> = ids
        .map(|id| {
            IggyMessage::builder()
                .id(id)
                .payload(Bytes::from(payload(id)))
                .build()
                .unwrap()
        })
        .collect();
    for chunk in messages.chunks_mut(500) {
        client
            .send_messages(
                &Identifier::named(stream).unwrap(),
                &Identifier::named(topic).unwrap(),
                &Partitioning::partition_id(0),
                chunk,
            )
            .await
            .unwrap();
    }
}
