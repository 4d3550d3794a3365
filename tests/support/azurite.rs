//! An Azure Blob Storage API for one test: Microsoft's Azurite emulator
//! (npm `azurite`, installed by `scripts/ensure-azurite`) on a free loopback
//! port with its data in a temp dir, stopped by PID on drop (and with the
//! test process). Containers are created, blobs listed and read back, and
//! SAS tokens signed with Python's standard library (Shared Key),
//! independently of the client under test.
#![cfg(any(
    feature = "object-store-source",
    feature = "s3-sink",
    feature = "delta-sink",
    feature = "iceberg-sink"
))]

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

    /// The Azurite port (the blob endpoint's).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Creates `container` (a signed `PUT ?restype=container`).
    pub fn create_container(&self, container: &str) {
        const SCRIPT: &str = r#"
endpoint, account, key, container = sys.argv[1:5]
signed("PUT", endpoint, account, key, f"/{container}", {"restype": "container"})
"#;
        let status = Command::new("python3")
            .args(["-c", &format!("{SHARED_KEY}{SCRIPT}")])
            .args([&self.endpoint(), ACCOUNT, KEY, container])
            .status()
            .expect("python3 runs");
        assert!(status.success(), "creating container {container} failed");
    }

    /// Every blob of `container` under `prefix`, by name, with its bytes
    /// (a signed `List Blobs`, then a signed `Get Blob` each).
    pub fn blobs(&self, container: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
        const SCRIPT: &str = r#"
import json, xml.etree.ElementTree as ET
endpoint, account, key, container, prefix = sys.argv[1:6]
names, marker = [], ""
while True:
    query = {"restype": "container", "comp": "list"}
    if prefix:
        query["prefix"] = prefix
    if marker:
        query["marker"] = marker
    root = ET.fromstring(signed("GET", endpoint, account, key, f"/{container}", query))
    names += [blob.findtext("Name") for blob in root.iter("Blob")]
    marker = root.findtext("NextMarker") or ""
    if not marker:
        break
out = [[name, base64.b64encode(signed("GET", endpoint, account, key, f"/{container}/{name}", {})).decode()] for name in names]
print(json.dumps(out))
"#;
        let output = Command::new("python3")
            .args(["-c", &format!("{SHARED_KEY}{SCRIPT}")])
            .args([&self.endpoint(), ACCOUNT, KEY, container, prefix])
            .output()
            .map_err(|error| error.to_string())?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).into_owned());
        }
        let listed: Vec<(String, String)> =
            serde_json::from_slice(&output.stdout).map_err(|error| error.to_string())?;
        use base64::Engine;
        listed
            .into_iter()
            .map(|(name, body)| {
                base64::engine::general_purpose::STANDARD
                    .decode(body)
                    .map(|bytes| (name, bytes))
                    .map_err(|error| error.to_string())
            })
            .collect()
    }

    /// An account SAS for the blob service (every permission, every
    /// resource type, valid until 2099), signed with the account's key.
    pub fn account_sas(&self) -> String {
        const SCRIPT: &str = r#"
account, key = sys.argv[1:3]
fields = {"sv": "2019-12-12", "ss": "b", "srt": "sco", "sp": "rwdlacup", "se": "2099-01-01T00:00:00Z", "spr": "https,http"}
to_sign = "\n".join([account, fields["sp"], fields["ss"], fields["srt"], "", fields["se"], "", fields["spr"], fields["sv"], ""])
fields["sig"] = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
print(urllib.parse.urlencode(fields))
"#;
        let output = Command::new("python3")
            .args(["-c", &format!("{SHARED_KEY}{SCRIPT}")])
            .args([ACCOUNT, KEY])
            .output()
            .expect("python3 runs");
        assert!(output.status.success(), "signing a SAS failed");
        String::from_utf8(output.stdout).unwrap().trim().to_owned()
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

/// `signed(method, endpoint, account, key, path, query)`: one Shared Key
/// signed request to Azurite's path-style endpoint; the answer's body.
const SHARED_KEY: &str = r#"
import base64, hashlib, hmac, sys, urllib.error, urllib.parse, urllib.request
from email.utils import formatdate
def signed(method, endpoint, account, key, path, query):
    date = formatdate(usegmt=True)
    version = "2021-08-06"
    content_type = "application/octet-stream" if method == "PUT" else ""
    canonical = f"/{account}/{account}{urllib.parse.quote(path)}" + "".join(
        f"\n{name}:{value}" for name, value in sorted(query.items()))
    to_sign = f"{method}\n\n\n\n\n{content_type}\n\n\n\n\n\n\n" + \
        f"x-ms-date:{date}\nx-ms-version:{version}\n" + canonical
    signature = base64.b64encode(hmac.new(base64.b64decode(key), to_sign.encode(), hashlib.sha256).digest()).decode()
    headers = {"x-ms-date": date, "x-ms-version": version, "Authorization": f"SharedKey {account}:{signature}"}
    if content_type:
        headers["Content-Type"] = content_type
    url = f"{endpoint}{urllib.parse.quote(path)}" + ("?" + urllib.parse.urlencode(query) if query else "")
    request = urllib.request.Request(url, method=method, data=b"" if method == "PUT" else None, headers=headers)
    try:
        with urllib.request.urlopen(request) as answer:
            return answer.read()
    except urllib.error.HTTPError as error:
        sys.exit(f"{method} {url}: {error}: {error.read().decode()}")
"#;

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
