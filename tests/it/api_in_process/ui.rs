//! `GET /ui` and the `/stats` fields `top` and the page read.

use super::*;

#[tokio::test]
async fn the_status_page_is_public_self_contained_and_off_with_ui_false() {
    let mut http = HttpConfig {
        api_key: secrecy::SecretString::from("k3y"),
        ..HttpConfig::default()
    };
    let harness = harness_with(&[], Vec::new(), http.clone()).await;
    // No key: the page holds no data, so it needs none (the API calls do).
    let response = reqwest::get(format!("{}/ui", harness.server.url()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let headers = response.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    let policy = headers["content-security-policy"].to_str().unwrap();
    assert!(policy.contains("connect-src 'self'"), "{policy}");
    let page = response.text().await.unwrap();
    assert!(page.contains("<title>iggy-connect</title>"));
    // Nothing from elsewhere: no script or style file, no absolute URL.
    for outside in [
        "<script src",
        "<link rel=\"stylesheet\"",
        "http://",
        "https://",
    ] {
        assert!(!page.contains(outside), "the page loads {outside}");
    }
    let data = reqwest::get(format!("{}/stats", harness.server.url()))
        .await
        .unwrap();
    assert_eq!(data.status(), StatusCode::UNAUTHORIZED);

    http.ui = false;
    let off = harness_with(&[], Vec::new(), http).await;
    let response = reqwest::get(format!("{}/ui", off.server.url()))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn stats_count_payload_bytes_and_batch_durations_per_connector() {
    let topic = unique("ui-stats");
    let harness = harness(&[
        ("gen.toml", random_source("gen", &topic, "")),
        ("out.toml", stdout_sink("out", &topic)),
    ])
    .await;
    let started = Instant::now();
    let stats = loop {
        let (_, stats) = harness.get("/stats").await;
        let moved = |key: &str| {
            stats["connectors"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|connector| connector["key"] == key)
                .is_some_and(|connector| {
                    let batches: u64 = connector["batch_durations"]["counts"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_u64)
                        .sum();
                    connector["bytes"].as_u64() > Some(0) && batches > 0
                })
        };
        if moved("gen") && moved("out") {
            break stats;
        }
        assert!(started.elapsed() < DEADLINE, "no bytes or batches: {stats}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let durations = &stats["connectors"][0]["batch_durations"];
    let bounds = durations["bounds_us"].as_array().unwrap();
    assert_eq!(bounds.len(), durations["counts"].as_array().unwrap().len());
    assert_eq!(bounds[0], json!(1));
    assert_eq!(bounds[10], json!(1024));
    assert_eq!(bounds.last(), Some(&Value::Null));
    let (_, metrics) = harness.text(reqwest::Method::GET, "/metrics").await;
    assert!(
        metrics
            .lines()
            .any(|line| line.starts_with("iggy_connector_bytes_total{")
                && line.contains("connector_key=\"gen\"")),
        "{metrics}"
    );
}
