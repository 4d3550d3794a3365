//! Secrets never leave the API; source state is readable.

use iggy_connect::connectors::registry::ConnectorInfo;

use super::*;

/// A plugin config with secrets for a connector: its sample with `CANARY` in
/// each declared secret field, plus secrets it did not declare.
fn secret_plugin_config(info: &ConnectorInfo) -> Value {
    let (mut config, missing) = info.sample_with_secret(CANARY);
    assert!(
        missing.is_empty(),
        "{} {}: its sample shows no secret at {missing:?}",
        info.kind,
        info.name
    );
    let fields = config.as_object_mut().unwrap();
    fields.insert("password".into(), json!(CANARY));
    fields.insert(
        "nested".into(),
        json!({"headers": {"authorization": CANARY}, "list": [{"client_secret": CANARY}]}),
    );
    fields.insert("dsn".into(), json!(format!("host=db password={CANARY}")));
    fields.insert(
        "callback".into(),
        json!(format!("https://user:{CANARY}@example.com/hook")),
    );
    config
}

fn config_for(kind: ConnectorKind, name: &str, key: &str, plugin_config: Value) -> ConnectorConfig {
    let kind_config = match kind {
        ConnectorKind::Source => KindConfig::Source {
            streams: vec![SourceStream {
                stream: "api".into(),
                topic: "t".into(),
                schema: Schema::Json,
                batch_length: 10,
                linger_time: Duration::from_millis(5),
                partitions: 1,
            }],
            max_consecutive_nacks: None,
            max_in_flight: None,
            max_in_flight_bytes: None,
        },
        ConnectorKind::Sink => KindConfig::Sink {
            streams: vec![SinkStream {
                stream: "api".into(),
                topics: vec!["t".into()],
                schema: Schema::Json,
                batch_length: 10,
                poll_interval: Duration::from_millis(5),
                consumer_group: "g".into(),
            }],
            on_error: OnError::Stop,
        },
    };
    ConnectorConfig {
        kind,
        key: key.to_owned(),
        enabled: false,
        version: 0,
        name: name.to_owned(),
        path: name.to_owned(),
        connector: name.to_owned(),
        plugin_config_format: Some("yaml".into()),
        plugin_config,
        verbose: false,
        benchmark: false,
        transforms: vec![(
            "add_fields".into(),
            json!({"enabled": false, "api_token": CANARY}),
        )],
        dead_letter: None,
        kind_config,
        file: None,
    }
}

#[tokio::test]
async fn secrets_are_redacted_by_every_endpoint_in_every_format_for_every_compiled_in_connector() {
    let mut configs = Vec::new();
    for info in Registry::all() {
        let key = unique(&format!("secret-{}", info.name));
        configs.push(config_for(
            info.kind,
            info.name,
            &key,
            secret_plugin_config(&info),
        ));
    }
    assert!(!configs.is_empty());
    let harness = harness_with(&[], configs.clone(), HttpConfig::default()).await;
    let mut checked = 0;
    for config in &configs {
        let kind = match config.kind {
            ConnectorKind::Source => "sources",
            ConnectorKind::Sink => "sinks",
        };
        let key = &config.key;
        if config.kind == ConnectorKind::Source {
            let state = encode_state(&json!({"messages_produced": 3, "password": CANARY, "cursor": format!("postgres://u:{CANARY}@h/db")})).unwrap();
            harness
                .state
                .save(
                    key,
                    &StoredState {
                        connector: config.connector.clone(),
                        data: state,
                    },
                )
                .await
                .unwrap();
        }
        let mut paths = vec![
            format!("/{kind}"),
            format!("/{kind}/{key}"),
            format!("/{kind}/{key}/transforms"),
            format!("/{kind}/{key}/configs"),
            format!("/{kind}/{key}/configs/active"),
            format!("/{kind}/{key}/configs/plugin"),
            "/stats".to_owned(),
            "/health".to_owned(),
        ];
        for format in ["json", "yaml", "toml", "text"] {
            paths.push(format!("/{kind}/{key}/configs/plugin?format={format}"));
        }
        if config.kind == ConnectorKind::Source {
            paths.push(format!("/{kind}/{key}/state"));
        }
        for path in &paths {
            let (status, body) = harness.text(reqwest::Method::GET, path).await;
            assert_eq!(status, StatusCode::OK, "{path}: {body}");
            assert!(!body.contains(CANARY), "{path} leaks a secret: {body}");
            checked += 1;
        }
        let (_, plugin) = harness
            .get(&format!("/{kind}/{key}/configs/plugin?format=json"))
            .await;
        assert_eq!(plugin["password"], "[REDACTED]", "{plugin}");
        assert_eq!(
            plugin["nested"]["headers"]["authorization"], "[REDACTED]",
            "{plugin}"
        );
        if config.kind == ConnectorKind::Source {
            let (_, state) = harness.get(&format!("/{kind}/{key}/state")).await;
            assert_eq!(state["state"]["messages_produced"], 3, "{state}");
            assert_eq!(state["state"]["password"], "[REDACTED]", "{state}");
        }
    }
    assert!(checked > 0);
}

#[tokio::test]
async fn a_source_state_is_decoded_from_messagepack() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", random_source(&key, &topic, ""))]).await;
    let started = Instant::now();
    loop {
        let (status, state) = harness.get(&format!("/sources/{key}/state")).await;
        assert_eq!(status, StatusCode::OK);
        if state["state"]["messages_produced"].as_u64().unwrap_or(0) > 0 {
            assert_eq!(state["connector"], "random");
            assert!(state["size"].as_u64().unwrap() > 0);
            break;
        }
        assert!(started.elapsed() < DEADLINE, "no state committed: {state}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
