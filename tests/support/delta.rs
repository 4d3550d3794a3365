//! Delta tables read and written with PyPI `deltalake` (delta-rs's Python
//! package, in the venv `scripts/lake-readers` prepares): an independent
//! reader of what the delta sink commits.
#![cfg(feature = "delta-sink")]

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use serde_json::Value;

/// The venv's python, prepared once per test process.
fn python() -> &'static PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let prepared = Command::new(root.join("scripts/lake-readers"))
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/lake-readers runs");
        assert!(prepared.status.success(), "scripts/lake-readers failed");
        PathBuf::from(String::from_utf8(prepared.stdout).unwrap().trim())
    })
}

/// Runs `script` with `args` (argv[1..]) and parses what it prints as JSON.
fn try_run(script: &str, args: &[&str]) -> Result<Value, String> {
    // deltalake's runtime threads abort the interpreter at its normal exit
    // ("terminate called without an active exception") after reading a
    // local table: leave at once once the answer is out.
    let script = format!("{script}\nimport os, sys\nsys.stdout.flush()\nos._exit(0)\n");
    let output = Command::new(python())
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
        .expect("the lake venv's python runs");
    if !output.status.success() {
        return Err(String::from_utf8_lossy(&output.stderr).into_owned());
    }
    serde_json::from_slice(&output.stdout).map_err(|error| error.to_string())
}

fn run(script: &str, args: &[&str]) -> Value {
    try_run(script, args).unwrap_or_else(|error| panic!("deltalake script failed: {error}"))
}

/// A table's location and the storage options to read it.
#[derive(Clone)]
pub struct Table {
    pub uri: String,
    pub options: Value,
}

impl Table {
    pub fn local(path: &std::path::Path) -> Self {
        Self {
            uri: format!("file://{}", path.display()),
            options: Value::Object(Default::default()),
        }
    }

    /// An `s3://` table on an S3-compatible `endpoint` (credentials test/test).
    pub fn s3(endpoint: &str, bucket_and_path: &str) -> Self {
        Self {
            uri: format!("s3://{bucket_and_path}"),
            options: serde_json::json!({
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": "test",
                "AWS_SECRET_ACCESS_KEY": "test",
                "AWS_REGION": "us-east-1",
                "AWS_ALLOW_HTTP": "true",
                "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
            }),
        }
    }

    /// An `az://` table in Azurite's account at `endpoint` (path-style,
    /// `http://127.0.0.1:PORT/devstoreaccount1`), read with its key.
    pub fn azure(endpoint: &str, container_and_path: &str) -> Self {
        use super::azurite::{ACCOUNT, KEY};
        Self {
            uri: format!("az://{container_and_path}"),
            options: serde_json::json!({
                "azure_storage_account_name": ACCOUNT,
                "azure_storage_account_key": KEY,
                "azure_storage_endpoint": endpoint,
                "allow_http": "true",
            }),
        }
    }

    /// Every row of the table's current version, as JSON objects
    /// (timestamps as ISO strings).
    pub fn rows(&self) -> Vec<Value> {
        self.try_rows()
            .unwrap_or_else(|error| panic!("reading {}: {error}", self.uri))
    }

    pub fn try_rows(&self) -> Result<Vec<Value>, String> {
        const SCRIPT: &str = r#"
import json, sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2]))
print(json.dumps(t.to_pyarrow_table().to_pylist(), default=str))
"#;
        let rows = try_run(SCRIPT, &[&self.uri, &self.options.to_string()])?;
        rows.as_array()
            .cloned()
            .ok_or_else(|| format!("not a list of rows: {rows}"))
    }

    /// The version of application transaction `app_id` the table records.
    pub fn transaction_version(&self, app_id: &str) -> Option<i64> {
        const SCRIPT: &str = r#"
import json, sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2]))
print(json.dumps(t.transaction_version(sys.argv[3])))
"#;
        run(SCRIPT, &[&self.uri, &self.options.to_string(), app_id]).as_i64()
    }

    /// The table's version and its schema's `(name, type)` columns.
    pub fn version_and_columns(&self) -> (i64, Vec<(String, String)>) {
        const SCRIPT: &str = r#"
import json, sys
from deltalake import DeltaTable
t = DeltaTable(sys.argv[1], storage_options=json.loads(sys.argv[2]))
fields = [(f.name, str(f.type.type)) for f in t.schema().fields]
print(json.dumps([t.version(), fields]))
"#;
        let out = run(SCRIPT, &[&self.uri, &self.options.to_string()]);
        let columns = out[1]
            .as_array()
            .unwrap()
            .iter()
            .map(|pair| {
                (
                    pair[0].as_str().unwrap().to_owned(),
                    pair[1].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        (out[0].as_i64().unwrap(), columns)
    }

    /// Creates an empty table with `schema` (pyarrow type names by column:
    /// `[["n", "int64"], ["name", "string"]]`), as another writer would.
    pub fn create(&self, schema: &[(&str, &str)]) {
        const SCRIPT: &str = r#"
import json, sys
import pyarrow as pa
from deltalake import write_deltalake
fields = [pa.field(name, getattr(pa, kind)()) for name, kind in json.loads(sys.argv[3])]
write_deltalake(sys.argv[1], pa.schema(fields).empty_table(), storage_options=json.loads(sys.argv[2]))
print("null")
"#;
        let schema = serde_json::to_string(schema).unwrap();
        run(SCRIPT, &[&self.uri, &self.options.to_string(), &schema]);
    }
}
