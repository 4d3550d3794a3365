//! Iceberg tables read back with PyPI `pyiceberg` (in the venv
//! `scripts/lake-readers` prepares): an independent reader of what the
//! iceberg sink commits. A table is found by its directory: its newest
//! `NNNNN-<uuid>.metadata.json` is opened with `StaticTable.from_metadata`.
#![cfg(feature = "iceberg-sink")]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The venv's python, prepared once per test process.
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/lake-readers"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/lake-readers runs");
        assert!(prepared.status.success(), "scripts/lake-readers failed");
        PathBuf::from(String::from_utf8(prepared.stdout).unwrap().trim())
    })
}

/// Opens the table at `sys.argv[1]` (its directory) as `t`.
const OPEN: &str = r#"
import glob, json, os, re, sys
from pyiceberg.table import StaticTable
files = glob.glob(os.path.join(sys.argv[1], "metadata", "*.metadata.json"))
if not files:
    raise SystemExit("no metadata file under " + sys.argv[1])
newest = max(files, key=lambda f: int(re.match(r"(\d+)-", os.path.basename(f)).group(1)))
t = StaticTable.from_metadata("file://" + newest, properties=json.loads(os.environ.get("ICEBERG_PROPERTIES") or "{}"))
"#;

/// Runs `script` on the table at `dir` (read with pyiceberg's FileIO
/// `properties`) with `args` as `sys.argv[2..]`.
fn try_run_with(
    script: &str,
    dir: &Path,
    properties: &Value,
    args: &[&str],
) -> Result<Value, String> {
    let output = Command::new(python())
        .arg("-c")
        .arg(format!("{OPEN}\n{script}"))
        .arg(dir)
        .args(args)
        .env("ICEBERG_PROPERTIES", properties.to_string())
        .output()
        .expect("the lake venv's python runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_slice(&output.stdout).map_err(|error| error.to_string())
}

/// A table by its metadata's directory (`<warehouse>/<namespace>/<table>`).
#[derive(Clone)]
pub struct Table {
    pub dir: PathBuf,
    /// pyiceberg's FileIO properties (S3 endpoint and keys).
    pub properties: Value,
}

impl Table {
    pub fn at(warehouse: &Path, namespace: &str, table: &str) -> Self {
        Self {
            dir: warehouse.join(namespace).join(table),
            properties: Value::Object(Default::default()),
        }
    }

    /// The same, its data files on the S3 API at `endpoint` (keys test/test).
    pub fn on_s3(mut self, endpoint: &str) -> Self {
        self.properties = serde_json::json!({
            "s3.endpoint": endpoint,
            "s3.access-key-id": "test",
            "s3.secret-access-key": "test",
            "s3.region": "us-east-1",
        });
        self
    }

    /// The same, its data files in Azurite's account (at `port`), read with
    /// pyarrow's Azure filesystem and the account's key.
    pub fn on_azurite(mut self, port: u16) -> Self {
        use super::azurite::{ACCOUNT, KEY};
        let authority = format!("127.0.0.1:{port}");
        self.properties = serde_json::json!({
            "adls.account-name": ACCOUNT,
            "adls.account-key": KEY,
            "adls.blob-storage-authority": authority,
            "adls.dfs-storage-authority": authority,
            "adls.blob-storage-scheme": "http",
            "adls.dfs-storage-scheme": "http",
        });
        self
    }

    fn run(&self, script: &str, args: &[&str]) -> Result<Value, String> {
        try_run_with(script, &self.dir, &self.properties, args)
    }

    /// Every row of the current snapshot, as JSON objects (timestamps as
    /// strings).
    pub fn rows(&self) -> Vec<Value> {
        self.try_rows()
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.dir.display()))
    }

    pub fn try_rows(&self) -> Result<Vec<Value>, String> {
        let rows = self.run(
            "print(json.dumps(t.scan().to_arrow().to_pylist(), default=str))",
            &[],
        )?;
        rows.as_array()
            .cloned()
            .ok_or_else(|| format!("not a list of rows: {rows}"))
    }

    /// The snapshots, oldest first (by sequence number: the metadata file
    /// lists them in no order): `{"operation", "properties"}` of each summary.
    pub fn snapshots(&self) -> Vec<Value> {
        const SCRIPT: &str = r#"
out = []
for s in sorted(t.snapshots(), key=lambda s: s.sequence_number):
    summary = s.summary
    out.append({"operation": str(summary.operation.value), "properties": dict(summary.additional_properties)})
print(json.dumps(out))
"#;
        let snapshots = self
            .run(SCRIPT, &[])
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.dir.display()));
        snapshots.as_array().cloned().unwrap()
    }

    /// The current snapshot's summary property `name`.
    pub fn property(&self, name: &str) -> Option<String> {
        const SCRIPT: &str = r#"
s = t.current_snapshot()
print(json.dumps(None if s is None else s.summary.additional_properties.get(sys.argv[2])))
"#;
        let out = self
            .run(SCRIPT, &[name])
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.dir.display()));
        out.as_str().map(str::to_owned)
    }

    /// The `(name, type)` columns of the current schema.
    pub fn columns(&self) -> Vec<(String, String)> {
        let out = self
            .run(
                "print(json.dumps([[f.name, str(f.field_type)] for f in t.schema().fields]))",
                &[],
            )
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.dir.display()));
        out.as_array()
            .unwrap()
            .iter()
            .map(|pair| {
                (
                    pair[0].as_str().unwrap().to_owned(),
                    pair[1].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    }
}
