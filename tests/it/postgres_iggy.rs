//! Postgres to Postgres through Iggy: the Postgres source produces rows into the
//! in-process Iggy test server with the real `iggy` client, and the Postgres sink
//! writes them into another table, with a broker outage in the middle.
//! Run through `scripts/with-postgres.sh` (as `scripts/test` does).
#![cfg(all(feature = "postgres-source", feature = "postgres-sink"))]

use std::sync::Arc;
use std::time::Duration;

use iggy_connect::connectors::ConnectorKind;
use iggy_connect::engine::Runtime;
use iggy_connect::iggy::{ConnectionSettings, IggyBus};
use iggy_connect::state::FileStateStore;

use crate::support::iggy_server::IggyTestServer;
use crate::support::postgres::{
    connect, count, database_url, execute, sink_config, source_config, unique, wait_for,
};

const LONG: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_reach_the_target_table_through_iggy_once_each_despite_refused_sends() {
    let pool = connect(&database_url()).await;
    let (orders, copies) = (unique("orders"), unique("order_copies"));
    execute(
        &pool,
        &format!(
            "CREATE TABLE {orders} (id BIGSERIAL PRIMARY KEY, name TEXT NOT NULL);\
             INSERT INTO {orders} (name) SELECT 'order ' || n FROM generate_series(1, 2500) AS n"
        ),
    )
    .await;
    let server = IggyTestServer::start();
    let state = tempfile::tempdir().unwrap();
    let runtime = Runtime::new(
        Arc::new(IggyBus::new(ConnectionSettings::password(
            server.address().to_string(),
            "iggy",
            "iggy",
        ))),
        Arc::new(FileStateStore::new(state.path()).unwrap()),
        Duration::from_secs(5),
    );
    let url = database_url();
    runtime
        .add(source_config(
            "pg-source",
            "shop",
            "orders",
            "json",
            &format!(
                "connection_string = \"{url}\"\ntables = [\"{orders}\"]\nbatch_size = 300\npoll_interval = \"20ms\""
            ),
        ))
        .unwrap();
    runtime
        .add(sink_config(
            "pg-sink",
            "shop",
            "orders",
            "json",
            "stop",
            &format!(
                "connection_string = \"{url}\"\ntarget_table = \"{copies}\"\nauto_create_table = true\n\
                 payload_format = \"jsonb\"\nbatch_size = 200"
            ),
        ))
        .unwrap();
    server.faults().refuse_sends(3);
    runtime.start_enabled().await;

    wait_for("every row in the topic", LONG, || async {
        server.message_count("shop", "orders") >= 2500
    })
    .await;
    wait_for("every row in the target table", LONG, || async {
        count(&pool, &format!("SELECT count(*) FROM {copies}")).await == 2500
    })
    .await;
    let distinct = count(
        &pool,
        &format!("SELECT count(DISTINCT payload->'data'->>'id') FROM {copies}"),
    )
    .await;
    assert_eq!(distinct, 2500, "each source row once in the target table");
    assert_eq!(
        server.message_count("shop", "orders"),
        2500,
        "refused sends stored nothing twice"
    );
    let source = runtime.view(ConnectorKind::Source, "pg-source").unwrap();
    assert_eq!(source.metrics.nacks.get(), 3);
    runtime.shutdown().await;
}
