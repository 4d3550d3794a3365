//! An Azure Blob Storage API for one test: Microsoft's Azurite emulator
//! (npm `azurite`, installed by `scripts/ensure-azurite`) on a free loopback
//! port with its data in a temp dir, stopped by PID on drop (and with the
//! test process). Containers are created with a Shared Key signed request
//! from Python's standard library, independently of the client under test.
#![cfg(feature = "object-store-source")]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Azurite's well-known development account and key.
pub const ACCOUNT: &str = "devstoreaccount1";
pub const KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct Azurite {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Azurite {
    pub async fn start() -> Self {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/ensure-azurite"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/ensure-azurite runs");
        assert!(prepared.status.success(), "scripts/ensure-azurite failed");
        let binary = String::from_utf8(prepared.stdout)
            .unwrap()
            .trim()
            .to_owned();
        let data = tempfile::tempdir().expect("temp dir");
        let port = super::ports::free_port();
        let mut command = Command::new(&binary);
        command
            .args(["--blobHost", "127.0.0.1", "--blobPort"])
            .arg(port.to_string())
            .arg("--location")
            .arg(data.path())
            .args(["--silent", "--skipApiVersionCheck", "--loose"])
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
        let child = command.spawn().expect("start azurite-blob");
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "azurite did not listen in 60 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Self {
            child,
            port,
            _data: data,
        }
    }

    /// The account's blob endpoint (path-style: `http://127.0.0.1:PORT/devstoreaccount1`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}/{ACCOUNT}", self.port)
    }

    /// Creates `container` (a signed `PUT ?restype=container`).
    pub fn create_container(&self, container: &str) {
        const SCRIPT: &str = r#"
import base64, hashlib, hmac, sys, urllib.error, urllib.request
from email.utils import formatdate
endpoint, account, key, container = sys.argv[1:5]
date = formatdate(usegmt=True)
version = "2021-08-06"
content_type = "application/octet-stream"
to_sign = "PUT\n\n\n\n\n" + content_type + "\n\n\n\n\n\n\n" + \
    f"x-ms-date:{date}\nx-ms-version:{version}\n" + \
    f"/{account}/{account}/{container}\nrestype:container"
signature = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
request = urllib.request.Request(f"{endpoint}/{container}?restype=container", method="PUT", data=b"",
    headers={"Content-Type": content_type, "x-ms-date": date, "x-ms-version": version, "Authorization": f"SharedKey {account}:{signature}"})
try:
    urllib.request.urlopen(request)
except urllib.error.HTTPError as error:
    sys.exit(f"{error}: {error.read().decode()}")
"#;
        let status = Command::new("python3")
            .args(["-c", SCRIPT, &self.endpoint(), ACCOUNT, KEY, container])
            .status()
            .expect("python3 runs");
        assert!(status.success(), "creating container {container} failed");
    }

    /// The `plugin_config` options of a client of this account.
    pub fn options(&self) -> Vec<(&'static str, String)> {
        vec![
            ("azure_storage_account_name", ACCOUNT.to_owned()),
            ("azure_storage_account_key", KEY.to_owned()),
            ("azure_storage_endpoint", self.endpoint()),
            ("allow_http", "true".to_owned()),
        ]
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
