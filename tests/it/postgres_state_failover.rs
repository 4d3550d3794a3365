//! Scale-out with `[state] type = "postgres"`: three real `iggy-connect run`
//! processes share one source through its lease. The holder is killed
//! (`kill -9`) mid-stream, again and again; a standby takes over from the
//! shared state, and every row arrives. Run through `scripts/with-postgres.sh`.
#![cfg(all(feature = "postgres-state", feature = "postgres-source"))]

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::PgPool;

use crate::support::binary::{Running, Workspace};
use crate::support::iggy_server::IggyTestServer;
use crate::support::postgres::{connect, database_url, execute, unique};
use crate::support::wait::wait_for;

const LONG: Duration = Duration::from_secs(90);
const INSTANCES: usize = 3;
const BATCH: usize = 50;
const IN_FLIGHT: usize = 4;

struct Cluster {
    pool: PgPool,
    server: IggyTestServer,
    table: String,
    state_table: String,
    key: String,
    stream: String,
    workspaces: Vec<Workspace>,
    running: Vec<Option<Running>>,
}

impl Cluster {
    async fn start(lease: &str) -> Self {
        let pool = connect(&database_url()).await;
        let table = unique("failover_rows");
        execute(
            &pool,
            &format!("CREATE TABLE {table} (id BIGINT PRIMARY KEY, body TEXT NOT NULL)"),
        )
        .await;
        let state_table = unique("failover_state");
        let key = unique("failover");
        let stream = format!("{key}_stream");
        let server = IggyTestServer::start();
        let workspaces: Vec<Workspace> = (0..INSTANCES)
            .map(|instance| {
                let workspace = Workspace::with_state(
                    &server.address().to_string(),
                    &format!(
                        "type = \"postgres\"\nconnection_string = \"{}\"\ntable = \"{state_table}\"\n\
                         lease_duration = \"{lease}\"\ninstance_id = \"instance-{instance}\"",
                        database_url()
                    ),
                );
                workspace.add_connector(
                    "source.toml",
                    &format!(
                        "type = \"source\"\nkey = \"{key}\"\nenabled = true\npath = \"postgres\"\n\
                         max_consecutive_nacks = 0\nmax_in_flight = {IN_FLIGHT}\n\n\
                         [[streams]]\nstream = \"{stream}\"\ntopic = \"rows\"\nschema = \"json\"\n\n\
                         [plugin_config]\nconnection_string = \"{}\"\nmode = \"polling\"\n\
                         tables = [\"{table}\"]\ntracking_column = \"id\"\nbatch_size = {BATCH}\n\
                         poll_interval = \"20ms\"\n",
                        database_url()
                    ),
                );
                workspace
            })
            .collect();
        let running = workspaces
            .iter()
            .map(|workspace| Some(workspace.run()))
            .collect();
        Self {
            pool,
            server,
            table,
            state_table,
            key,
            stream,
            workspaces,
            running,
        }
    }

    /// The instance holding the source's lease, once one does.
    async fn holder(&self) -> usize {
        self.holder_within(LONG).await
    }

    async fn holder_within(&self, limit: Duration) -> usize {
        let query = format!(
            "SELECT holder FROM {}_leases WHERE key = $1 AND expires_at > now()",
            self.state_table
        );
        let started = std::time::Instant::now();
        loop {
            let holder: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(query.clone()))
                .bind(&self.key)
                .fetch_optional(&self.pool)
                .await
                .unwrap_or(None);
            let instance = holder.as_deref().and_then(|holder| {
                let instance = holder.strip_prefix("instance-")?.split('/').next()?;
                instance.parse::<usize>().ok()
            });
            if let Some(instance) = instance {
                return instance;
            }
            assert!(
                started.elapsed() < limit,
                "no instance took the lease within {limit:?}\n{}",
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn ids(&self) -> BTreeMap<i64, usize> {
        let mut seen = BTreeMap::new();
        for message in self.server.messages(&self.stream, "rows") {
            let record: serde_json::Value = serde_json::from_slice(&message.payload).unwrap();
            *seen
                .entry(record["data"]["id"].as_i64().unwrap())
                .or_insert(0) += 1;
        }
        seen
    }

    fn delivered(&self) -> u64 {
        self.server.message_count(&self.stream, "rows")
    }

    /// Stops every instance and checks each exited cleanly.
    fn stop(mut self) {
        for (index, running) in self.running.iter_mut().enumerate() {
            let running = running.take().unwrap();
            running.terminate();
            let status = running.wait_exit(LONG);
            assert!(
                status.success(),
                "instance {index} exited with {status:?}\n{}",
                self.workspaces[index].stderr()
            );
        }
    }

    fn logs(&self) -> String {
        self.workspaces
            .iter()
            .enumerate()
            .map(|(index, workspace)| format!("--- instance {index}\n{}", workspace.stderr()))
            .collect()
    }
}

async fn insert_rows(pool: &PgPool, table: &str, first: i64, last: i64) {
    execute(
        pool,
        &format!("INSERT INTO {table} SELECT n, repeat('x', 100) FROM generate_series({first}, {last}) AS n"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_lease_holder_hands_the_source_to_a_standby_and_loses_no_row() {
    const ROWS: i64 = 3000;
    let kills = 3;
    let mut cluster = Cluster::start("2s").await;
    let writer = {
        let pool = cluster.pool.clone();
        let table = cluster.table.clone();
        tokio::spawn(async move {
            for first in (1..=ROWS).step_by(10) {
                insert_rows(&pool, &table, first, first + 9).await;
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
        })
    };
    let mut killed = Vec::new();
    for _ in 0..kills {
        let before = cluster.delivered();
        wait_for("the source to make progress", LONG, || {
            cluster.delivered() > before
        })
        .await;
        let holder = cluster.holder().await;
        tokio::time::sleep(Duration::from_millis(rand::random_range(20..200))).await;
        cluster.running[holder].take().unwrap().kill();
        killed.push(holder);
        // Back as a fresh process: it waits in standby behind the new holder.
        cluster.running[holder] = Some(cluster.workspaces[holder].run());
    }
    writer.await.unwrap();
    wait_for("every row", LONG, || cluster.ids().len() as i64 >= ROWS).await;
    let seen = cluster.ids();
    let missing: Vec<i64> = (1..=ROWS).filter(|id| !seen.contains_key(id)).collect();
    assert!(
        missing.is_empty(),
        "lost rows: {missing:?}\n{}",
        cluster.logs()
    );
    let duplicates: usize = seen.values().map(|count| count - 1).sum();
    println!(
        "scenario: lease_failover produced={ROWS} delivered={} lost={} duplicates={duplicates} instances={INSTANCES} kills={kills} killed={killed:?}",
        cluster.delivered(),
        missing.len()
    );
    // What a killed holder had in flight, at most, is sent again.
    assert!(
        duplicates <= kills * IN_FLIGHT * BATCH,
        "{duplicates} duplicates after {kills} kills"
    );
    let takeovers = cluster
        .logs()
        .matches("lease taken; starting the source here")
        .count();
    assert!(
        takeovers > kills,
        "{takeovers} starts for {kills} kills\n{}",
        cluster.logs()
    );
    cluster.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_holder_releases_its_lease_and_a_standby_goes_on_from_its_state() {
    const ROWS: i64 = 500;
    // Far longer than the takeover may take: only a released lease passes.
    let mut cluster = Cluster::start("60s").await;
    insert_rows(&cluster.pool, &cluster.table, 1, ROWS).await;
    wait_for("the first rows", LONG, || {
        cluster.ids().len() as i64 >= ROWS
    })
    .await;
    let holder = cluster.holder().await;
    let running = cluster.running[holder].take().unwrap();
    running.terminate();
    assert!(running.wait_exit(LONG).success());
    // Well within the 60 s lease: only a released lease is taken this soon.
    let next = cluster.holder_within(Duration::from_secs(30)).await;
    assert_ne!(next, holder, "the stopped instance still holds the lease");
    insert_rows(&cluster.pool, &cluster.table, ROWS + 1, 2 * ROWS).await;
    wait_for("the rows after the handover", LONG, || {
        cluster.ids().len() as i64 >= 2 * ROWS
    })
    .await;
    // Resumed from the shared cursor: nothing read again.
    let duplicates: usize = cluster.ids().values().map(|count| count - 1).sum();
    assert_eq!(duplicates, 0, "{}", cluster.logs());
    // Back, it waits in standby (and has its signal handlers when stopped).
    cluster.running[holder] = Some(cluster.workspaces[holder].run());
    wait_for("the restarted instance in standby", LONG, || {
        cluster.workspaces[holder]
            .stderr()
            .contains("standby: another instance holds the lease")
    })
    .await;
    cluster.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_change_on_a_standby_is_refused_with_409_naming_the_instance_that_runs_the_source()
{
    let cluster = Cluster::start("60s").await;
    insert_rows(&cluster.pool, &cluster.table, 1, 10).await;
    wait_for("the first rows", LONG, || cluster.ids().len() >= 10).await;
    let holder = cluster.holder().await;
    let standby = (holder + 1) % INSTANCES;
    let api = cluster.workspaces[standby]
        .api_urls()
        .pop()
        .expect("the standby's API");
    let (client, path) = (
        reqwest::Client::new(),
        format!("{api}/sources/{}/state", cluster.key),
    );
    // Stopped here, the source still runs on the holder.
    let stopped = client
        .post(format!("{api}/sources/{}/stop", cluster.key))
        .send()
        .await
        .unwrap();
    assert_eq!(stopped.status(), reqwest::StatusCode::NO_CONTENT);
    let shown: serde_json::Value = client
        .get(&path)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        shown["state"].is_object(),
        "the shared state is shown: {shown}"
    );
    let replaced = client.put(&path).json(&shown).send().await.unwrap();
    let cleared = client.delete(&path).send().await.unwrap();
    for (what, answer) in [("PUT", replaced), ("DELETE", cleared)] {
        assert_eq!(answer.status(), reqwest::StatusCode::CONFLICT, "{what}");
        let body: serde_json::Value = answer.json().await.unwrap();
        let reason = body["reason"].as_str().unwrap_or_default();
        assert_eq!(body["code"], "connector_running", "{what}: {body}");
        assert!(
            reason.contains(&format!("instance-{holder}")),
            "{what} names the holder: {body}"
        );
    }
    cluster.stop();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_whose_lease_is_taken_stops_the_source_and_a_later_holder_delivers_the_rest() {
    const ROWS: i64 = 200;
    let cluster = Cluster::start("2s").await;
    insert_rows(&cluster.pool, &cluster.table, 1, ROWS).await;
    wait_for("the first rows", LONG, || {
        cluster.ids().len() as i64 >= ROWS
    })
    .await;
    let holder = cluster.holder().await;
    // Another holder (an instance that paused past its lease, say) takes it.
    let stolen: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "UPDATE {}_leases SET holder = 'intruder', epoch = epoch + 1, \
         expires_at = now() + interval '3 seconds' WHERE key = $1 RETURNING epoch",
        cluster.state_table
    )))
    .bind(&cluster.key)
    .fetch_one(&cluster.pool)
    .await
    .unwrap();
    const STOPPED: &str = "source stopped here: it no longer holds its lease";
    wait_for("the holder to stop the source", LONG, || {
        cluster.workspaces[holder].stderr().contains(STOPPED)
    })
    .await;
    insert_rows(&cluster.pool, &cluster.table, ROWS + 1, 2 * ROWS).await;
    wait_for("the rest, once the taken lease expired", LONG, || {
        cluster.ids().len() as i64 >= 2 * ROWS
    })
    .await;
    let (holder_now, epoch): (String, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT holder, epoch FROM {}_leases WHERE key = $1",
        cluster.state_table
    )))
    .bind(&cluster.key)
    .fetch_one(&cluster.pool)
    .await
    .unwrap();
    assert!(holder_now.starts_with("instance-"), "{holder_now}");
    assert!(
        epoch > stolen,
        "delivered under epoch {epoch}, the intruder's was {stolen}"
    );
    cluster.stop();
}
