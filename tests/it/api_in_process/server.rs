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
async fn tls_serves_https_with_the_configured_certificate_which_the_cli_trusts_from_the_config() {
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

    // `dlq --config` reaches it over https trusting the configured
    // certificate: the answer is the API's own "not found", not a TLS error.
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("connectors")).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[http]\nenabled = true\naddress = \"127.0.0.1:{port}\"\n\
             [http.tls]\nenabled = true\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n\
             [iggy]\naddress = \"localhost:8090\"\n\
             [connectors]\nconfig_type = \"local\"\nconfig_dir = \"{dir}\"\n",
            port = harness.server.address().port(),
            cert = fixture("api_tls_cert.pem").display(),
            key = fixture("api_tls_key.pem").display(),
            dir = dir.path().join("connectors").display(),
        ),
    )
    .unwrap();
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["dlq", "list", "nosuch", "--config"])
        .arg(&config)
        .env_remove("IGGY_CONNECT_URL")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("\"nosuch\" not found"), "{stderr}");

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

/// Waits until the server closes the connection (EOF or reset), at most `DEADLINE`.
async fn closed_by_server(stream: &mut tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buffer = [0u8; 1024];
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            // A 408 or a 503 before closing.
            Ok(Ok(_)) => {}
        }
    }
}

/// Sends the start of a request, then one header byte every 100 ms until the
/// server closes the connection (true) or `DEADLINE` passes (false).
async fn slowloris(mut stream: tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncWriteExt;
    if stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: ")
        .await
        .is_err()
    {
        return true;
    }
    let deadline = tokio::time::Instant::now() + DEADLINE;
    while tokio::time::Instant::now() < deadline {
        if stream.write_all(b"a").await.is_err() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_idle_and_slow_connections_is_capped_and_closed_and_health_answers_at_once() {
    const LIMIT: usize = 20;
    let http = HttpConfig {
        max_connections: LIMIT,
        header_read_timeout: Duration::from_secs(2),
        idle_timeout: Duration::from_secs(3),
        ..HttpConfig::default()
    };
    let harness = harness_with(&[], Vec::new(), http).await;
    let address = harness.server.address();
    // More idle connections than the limit, plus slowloris clients.
    let mut idle = Vec::with_capacity(LIMIT + 10);
    for _ in 0..LIMIT + 10 {
        idle.push(tokio::net::TcpStream::connect(address).await.unwrap());
    }
    let mut slow = tokio::task::JoinSet::new();
    for _ in 0..3 {
        let stream = tokio::net::TcpStream::connect(address).await.unwrap();
        slow.spawn(slowloris(stream));
    }
    // A newcomer makes room: the oldest connection on which no request came
    // is closed, and /health is served at once on the first try.
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    let url = format!("{}/health", harness.server.url());
    for _ in 0..3 {
        let response = client
            .get(&url)
            .send()
            .await
            .expect("/health answers during the flood");
        assert_eq!(response.status(), StatusCode::OK);
    }
    let mut closed = 0;
    for stream in &mut idle {
        closed += usize::from(closed_by_server(stream).await);
    }
    while let Some(result) = slow.join_next().await {
        closed += usize::from(result.unwrap());
    }
    assert_eq!(closed, LIMIT + 10 + 3, "connections the server left open");
}
