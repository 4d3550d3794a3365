//! An S3 API for one test: moto's S3 server (`moto_server`, from PyPI, in the
//! venv `scripts/s3-emulator` prepares) on a free loopback port, stopped by
//! PID on drop (and with the test process). Behind it, a TCP relay the test
//! can take down to simulate an outage without losing what moto stores.
//! Objects are read back with boto3 from the same venv, independently of the
//! sink's client.
#![cfg(any(
    feature = "s3-sink",
    feature = "delta-sink",
    feature = "iceberg-sink",
    feature = "object-store-source",
    feature = "kafka-source",
    feature = "kafka-sink"
))]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

pub struct S3Server {
    child: Child,
    /// The venv's python, with boto3.
    python: std::path::PathBuf,
    /// moto itself.
    direct: String,
    /// The relay in front of it: what a sink under test is given.
    relay: String,
    down: Arc<AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
}

impl S3Server {
    pub async fn start() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/s3-emulator"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/s3-emulator runs");
        assert!(prepared.status.success(), "scripts/s3-emulator failed");
        let binary = String::from_utf8(prepared.stdout)
            .unwrap()
            .trim()
            .to_owned();
        let port = super::ports::free_port();
        let mut command = Command::new(&binary);
        command
            .args(["-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
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
        let child = command.spawn().expect("start moto_server");
        let direct = format!("http://127.0.0.1:{port}");
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if client.get(&direct).send().await.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer in 60 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (relay, down, cut) = relay(port).await;
        let python = Path::new(&binary).with_file_name("python");
        Self {
            child,
            python,
            direct,
            relay,
            down,
            cut,
        }
    }

    /// The endpoint URL to give a sink (through the relay).
    pub fn endpoint(&self) -> &str {
        &self.relay
    }

    /// Takes the endpoint down (`true`: connections are cut and refused) or up.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
        if down {
            self.cut.send_modify(|generation| *generation += 1);
        }
    }

    pub async fn create_bucket(&self, bucket: &str) {
        let response = reqwest::Client::new()
            .put(format!("{}/{bucket}", self.direct))
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{response:?}");
    }

    /// Every object in `bucket` (key, content), sorted by key, read with
    /// boto3 from moto's venv (signed requests: moto refuses unsigned reads
    /// of private objects).
    pub fn objects(&self, bucket: &str) -> Vec<(String, Vec<u8>)> {
        const SCRIPT: &str = r#"
import base64, json, sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
out = {}
for page in s3.get_paginator("list_objects_v2").paginate(Bucket=sys.argv[2]):
    for item in page.get("Contents", []):
        body = s3.get_object(Bucket=sys.argv[2], Key=item["Key"])["Body"].read()
        out[item["Key"]] = base64.b64encode(body).decode()
print(json.dumps(out))
"#;
        let output = Command::new(&self.python)
            .args(["-c", SCRIPT, &self.direct, bucket])
            .stderr(Stdio::inherit())
            .output()
            .expect("moto's python runs");
        assert!(
            output.status.success(),
            "reading {bucket} with boto3 failed"
        );
        let listed: std::collections::BTreeMap<String, String> =
            serde_json::from_slice(&output.stdout).expect("the script's JSON");
        use base64::Engine;
        listed
            .into_iter()
            .map(|(key, body)| {
                let body = base64::engine::general_purpose::STANDARD
                    .decode(body)
                    .expect("base64");
                (key, body)
            })
            .collect()
    }
}

impl S3Server {
    /// The ETag S3 gave `key` (a multipart upload's ends in `-{parts}`).
    pub fn etag(&self, bucket: &str, key: &str) -> String {
        const SCRIPT: &str = r#"
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], region_name="us-east-1",
                  aws_access_key_id="test", aws_secret_access_key="test")
print(s3.head_object(Bucket=sys.argv[2], Key=sys.argv[3])["ETag"])
"#;
        let output = Command::new(&self.python)
            .args(["-c", SCRIPT, &self.direct, bucket, key])
            .stderr(Stdio::inherit())
            .output()
            .expect("moto's python runs");
        assert!(output.status.success(), "head of {key} failed");
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP relay to moto on `port` that cuts and refuses connections while down.
async fn relay(port: u16) -> (String, Arc<AtomicBool>, tokio::sync::watch::Sender<u64>) {
    let listener = super::ports::listener();
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let address = format!("http://{}", listener.local_addr().unwrap());
    let down = Arc::new(AtomicBool::new(false));
    let (cut, _) = tokio::sync::watch::channel(0u64);
    let (flag, cuts) = (down.clone(), cut.clone());
    tokio::spawn(async move {
        loop {
            let Ok((mut inbound, _)) = listener.accept().await else {
                continue;
            };
            if flag.load(Ordering::SeqCst) {
                drop(inbound);
                continue;
            }
            let mut cut = cuts.subscribe();
            tokio::spawn(async move {
                let Ok(mut outbound) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await
                else {
                    return;
                };
                tokio::select! {
                    _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                    _ = cut.changed() => {}
                }
            });
        }
    });
    (address, down, cut)
}
