//! CORS, TLS and bind errors.

use super::*;

#[tokio::test]
async fn cors_preflight_is_answered_for_allowed_origins() {
    let mut http = HttpConfig {
        api_key: "k".to_owned().into(),
        ..HttpConfig::default()
    };
    http.cors.enabled = true;
    http.cors.allowed_origins = vec!["https://console.example".into()];
    let harness = harness_with(&[], Vec::new(), http).await;
    let response = harness
        .client
        .request(
            reqwest::Method::OPTIONS,
            format!("{}/sources", harness.server.url()),
        )
        .header("origin", "https://console.example")
        .header("access-control-request-method", "GET")
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        StatusCode::OK,
        "a preflight needs no API key"
    );
    assert_eq!(
        response.headers()["access-control-allow-origin"],
        "https://console.example"
    );
}

#[tokio::test]
async fn bad_cors_settings_are_refused_at_startup_with_the_field_named() {
    let mut http = HttpConfig {
        address: "127.0.0.1:0".into(),
        ..HttpConfig::default()
    };
    http.cors.enabled = true;
    http.cors.allowed_methods = vec!["FETCH".into()];
    let runtime = Runtime::new(
        Arc::new(MemoryBus::new()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(1),
    );
    let error = ApiServer::start(
        &http,
        ApiState::new(runtime, Arc::new(MemoryStateStore::new())),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(
            error,
            ApiSetupError::Cors {
                field: "allowed_methods",
                ..
            }
        ),
        "{error}"
    );
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[tokio::test]
async fn tls_serves_https_with_the_configured_certificate() {
    let mut http = HttpConfig::default();
    http.tls.enabled = true;
    http.tls.cert_file = fixture("api_tls_cert.pem");
    http.tls.key_file = fixture("api_tls_key.pem");
    let harness = harness_with(&[], Vec::new(), http).await;
    assert!(harness.server.url().starts_with("https://"));
    let certificate =
        reqwest::Certificate::from_pem(&std::fs::read(fixture("api_tls_cert.pem")).unwrap())
            .unwrap();
    let client = reqwest::Client::builder()
        .tls_certs_only([certificate])
        .build()
        .unwrap();
    let url = format!(
        "https://localhost:{}/health",
        harness.server.address().port()
    );
    let response = client.get(url).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    let mut http = HttpConfig {
        address: "127.0.0.1:0".into(),
        ..HttpConfig::default()
    };
    http.tls.enabled = true;
    http.tls.cert_file = fixture("missing.pem");
    let error = ApiServer::start(
        &http,
        ApiState::new(harness.runtime.clone(), harness.state.clone()),
    )
    .await
    .err()
    .unwrap();
    assert!(
        matches!(
            error,
            ApiSetupError::Tls {
                field: "cert_file",
                ..
            }
        ),
        "{error}"
    );
}

#[tokio::test]
async fn a_taken_address_is_a_bind_error_naming_it() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let http = HttpConfig {
        address: taken.local_addr().unwrap().to_string(),
        ..HttpConfig::default()
    };
    let runtime = Runtime::new(
        Arc::new(MemoryBus::new()),
        Arc::new(MemoryStateStore::new()),
        Duration::from_secs(1),
    );
    let error = ApiServer::start(
        &http,
        ApiState::new(runtime, Arc::new(MemoryStateStore::new())),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(error, ApiSetupError::Bind { .. }), "{error}");
    assert!(error.to_string().contains(&http.address), "{error}");
}
