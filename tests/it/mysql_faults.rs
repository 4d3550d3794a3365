//! The mysql source under `kill -9`: the real binary into the in-process Iggy
//! test server, killed at random points while rows are inserted into a real
//! MariaDB (tests/support/mariadb.rs); every row arrives, duplicates stay
//! within what was in flight. Once in `mode = "cdc"` (the binlog position is
//! the state) and once polling with `delete_after_read` (a row deleted before
//! its batch was committed would be lost).
#![cfg(feature = "mysql-source")]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::binary::Workspace;
use crate::support::iggy_server::IggyTestServer;
use crate::support::mariadb::{connect, count, create_database, execute, unique};
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(60);
const ROWS: i64 = 1500;
const PER_TRANSACTION: i64 = 5;
const BATCH: usize = 50;
const KILLS: usize = 5;

/// How many times each row id is in the topic (both modes write the row
/// under `data`).
fn ids_in_topic(server: &IggyTestServer, stream: &str) -> BTreeMap<i64, usize> {
    let mut seen = BTreeMap::new();
    for message in server.messages(stream, "rows") {
        let record: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
        *seen
            .entry(record["data"]["id"].as_i64().unwrap())
            .or_insert(0) += 1;
    }
    seen
}

/// Inserts `ROWS` rows, `PER_TRANSACTION` per statement, while the binary is
/// killed and restarted `KILLS` times (once the first run logged `ready`);
/// checks that no row is missing and the duplicates are within what was in
/// flight, and returns the database and table.
async fn kill_while_inserting(mode: &str, ready: Option<&str>) -> (sqlx::MySqlPool, String) {
    let url = create_database("mysql_kill").await;
    let pool = connect(&url).await;
    let table = unique("kill");
    execute(
        &pool,
        &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, body TEXT)"),
    )
    .await;
    let key = unique("mysql_kill");
    let stream = format!("{key}_stream");
    let server = IggyTestServer::start();
    let workspace = Workspace::new(&server.address().to_string(), "");
    workspace.add_connector(
        "mysql.toml",
        &format!(
            "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"mysql\"\nmax_consecutive_nacks = 0\n\n\
             [[streams]]\nstream = \"{stream}\"\ntopic = \"rows\"\nschema = \"json\"\n\n\
             [plugin_config]\nconnection_string = \"{url}\"\ntables = [\"{table}\"]\n\
             batch_size = {BATCH}\npoll_interval = \"20ms\"\n{mode}\n"
        ),
    );
    let running = workspace.run();
    if let Some(ready) = ready {
        wait_for(ready, LONG, || workspace.stderr().contains(ready)).await;
    }
    let writer = {
        let pool = pool.clone();
        let table = table.clone();
        tokio::spawn(async move {
            for first in (1..=ROWS).step_by(PER_TRANSACTION as usize) {
                let values: Vec<String> = (first..first + PER_TRANSACTION)
                    .map(|id| format!("({id}, REPEAT('x', 100))"))
                    .collect();
                execute(
                    &pool,
                    &format!("INSERT INTO {table} VALUES {}", values.join(", ")),
                )
                .await;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
        })
    };
    let running = workspace
        .kill_while_progressing(running, &server, (&stream, "rows"), KILLS)
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
    assert!(missing.is_empty(), "lost rows: {missing:?}");
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    let mode = mode.replace('\n', ", ");
    println!("scenario: mysql ({mode}) kills={KILLS} rows={ROWS} duplicates={duplicates}");
    // One batch in flight (max_in_flight 1), of whole transactions.
    assert!(
        duplicates <= KILLS * (BATCH + PER_TRANSACTION as usize),
        "{duplicates} duplicates after {KILLS} kills"
    );
    (pool, table)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdc_killed_mid_stream_loses_no_change_and_repeats_at_most_the_batch_in_flight() {
    // With `snapshot = "never"` the changes start at the position the first
    // run saved: the inserts wait for it.
    kill_while_inserting(
        "mode = \"cdc\"\nsnapshot = \"never\"",
        Some("starts at the current binlog position"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_after_read_killed_mid_stream_loses_no_row_and_deletes_every_delivered_one() {
    let (pool, table) =
        kill_while_inserting("tracking_column = \"id\"\ndelete_after_read = true", None).await;
    // The last run stopped cleanly, after committing (deleting) all it sent.
    assert_eq!(
        count(&pool, &format!("SELECT COUNT(*) FROM {table}")).await,
        0
    );
}
