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
async fn unknown_paths_are_a_json_404_and_wrong_methods_a_json_405_with_or_without_a_key_while_known_ones_need_it()
 {
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

    // A known path asked with a method it does not take: JSON too, with Allow.
    let response = harness
        .request(reqwest::Method::DELETE, "/health")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()["allow"], "GET,HEAD");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["code"], "method_not_allowed", "{body}");
    assert_eq!(
        body["reason"], "/health does not take DELETE (see the Allow header)",
        "{body}"
    );
}

/// A random source that stops by itself after `max_count` records.
fn counted_source(key: &str, topic: &str, max_count: u64) -> String {
    random_source(key, topic, "").replace(
        "[plugin_config]\n",
        &format!("[plugin_config]\nmax_count = {max_count}\n"),
    )
}

impl Harness {
    async fn send(&self, method: reqwest::Method, path: &str, body: Value) -> (StatusCode, Value) {
        let response = self.request(method, path).json(&body).send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        (
            status,
            serde_json::from_str(&text).unwrap_or(Value::String(text)),
        )
    }

    async fn wait_for_messages(&self, topic: &str, count: usize) {
        let started = Instant::now();
        while self.bus.messages("api", topic).len() < count {
            assert!(
                started.elapsed() < DEADLINE,
                "{} of {count} messages in {topic}",
                self.bus.messages("api", topic).len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test]
async fn a_stopped_sources_state_is_replaced_or_cleared_and_it_resumes_from_it() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", counted_source(&key, &topic, 1_000_000))]).await;
    harness.wait_for_status("sources", &key, "running").await;
    let path = format!("/sources/{key}/state");
    let new_state = json!({"state": {"messages_produced": 10}});
    let (status, running) = harness
        .send(reqwest::Method::PUT, &path, new_state.clone())
        .await;
    assert_eq!(
        (status, running["code"].as_str()),
        (StatusCode::CONFLICT, Some("connector_running")),
        "{running}"
    );
    assert!(
        running["reason"]
            .as_str()
            .unwrap()
            .contains("stop it first")
    );
    let (status, _) = harness.text(reqwest::Method::DELETE, &path).await;
    assert_eq!(status, StatusCode::CONFLICT);

    let (status, _) = harness.post(&format!("/sources/{key}/stop"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, before) = harness.get(&path).await;
    assert!(
        before["state"]["messages_produced"].as_u64() > Some(0),
        "{before}"
    );

    // GET's answer, edited, goes back as it is; a new max_count makes the
    // source stop 5 records after the replaced count.
    let mut edited = before.clone();
    edited["state"]["messages_produced"] = json!(10);
    let (status, replaced) = harness.send(reqwest::Method::PUT, &path, edited).await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_eq!(replaced["state"], json!({"messages_produced": 10}));
    assert_eq!(replaced["connector"], "random");
    let (_, shown) = harness.get(&path).await;
    assert_eq!(shown["state"], json!({"messages_produced": 10}));
    let stored = harness.state.get(&key).unwrap();
    assert_eq!(
        rmp_serde::from_slice::<BTreeMap<String, u64>>(&stored.data).unwrap(),
        BTreeMap::from([("messages_produced".to_owned(), 10)])
    );

    for (body, expected) in [
        (
            json!({"state": {"messages_produced": 1}, "connector": "postgres"}),
            "\"random\" connector",
        ),
        (json!({"state": [1, 2]}), "is a JSON object"),
        (
            json!({"state": {"token": "[REDACTED]"}}),
            "give the real value",
        ),
    ] {
        let (status, refused) = harness.send(reqwest::Method::PUT, &path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert!(
            refused["reason"].as_str().unwrap().contains(expected),
            "{refused}"
        );
    }
    let (status, _) = harness
        .send(reqwest::Method::PUT, &path, json!({"nope": 1}))
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        harness.state.get(&key).unwrap(),
        stored,
        "refusals change nothing"
    );

    let (status, _) = harness.text(reqwest::Method::DELETE, &path).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, cleared) = harness.get(&path).await;
    assert_eq!(
        (cleared["state"].clone(), cleared["size"].clone()),
        (json!(null), json!(0))
    );
    assert_eq!(harness.state.get(&key), None);
    let (status, _) = harness.text(reqwest::Method::DELETE, &path).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "clearing twice is fine");
    let (status, _) = harness
        .send(reqwest::Method::PUT, "/sources/nope/state", new_state)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_replaced_state_is_where_the_source_resumes() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("a.toml", counted_source(&key, &topic, 20))]).await;
    harness.wait_for_messages(&topic, 20).await;
    harness.wait_for_status("sources", &key, "stopped").await;
    let path = format!("/sources/{key}/state");
    let (status, _) = harness
        .send(
            reqwest::Method::PUT,
            &path,
            json!({"state": {"messages_produced": 15}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = harness.post(&format!("/sources/{key}/start"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    // 15 produced: it stops again after 5 more.
    harness.wait_for_messages(&topic, 25).await;
    harness.wait_for_status("sources", &key, "stopped").await;
    assert_eq!(harness.bus.messages("api", &topic).len(), 25);

    let (status, _) = harness.text(reqwest::Method::DELETE, &path).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    harness.post(&format!("/sources/{key}/start"), None).await;
    // A fresh start: 20 more.
    harness.wait_for_messages(&topic, 45).await;
    harness.wait_for_status("sources", &key, "stopped").await;
    assert_eq!(harness.bus.messages("api", &topic).len(), 45);
}

#[tokio::test]
async fn a_stopped_sinks_offsets_move_to_earliest_latest_a_time_or_given_offsets() {
    let (source, sink, topic) = (unique("src"), unique("snk"), unique("t"));
    let harness = harness(&[
        ("a.toml", counted_source(&source, &topic, 20)),
        ("b.toml", stdout_sink(&sink, &topic)),
    ])
    .await;
    let group = format!("iggy-connect-sink-{sink}");
    harness.wait_for_messages(&topic, 20).await;
    let started = Instant::now();
    while !harness.bus.is_drained("api", &topic, &group) {
        assert!(started.elapsed() < DEADLINE, "the sink never caught up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let path = format!("/sinks/{sink}/offsets");
    let (status, running) = harness
        .send(reqwest::Method::POST, &path, json!({"to": "earliest"}))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{running}");
    harness.post(&format!("/sinks/{sink}/stop"), None).await;

    let committed = || harness.bus.committed_offset("api", &topic, &group, 0);
    let moved = |answer: &Value| {
        let partition = &answer["topics"][0]["partitions"][0];
        (partition["before"].as_u64(), partition["after"].as_u64())
    };
    let (status, answer) = harness
        .send(reqwest::Method::POST, &path, json!({"to": "earliest"}))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["topics"][0]["topic"], topic.as_str());
    assert_eq!(answer["topics"][0]["consumer_group"], group.as_str());
    assert_eq!((moved(&answer), committed()), ((Some(20), Some(0)), None));

    let (_, answer) = harness
        .send(reqwest::Method::POST, &path, json!({"to": "latest"}))
        .await;
    assert_eq!(
        (moved(&answer), committed()),
        ((Some(0), Some(20)), Some(19))
    );

    let body = json!({"to": {"offsets": {"0": 5}}, "stream": "api", "topic": topic});
    let (_, answer) = harness.send(reqwest::Method::POST, &path, body).await;
    assert_eq!(
        (moved(&answer), committed()),
        ((Some(20), Some(5)), Some(4)),
        "{answer}"
    );

    let (_, answer) = harness
        .send(
            reqwest::Method::POST,
            &path,
            json!({"to": {"timestamp": 0}}),
        )
        .await;
    assert_eq!((moved(&answer), committed()), ((Some(5), Some(0)), None));
    let (_, answer) = harness
        .send(
            reqwest::Method::POST,
            &path,
            json!({"to": {"timestamp": "2999-01-01T00:00:00Z"}}),
        )
        .await;
    assert_eq!(
        (moved(&answer), committed()),
        ((Some(0), Some(20)), Some(19))
    );

    for (body, expected) in [
        (json!({"to": "sideways"}), "\"sideways\""),
        (json!({"to": {"offsets": {"7": 1}}}), "no partition 7"),
        (json!({"to": "earliest", "stream": "api"}), "go together"),
        (
            json!({"to": "earliest", "stream": "api", "topic": "other"}),
            "reads no topic api/other",
        ),
        (
            json!({"to": {"timestamp": "yesterday"}}),
            "not an RFC 3339 time",
        ),
    ] {
        let (status, refused) = harness.send(reqwest::Method::POST, &path, body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
        assert!(
            refused["reason"].as_str().unwrap().contains(expected),
            "{refused}"
        );
    }
    assert_eq!(committed(), Some(19), "refusals move nothing");

    // From offset 5, the sink writes the 15 messages after it again.
    let (_, answer) = harness
        .send(
            reqwest::Method::POST,
            &path,
            json!({"to": {"offsets": {"0": 5}}}),
        )
        .await;
    assert_eq!(moved(&answer), (Some(20), Some(5)));
    let processed = || {
        harness
            .runtime
            .view(ConnectorKind::Sink, &sink)
            .unwrap()
            .metrics
            .processed
            .get()
    };
    let before = processed();
    harness.post(&format!("/sinks/{sink}/start"), None).await;
    let started = Instant::now();
    while processed() < before + 15 {
        assert!(
            started.elapsed() < DEADLINE,
            "the sink did not read from offset 5"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(processed(), before + 15);
    let (status, _) = harness
        .send(
            reqwest::Method::POST,
            "/sinks/nope/offsets",
            json!({"to": "latest"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn public_health_shows_only_the_status_and_the_api_key_shows_the_details() {
    let http = HttpConfig {
        api_key: "letmein".to_owned().into(),
        ..HttpConfig::default()
    };
    let key = unique("src");
    let mut harness = harness_with(
        &[(
            "a.toml",
            random_source(&key, &unique("t"), "max_consecutive_nacks = 2"),
        )],
        Vec::new(),
        http,
    )
    .await;
    harness.wait_for_status("sources", &key, "running").await;
    harness.bus.refuse_sends(2);
    harness.wait_for_status("sources", &key, "error").await;

    let (status, details) = harness.get("/health").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(details["connectors"][0]["key"], key.as_str(), "{details}");
    assert!(
        details["connectors"][0]["last_error"]["message"].is_string(),
        "{details}"
    );

    for offered in [None, Some("letmeout")] {
        harness.api_key = offered.map(str::to_owned);
        let (status, public) = harness.get("/health").await;
        assert_eq!(
            (status, public),
            (
                StatusCode::SERVICE_UNAVAILABLE,
                json!({"status": "unhealthy"})
            ),
            "key offered: {offered:?}"
        );
    }
}

#[tokio::test]
async fn health_is_degraded_while_the_broker_does_not_answer_and_live_stays_ok() {
    let key = unique("src");
    let harness = harness(&[("a.toml", random_source(&key, &unique("t"), ""))]).await;
    harness.wait_for_status("sources", &key, "running").await;
    assert_eq!(harness.get("/health").await.1["status"], "healthy");

    harness.bus.set_unreachable(true);
    let started = Instant::now();
    let (status, health) = loop {
        let (status, health) = harness.get("/health").await;
        if health["status"] != "healthy" {
            break (status, health);
        }
        assert!(started.elapsed() < DEADLINE, "still healthy: {health}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, StatusCode::OK, "{health}");
    assert_eq!(health["status"], "degraded", "{health}");
    assert_eq!(health["broker"]["reachable"], false, "{health}");
    let (status, live) = harness.get("/health/live").await;
    assert_eq!(
        (status, live["status"].as_str()),
        (StatusCode::OK, Some("alive"))
    );

    harness.bus.set_unreachable(false);
    let started = Instant::now();
    while harness.get("/health").await.1["status"] != "healthy" {
        assert!(
            started.elapsed() < DEADLINE,
            "still degraded once the broker answers"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
