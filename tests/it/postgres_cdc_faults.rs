//! The postgres source in `mode = "cdc"` under `kill -9`: the real binary
//! into the in-process Iggy test server, killed at random points while rows are
//! inserted; every row arrives, duplicates stay within what was in flight.
//! Run through `scripts/with-postgres.sh`.
#![cfg(feature = "postgres-source")]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::postgres::{connect, database_url, execute, unique};
use crate::support::wait::{eventually, wait_for};

const LONG: Duration = Duration::from_secs(60);
const ROWS: i64 = 1500;
const PER_TRANSACTION: i64 = 5;
const BATCH: usize = 50;
/// Batches polled and not committed: what a kill may send again.
const IN_FLIGHT: usize = 2;

fn ids_in_topic(server: &IggyTestServer, stream: &str) -> BTreeMap<i64, usize> {
    let mut seen = BTreeMap::new();
    for message in server.messages(stream, "changes") {
        let record: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        *seen
            .entry(record["data"]["id"].as_i64().unwrap())
            .or_insert(0) += 1;
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_mid_stream_loses_no_change_and_repeats_at_most_the_batches_in_flight() {
    let kills: usize = 5;
    let pool = connect(&database_url()).await;
    let table = unique("cdc_kill");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, body TEXT)"),
    )
    .await;
    let key = unique("cdc_kill");
    let stream = format!("{key}_stream");
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "cdc.toml",
        &format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"postgres\"\nmax_consecutive_nacks = 0\n\
             max_in_flight = {IN_FLIGHT}\n\n\
             [[streams]]\nstream = \"{stream}\"\ntopic = \"changes\"\nschema = \"json\"\n\n\
             [plugin_config]\nconnection_string = \"{}\"\nmode = \"cdc\"\ntables = [\"{table}\"]\n\
             snapshot = \"never\"\nbatch_size = {BATCH}\npoll_interval = \"20ms\"\n",
            database_url()
        ),
    );
    let slot = iggy_connect::connectors::postgres::source::derived_slot_name(&key).unwrap();
    let running = workspace.run();
    eventually("the slot", LONG, || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&slot)
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    })
    .await;
    let writer = {
        let pool = pool.clone();
        let table = table.clone();
        tokio::spawn(async move {
            for first in (1..=ROWS).step_by(PER_TRANSACTION as usize) {
                let last = first + PER_TRANSACTION - 1;
                execute(
                    &pool,
                    &format!("INSERT INTO {table} SELECT n, repeat('x', 100) FROM generate_series({first}, {last}) AS n"),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    let running = workspace
        .kill_while_progressing(running, &server, (&stream, "changes"), kills)
        .await;
    writer.await.unwrap();
    wait_for("every row", LONG, || {
        ids_in_topic(&server, &stream).len() as i64 >= ROWS
    })
    .await;
    running.terminate();
    let status = running.wait_exit(LONG);
    assert!(status.success(), "exit {status:?}\n{}", workspace.stderr());
    let seen = ids_in_topic(&server, &stream);
    let missing: Vec<i64> = (1..=ROWS).filter(|id| !seen.contains_key(id)).collect();
    assert!(missing.is_empty(), "lost changes: {missing:?}");
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    println!("scenario: cdc_sigkill_loop kills={kills} rows={ROWS} duplicates={duplicates}");
    // At most the batches in flight, each of whole transactions.
    assert!(
        duplicates <= kills * IN_FLIGHT * (BATCH + PER_TRANSACTION as usize),
        "{duplicates} duplicates after {kills} kills"
    );
    // The killed runs' sessions are gone by now; a failure only leaves a slot
    // in the throwaway cluster.
    let _ = sqlx::query("SELECT pg_drop_replication_slot($1)")
        .bind(&slot)
        .execute(&pool)
        .await;
}
