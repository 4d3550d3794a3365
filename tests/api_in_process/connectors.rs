//! Listing, details, lifecycle, health and auth.

use super::*;

#[tokio::test]
async fn connectors_are_listed_with_status_details_streams_and_transforms() {
    let (source, off, sink, topic) = (unique("src"), unique("off"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", random_source(&source, &topic, "")),
        (
            "b.toml",
            random_source(&off, &topic, "").replace("enabled = true", "enabled = false"),
        ),
        ("c.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sources", &source, "running").await;

    let (status, root) = harness.text(reqwest::Method::GET, "/").await;
    assert_eq!(
        (status, root.as_str()),
        (StatusCode::OK, "Connector Runtime API")
    );

    let (status, sources) = harness.get("/sources").await;
    assert_eq!(status, StatusCode::OK);
    let listed: BTreeMap<&str, &Value> = sources
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| (entry["key"].as_str().unwrap(), entry))
        .collect();
    assert_eq!(listed.len(), 2, "{sources}");
    let running = listed[source.as_str()];
    for field in [
        "id",
        "key",
        "name",
        "path",
        "enabled",
        "status",
        "last_error",
        "plugin_config_format",
    ] {
        assert!(running.get(field).is_some(), "missing {field} in {running}");
    }
    assert_eq!(running["status"], "running");
    assert_eq!(running["enabled"], true);
    assert_eq!(running["path"], "random");
    let disabled = listed[off.as_str()];
    assert_eq!(
        (disabled["status"].as_str(), disabled["enabled"].as_bool()),
        (Some("stopped"), Some(false))
    );

    let (status, details) = harness.get(&format!("/sources/{source}")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(details["streams"][0]["topic"], topic.as_str());
    assert_eq!(details["streams"][0]["schema"], "json");
    assert_eq!(details["streams"][0]["linger_time"], "5ms");

    let (status, sinks) = harness.get("/sinks").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(sinks[0]["key"], sink.as_str());
    assert_eq!(sinks[0]["path"], "libiggy_connector_stdout_sink");
    let (_, sink_details) = harness.get(&format!("/sinks/{sink}")).await;
    assert_eq!(
        sink_details["streams"][0]["consumer_group"],
        format!("iggy-connect-sink-{sink}")
    );

    let (status, transforms) = harness.get(&format!("/sources/{source}/transforms")).await;
    assert_eq!((status, transforms), (StatusCode::OK, json!([])));

    let (status, missing) = harness.get("/sources/nope").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(missing["code"], "source_not_found");
    assert!(missing["reason"].as_str().unwrap().contains("nope"));
    let (status, missing) = harness.get("/sinks/nope/transforms").await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );
    let (status, _) = harness.get(&format!("/sinks/{sink}/state")).await;
    assert_eq!(
        status,
        StatusCode::NOT_FOUND,
        "sinks have no state endpoint"
    );
}

#[tokio::test]
async fn restart_honours_a_disabled_active_version_and_start_runs_it_anyway() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    harness.wait_for_status("sources", &key, "running").await;
    let disabled = random_source(&key, &topic, "")
        .replace("enabled = true", "enabled = false")
        .replace("version = 0", "version = 1");
    std::fs::write(harness.connectors.join("second.toml"), disabled).unwrap();

    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(
        (
            details["status"].as_str(),
            details["enabled"].as_bool(),
            details["version"].as_u64()
        ),
        (Some("stopped"), Some(false), Some(1))
    );
    let (status, health) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "a disabled connector is not a failure: {health}"
    );

    let (status, _) = harness.post(&format!("/sources/{key}/start"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    harness.wait_for_status("sources", &key, "running").await;
}

#[tokio::test]
async fn stop_and_start_move_a_connector_through_stopped_and_running() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", random_source(&source, &topic, "")),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    harness.wait_for_status("sinks", &sink, "running").await;

    let (status, _) = harness.post(&format!("/sinks/{sink}/stop"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(harness.status_of("sinks", &sink).await, "stopped");
    let (status, _) = harness.get("/health").await;
    assert_eq!(
        status,
        StatusCode::OK,
        "an operator's stop is not a failure"
    );

    let (status, _) = harness.post(&format!("/sinks/{sink}/start"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    harness.wait_for_status("sinks", &sink, "running").await;
    let (status, _) = harness.post(&format!("/sinks/{sink}/start"), None).await;
    assert_eq!(
        status,
        StatusCode::NO_CONTENT,
        "starting a running connector is a no-op"
    );

    let (status, missing) = harness.post("/sinks/nope/stop", None).await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("sink_not_found"))
    );
}

#[tokio::test]
async fn health_reports_a_source_stopped_at_its_nack_limit_and_recovers_after_restart() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[(
        "a.toml",
        random_source(&key, &topic, "max_consecutive_nacks = 2"),
    )])
    .await;
    harness.wait_for_status("sources", &key, "running").await;
    let (status, health) = harness.get("/health").await;
    assert_eq!(
        (status, health),
        (StatusCode::OK, json!({"status": "healthy"}))
    );

    harness.bus.refuse_sends(2);
    harness.wait_for_status("sources", &key, "error").await;
    let (status, health) = harness.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(health["status"], "unhealthy");
    let failing = &health["connectors"][0];
    assert_eq!(
        (
            failing["key"].as_str(),
            failing["stop_reason"].as_str(),
            failing["status"].as_str()
        ),
        (Some(key.as_str()), Some("nack_limit"), Some("error"))
    );
    assert!(
        failing["last_error"]["message"]
            .as_str()
            .unwrap()
            .contains("NACKed"),
        "{failing}"
    );
    let (status, live) = harness.get("/health/live").await;
    assert_eq!(
        (status, live["status"].as_str()),
        (StatusCode::OK, Some("alive"))
    );

    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let started = Instant::now();
    while harness.get("/health").await.0 != StatusCode::OK {
        assert!(
            started.elapsed() < DEADLINE,
            "still unhealthy after restart"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn the_api_key_is_required_everywhere_but_root_and_health() {
    let http = HttpConfig {
        api_key: "letmein".to_owned().into(),
        ..HttpConfig::default()
    };
    let key = unique("src");
    let mut harness = harness_with(
        &[("a.toml", random_source(&key, &unique("t"), ""))],
        Vec::new(),
        http,
    )
    .await;
    harness.wait_for_status("sources", &key, "running").await;
    harness.api_key = None;
    for public in ["/", "/health", "/health/live"] {
        let (status, _) = harness.text(reqwest::Method::GET, public).await;
        assert_eq!(status, StatusCode::OK, "{public}");
    }
    let protected = [
        "/stats",
        "/metrics",
        "/sources",
        "/sinks",
        &format!("/sources/{key}"),
        &format!("/sources/{key}/configs"),
        &format!("/sources/{key}/state"),
    ];
    for path in protected {
        let (status, body) = harness.text(reqwest::Method::GET, path).await;
        assert_eq!(
            (status, body.as_str()),
            (StatusCode::UNAUTHORIZED, ""),
            "{path}"
        );
        let response = harness
            .client
            .get(format!("{}{path}", harness.server.url()))
            .header("api-key", "letmeout")
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            StatusCode::UNAUTHORIZED,
            "{path} with a wrong key"
        );
        let response = harness
            .client
            .get(format!("{}{path}", harness.server.url()))
            .header("api-key", "letmein")
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path} with the key");
    }
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn unknown_paths_are_a_json_404_with_or_without_a_key_while_known_ones_need_it() {
    let http = HttpConfig {
        api_key: "letmein".to_owned().into(),
        ..HttpConfig::default()
    };
    let mut harness = harness_with(&[], Vec::new(), http).await;
    for with_key in [false, true] {
        harness.api_key = with_key.then(|| "letmein".to_owned());
        for path in ["/nope", "/sources/x/y/z/w", "/stats/more"] {
            let (status, body) = harness.get(path).await;
            assert_eq!(
                (status, body["code"].as_str()),
                (StatusCode::NOT_FOUND, Some("not_found")),
                "{path} with key {with_key}: {body}"
            );
        }
    }
    harness.api_key = None;
    let (status, _) = harness.get("/sources/anything").await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}
