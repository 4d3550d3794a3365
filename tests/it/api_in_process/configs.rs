//! Config versions in the connector directory.

use super::*;

#[tokio::test]
async fn config_versions_are_listed_created_activated_deleted_and_restarted_into() {
    let (key, topic) = (unique("src"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    harness.wait_for_status("sources", &key, "running").await;

    let (status, configs) = harness.get(&format!("/sources/{key}/configs")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(configs.as_array().unwrap().len(), 1);
    assert_eq!(
        (
            configs[0]["version"].as_u64(),
            configs[0]["active"].as_bool()
        ),
        (Some(0), Some(true))
    );
    assert_eq!(configs[0]["plugin_config"]["interval"], "10ms");

    // A new version: upstream's body, validated by the file parser.
    let body = json!({
        "enabled": true,
        "name": "renamed",
        "path": "libiggy_connector_random_source",
        "streams": [{"stream": "api", "topic": topic, "schema": "json", "batch_length": 100}],
        "plugin_config_format": "json",
        "plugin_config": {"interval": "10ms", "messages_range": [2, 2]},
        "transforms": null,
    });
    let (status, created) = harness
        .post(&format!("/sources/{key}/configs"), Some(body))
        .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(
        (created["version"].as_u64(), created["active"].as_bool()),
        (Some(1), Some(false))
    );
    assert!(
        harness
            .connectors
            .join(format!("source_{key}_1.toml"))
            .is_file()
    );

    let (status, one) = harness.get(&format!("/sources/{key}/configs/1")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (
            one["name"].as_str(),
            one["active"].as_bool(),
            one["running"].as_bool()
        ),
        (Some("renamed"), Some(true), Some(false))
    );
    let (status, missing) = harness.get(&format!("/sources/{key}/configs/7")).await;
    assert_eq!(
        (status, missing["code"].as_str()),
        (StatusCode::NOT_FOUND, Some("source_config_not_found"))
    );
    let (status, _) = harness.get(&format!("/sources/{key}/configs/seven")).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Restart runs the active version: the highest while nothing is pinned.
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(
        (details["version"].as_u64(), details["name"].as_str()),
        (Some(1), Some("renamed"))
    );
    assert_eq!(details["path"], "libiggy_connector_random_source");

    // Roll back: pin version 0, then restart.
    let response = harness
        .request(
            reqwest::Method::PUT,
            &format!("/sources/{key}/configs/active"),
        )
        .json(&json!({"version": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let pointers =
        std::fs::read_to_string(harness.connectors.join(".active_versions.toml")).unwrap();
    let pointers: toml::Table = toml::from_str(&pointers).unwrap();
    assert_eq!(pointers["sources"][key.as_str()].as_integer(), Some(0));
    let (_, active) = harness.get(&format!("/sources/{key}/configs/active")).await;
    assert_eq!(
        (
            active["version"].as_u64(),
            active["active"].as_bool(),
            active["running"].as_bool()
        ),
        (Some(0), Some(true), Some(false))
    );
    let (status, _) = harness.post(&format!("/sources/{key}/restart"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, details) = harness.get(&format!("/sources/{key}")).await;
    assert_eq!(details["version"].as_u64(), Some(0));
    harness.wait_for_status("sources", &key, "running").await;

    let response = harness
        .request(
            reqwest::Method::PUT,
            &format!("/sources/{key}/configs/active"),
        )
        .json(&json!({"version": 9}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    // An invalid config is refused with every issue, and nothing is written.
    let (status, refused) = harness
        .post(
            &format!("/sources/{key}/configs"),
            Some(json!({"enabled": true, "path": "random", "plugin_config": {"interval": "soon"}})),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{refused}");
    assert_eq!(refused["code"], "invalid_configuration");
    let fields: Vec<&str> = refused["issues"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|issue| issue["field"].as_str())
        .collect();
    assert!(fields.contains(&"streams"), "{refused}");
    assert!(
        fields
            .iter()
            .any(|field| field.starts_with("plugin_config")),
        "{refused}"
    );
    assert!(
        !harness
            .connectors
            .join(format!("source_{key}_2.toml"))
            .exists()
    );

    // Deleting the pinned version moves the pointer to the highest left.
    let response = harness
        .request(
            reqwest::Method::DELETE,
            &format!("/sources/{key}/configs?version=0"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    let (_, configs) = harness.get(&format!("/sources/{key}/configs")).await;
    let versions: Vec<(u64, bool)> = configs
        .as_array()
        .unwrap()
        .iter()
        .map(|config| {
            (
                config["version"].as_u64().unwrap(),
                config["active"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(versions, vec![(1, true)]);
    let response = harness
        .request(
            reqwest::Method::DELETE,
            &format!("/sources/{key}/configs?version=0"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

fn version_body(topic: &str) -> Value {
    json!({
        "enabled": false,
        "name": "version",
        "path": "random",
        "streams": [{"stream": "api", "topic": topic, "schema": "json"}],
        "plugin_config": {"interval": "10ms", "messages_range": [2, 2]},
    })
}

// Several worker threads, so the handlers really run at the same time.
#[tokio::test(flavor = "multi_thread", worker_threads = 8)]
async fn parallel_config_creations_each_get_their_own_version_and_file() {
    let (key, topic) = (unique("coll"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    let path = format!("/sources/{key}/configs");
    let harness = Arc::new(harness);
    let requests = (0..30).map(|_| {
        let (harness, path, body) = (harness.clone(), path.clone(), version_body(&topic));
        tokio::spawn(async move { harness.post(&path, Some(body)).await })
    });
    let answers: Vec<(StatusCode, Value)> = futures::future::join_all(requests)
        .await
        .into_iter()
        .map(|answer| answer.unwrap())
        .collect();
    let mut versions = Vec::new();
    for (status, body) in &answers {
        assert_eq!(*status, StatusCode::OK, "{body}");
        versions.push(body["version"].as_u64().unwrap());
    }
    versions.sort_unstable();
    assert_eq!(
        versions,
        (1..=30).collect::<Vec<u64>>(),
        "distinct versions"
    );
    for version in 1..=30 {
        let file = harness
            .connectors
            .join(format!("source_{key}_{version}.toml"));
        assert!(file.is_file(), "{} missing", file.display());
    }
    let (_, listed) = harness.get(&path).await;
    assert_eq!(listed.as_array().unwrap().len(), 31);
    // No temp file is left behind.
    let names: Vec<String> = std::fs::read_dir(&harness.connectors)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 31, "{names:?}");
}

#[tokio::test]
async fn created_configs_and_the_active_pointer_are_readable_by_the_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let (key, topic) = (unique("perm"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    let (status, body) = harness
        .post(
            &format!("/sources/{key}/configs"),
            Some(version_body(&topic)),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let response = harness
        .request(
            reqwest::Method::PUT,
            &format!("/sources/{key}/configs/active"),
        )
        .json(&json!({"version": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NO_CONTENT);
    for name in [
        format!("source_{key}_1.toml"),
        ".active_versions.toml".into(),
    ] {
        let mode = std::fs::metadata(harness.connectors.join(&name))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{name}");
    }
}

#[tokio::test]
async fn a_key_too_long_for_a_file_name_is_a_400_that_shows_no_path() {
    let harness = harness(&[]).await;
    let key = "k".repeat(300);
    let (status, body) = harness
        .post(
            &format!("/sources/{key}/configs"),
            Some(version_body("topic")),
        )
        .await;
    assert_eq!(
        (status, body["code"].as_str()),
        (StatusCode::BAD_REQUEST, Some("bad_request")),
        "{body}"
    );
    let reason = body["reason"].as_str().unwrap();
    assert!(reason.contains("at most 200"), "{reason}");
    let dir = harness.connectors.display().to_string();
    assert!(!body.to_string().contains(&dir), "{body}");
    assert!(!body.to_string().contains('/'), "{body}");
}

#[tokio::test]
async fn request_bodies_that_are_not_the_expected_json_get_code_and_reason() {
    let (key, topic) = (unique("body"), unique("t"));
    let harness = harness(&[("first.toml", random_source(&key, &topic, ""))]).await;
    let send = |method: reqwest::Method, path: String, body: &'static str| {
        let request = harness
            .request(method, &path)
            .header("content-type", "application/json")
            .body(body);
        async move {
            let response = request.send().await.unwrap();
            let status = response.status();
            let text = response.text().await.unwrap();
            let json: Value = serde_json::from_str(&text)
                .unwrap_or_else(|_| panic!("{path} {body:?}: not JSON: {text}"));
            (status, json)
        }
    };
    let configs = format!("/sources/{key}/configs");
    let active = format!("/sources/{key}/configs/active");
    for (method, path, body) in [
        (reqwest::Method::POST, configs.clone(), "{not json"),
        (reqwest::Method::POST, configs.clone(), "[1, 2]"),
        (reqwest::Method::POST, configs.clone(), "\"text\""),
        (reqwest::Method::PUT, active.clone(), "{\"version\": "),
        (reqwest::Method::PUT, active.clone(), "[]"),
        (
            reqwest::Method::PUT,
            active.clone(),
            "{\"version\": \"one\"}",
        ),
    ] {
        let (status, json) = send(method, path.clone(), body).await;
        assert!(status.is_client_error(), "{path} {body:?}: {status}");
        assert!(
            json["code"].is_string() && json["reason"].is_string(),
            "{path} {body:?}: {json}"
        );
    }
}

#[tokio::test]
async fn a_malformed_query_string_or_path_is_a_json_error_like_every_other() {
    let key = unique("src");
    let harness = harness(&[("first.toml", random_source(&key, &unique("t"), ""))]).await;
    let requests = [
        (
            reqwest::Method::DELETE,
            format!("/sources/{key}/configs?version=abc"),
        ),
        (
            reqwest::Method::DELETE,
            format!("/sinks/{key}/configs?version=-1"),
        ),
        // Not UTF-8 once percent-decoded.
        (reqwest::Method::GET, "/sources/%FF%FE".to_owned()),
    ];
    for (method, path) in requests {
        let response = harness.request(method, &path).send().await.unwrap();
        let status = response.status();
        let text = response.text().await.unwrap();
        let body: Value =
            serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}"));
        assert_eq!(
            (status, body["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("bad_request")),
            "{path}: {body}"
        );
        assert!(
            body["reason"]
                .as_str()
                .is_some_and(|reason| !reason.is_empty())
        );
    }
}
