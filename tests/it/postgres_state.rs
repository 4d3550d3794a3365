//! `[state] type = "postgres"` against a real PostgreSQL: the shared state
//! table, leases taken by one instance at a time, expiry and takeover, and
//! fencing (a save under a lost lease is refused). Each store here stands for
//! one instance. Run through `scripts/with-postgres.sh`.
#![cfg(feature = "postgres-state")]

use std::time::Duration;

use iggy_connect::config::state::StateConfig;
use iggy_connect::connectors::postgres::state::PostgresStateStore;
use iggy_connect::state::{Acquired, Leases, StateError, StateStore, StoredState};

use crate::support::postgres::{database_url, unique};

const LEASE: Duration = Duration::from_secs(2);

fn config(table: &str, url: &str) -> StateConfig {
    toml::from_str(&format!(
        "type = \"postgres\"\nconnection_string = \"{url}\"\ntable = \"{table}\"\n\
         lease_duration = \"{}ms\"\ninstance_id = \"test\"\n",
        LEASE.as_millis()
    ))
    .expect("a postgres [state]")
}

async fn instance(table: &str) -> PostgresStateStore {
    PostgresStateStore::open(&config(table, &database_url()))
        .await
        .expect("the state store opens")
}

fn state(data: &[u8]) -> StoredState {
    StoredState {
        connector: "random".into(),
        data: data.to_vec(),
    }
}

#[tokio::test]
async fn given_one_instance_when_saving_should_load_clear_and_create_its_tables() {
    let table = unique("state");
    let store = instance(&table).await;
    assert_eq!(store.load("src").await.unwrap(), None);
    assert_eq!(
        store.leases().unwrap().acquire("src").await.unwrap(),
        Acquired::Taken
    );
    store.save("src", &state(b"one")).await.unwrap();
    store.save("src", &state(b"two")).await.unwrap();
    let other = instance(&table).await;
    assert_eq!(other.load("src").await.unwrap(), Some(state(b"two")));
    store.leases().unwrap().release("src").await.unwrap();
    other.clear("src").await.unwrap();
    assert_eq!(store.load("src").await.unwrap(), None);
    assert!(
        store.location("src").contains(&table),
        "{}",
        store.location("src")
    );
}

#[tokio::test]
async fn given_a_held_lease_when_another_instance_asks_should_name_the_holder_until_it_expires() {
    let table = unique("state");
    let (first, second) = (instance(&table).await, instance(&table).await);
    assert_eq!(first.acquire("src").await.unwrap(), Acquired::Taken);
    match second.acquire("src").await.unwrap() {
        Acquired::HeldBy { holder, expires_in } => {
            assert_eq!(holder, first.holder());
            assert!(expires_in <= LEASE, "{expires_in:?}");
        }
        taken => panic!("the second instance got {taken:?}"),
    }
    // Renewed, it stays with the first instance past its first expiry.
    for _ in 0..4 {
        tokio::time::sleep(LEASE / 3).await;
        assert!(first.renew("src").await.unwrap());
        assert!(matches!(
            second.acquire("src").await.unwrap(),
            Acquired::HeldBy { .. }
        ));
    }
    // Not renewed, it goes to the second once expired.
    let taken = wait_until_taken(&second, "src").await;
    assert!(taken >= LEASE / 2, "taken over after {taken:?}");
    assert!(
        !first.renew("src").await.unwrap(),
        "the first instance still renews"
    );
}

#[tokio::test]
async fn given_a_lost_lease_when_its_holder_saves_should_refuse_and_keep_the_new_holders_state() {
    let table = unique("state");
    let (first, second) = (instance(&table).await, instance(&table).await);
    first.acquire("src").await.unwrap();
    first.save("src", &state(b"first")).await.unwrap();
    wait_until_taken(&second, "src").await;
    assert_eq!(second.load("src").await.unwrap(), Some(state(b"first")));
    second.save("src", &state(b"second")).await.unwrap();
    // The first instance has not noticed yet: its save is fenced.
    let refused = first.save("src", &state(b"stale")).await.unwrap_err();
    assert!(matches!(refused, StateError::LeaseLost { .. }), "{refused}");
    assert_eq!(first.load("src").await.unwrap(), Some(state(b"second")));
}

#[tokio::test]
async fn given_a_released_lease_when_another_instance_asks_should_take_it_at_once() {
    let table = unique("state");
    let (first, second) = (instance(&table).await, instance(&table).await);
    first.acquire("src").await.unwrap();
    first.release("src").await.unwrap();
    assert_eq!(second.acquire("src").await.unwrap(), Acquired::Taken);
    // Keys are leased independently.
    assert_eq!(first.acquire("other").await.unwrap(), Acquired::Taken);
}

#[tokio::test]
async fn given_a_source_running_elsewhere_when_an_operator_changes_its_state_should_refuse_naming_the_holder()
 {
    let table = unique("state");
    let (runner, operator) = (instance(&table).await, instance(&table).await);
    runner.acquire("src").await.unwrap();
    runner.save("src", &state(b"running")).await.unwrap();
    for refused in [
        operator.save("src", &state(b"reset")).await.unwrap_err(),
        operator.clear("src").await.unwrap_err(),
    ] {
        match &refused {
            StateError::Leased { holder, .. } => assert_eq!(holder, runner.holder()),
            other => panic!("expected Leased, got {other}"),
        }
    }
    runner.release("src").await.unwrap();
    operator.save("src", &state(b"reset")).await.unwrap();
    // The next holder starts from the operator's state and saves over it.
    runner.acquire("src").await.unwrap();
    assert_eq!(runner.load("src").await.unwrap(), Some(state(b"reset")));
    runner.save("src", &state(b"after")).await.unwrap();
    assert_eq!(operator.load("src").await.unwrap(), Some(state(b"after")));
}

#[tokio::test]
async fn given_a_role_the_server_refuses_when_opened_should_fail_naming_the_cause() {
    // The test server trusts every local connection, so a wrong password
    // passes; an unknown role is refused the same way at the same step.
    let url = database_url();
    let (scheme_and_user, rest) = url.split_once('@').unwrap();
    let (scheme, _) = scheme_and_user.rsplit_once('/').unwrap();
    let wrong = format!("{scheme}/no_such_role:secret@{rest}");
    let error = match PostgresStateStore::open(&config(&unique("state"), &wrong)).await {
        Ok(_) => panic!("opened as a role that does not exist"),
        Err(error) => error.to_string(),
    };
    assert!(
        error.contains("role \"no_such_role\" does not exist"),
        "{error}"
    );
}

#[tokio::test]
async fn given_no_database_listening_when_opened_should_start_and_fail_each_lease_attempt() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://iggy:iggy@127.0.0.1:{port}/iggy");
    let store = PostgresStateStore::open(&config(&unique("state"), &url))
        .await
        .expect("an unreachable database does not fail the start");
    let error = store.acquire("src").await.unwrap_err().to_string();
    assert!(error.contains(&format!("127.0.0.1:{port}")), "{error}");
}

/// Asks for the lease until it is taken; how long that took.
async fn wait_until_taken(store: &PostgresStateStore, key: &str) -> Duration {
    let started = std::time::Instant::now();
    while store.acquire(key).await.unwrap() != Acquired::Taken {
        assert!(
            started.elapsed() < LEASE * 5,
            "the lease was never taken over"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    started.elapsed()
}
