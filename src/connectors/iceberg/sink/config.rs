//! The `iceberg` sink's `plugin_config`: upstream's fields (`tables`,
//! `catalog_type`, `warehouse`, `uri`, `dynamic_routing`,
//! `dynamic_route_field`, `store_*`), plus a local memory catalog over a
//! filesystem warehouse, table creation (`create_table`, `columns`) and the
//! flush triggers.

use std::collections::BTreeMap;
use std::time::Duration;

use iceberg::spec::PrimitiveType;
use iceberg::{NamespaceIdent, TableIdent};
use secrecy::SecretString;
use serde::Deserialize;

use crate::connectors::PluginConfigError;
use crate::connectors::kit::lake::{self, Column};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IcebergSinkConfig {
    /// The tables written, as `namespace.table` (`a.b.table` for a nested
    /// namespace). Static routing writes every message to every table;
    /// dynamic routing picks one of them per message.
    pub tables: Vec<String>,
    /// `rest` (upstream's: an Iceberg REST catalog at `uri`) or `memory` (ours:
    /// a catalog kept by this process over the filesystem warehouse at
    /// `warehouse`, found again at each start from the tables' newest
    /// metadata files; for one writer). `sql`/`glue`/`hms` are not built in.
    #[serde(default = "default_catalog_type")]
    pub catalog_type: String,
    /// `rest`: the warehouse name or location sent to the catalog (optional).
    /// `memory`: the warehouse directory, a path or a `file://` URL (required).
    #[serde(default)]
    pub warehouse: Option<String>,
    /// The REST catalog's base URL (`http://host:8181`); required with `rest`.
    #[serde(default)]
    pub uri: Option<String>,
    /// Route each message to the table named by its `dynamic_route_field`
    /// (one of `tables`) instead of writing it to every table.
    #[serde(default)]
    pub dynamic_routing: bool,
    /// The top-level JSON field holding the table name with `dynamic_routing`.
    #[serde(default)]
    pub dynamic_route_field: String,
    /// The S3 endpoint of the tables' files (upstream's `store_*` settings,
    /// used for tables located on `s3://`; path-style addressing). Unset:
    /// AWS's own endpoint for the region.
    #[serde(default)]
    pub store_url: Option<String>,
    /// S3 access key; both or neither with `store_secret_access_key`.
    /// Neither: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` from the
    /// environment, then the instance's role.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub store_access_key_id: Option<SecretString>,
    /// S3 secret key that goes with `store_access_key_id`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub store_secret_access_key: Option<SecretString>,
    /// The S3 region (default: `AWS_REGION`, then `us-east-1`).
    #[serde(default)]
    pub store_region: Option<String>,
    /// The object store kind: `s3` (upstream's), `azure` or `gcs`. The
    /// table's location decides where its files go; this is checked only
    /// for a known value.
    #[serde(default)]
    pub store_class: Option<String>,
    /// Options of the Azure Blob / ADLS Gen2 and GCS stores, for tables
    /// located on `az://`, `abfs://`, `abfss://` or `gs://`, by the
    /// `object_store` crate's names: `azure_storage_account_name` with
    /// `azure_storage_account_key`, `azure_storage_sas_key` or a service
    /// principal (`azure_client_id`, `azure_client_secret`,
    /// `azure_tenant_id`), `azure_storage_endpoint`; GCS
    /// `google_service_account_key` (the JSON), `google_service_account`
    /// (its path), `google_application_credentials`. Unset, each store's
    /// environment and default credentials. Values are treated as secrets.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub store_options: BTreeMap<String, SecretString>,
    /// Create a missing table at open from `columns` (unpartitioned, its
    /// namespace too). Off (upstream's behaviour): a missing table is fatal.
    #[serde(default)]
    pub create_table: bool,
    /// The columns of a table `create_table` creates, in order: `{ name =
    /// "id", type = "long", nullable = false }`. Types are Iceberg's:
    /// `boolean`, `int`, `long`, `float`, `double`, `string`, `date`,
    /// `timestamp`, `timestamptz`, `decimal(p,s)` (the ones a JSON value
    /// decodes into). When a
    /// table exists, its columns must match these (names and types).
    #[serde(default)]
    pub columns: Vec<Column>,
    /// Commit once this many messages are buffered for a topic.
    #[serde(default = "lake::default_max_messages")]
    pub max_messages_per_file: u64,
    /// Commit once a topic's buffered rows take this much memory (Arrow
    /// columns, before Parquet encoding: `"64MiB"`, `"500KB"`, or bytes).
    #[serde(default = "lake::default_max_file_size")]
    pub max_file_size: String,
    /// Commit what is buffered once the oldest message waiting is this old
    /// (`"0s"`: only on the size and count triggers and at a stop).
    #[serde(
        default = "lake::default_flush_interval",
        with = "crate::config::duration"
    )]
    #[schemars(with = "crate::config::duration::Text")]
    pub flush_interval: Duration,
    /// How long one table's commit (data files written, then the catalog
    /// commit) may take; a slower one is abandoned and the flush retried
    /// (the offset markers keep a commit that landed meanwhile from being
    /// appended twice).
    #[serde(default = "default_commit_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub commit_timeout: Duration,
}

/// Which catalog keeps the tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Catalog {
    Rest {
        uri: String,
    },
    /// The warehouse as a `file://` URL without a trailing slash.
    Memory {
        warehouse: String,
    },
}

/// What [`IcebergSinkConfig::validate`] derives.
#[derive(Debug, Clone)]
pub struct Checked {
    pub catalog: Catalog,
    /// `tables`, parsed, in order.
    pub tables: Vec<TableIdent>,
    pub columns: Vec<(String, PrimitiveType, bool)>,
    pub max_bytes: u64,
}

impl IcebergSinkConfig {
    /// Checks what serde cannot, naming the field.
    pub fn validate(&self) -> Result<Checked, PluginConfigError> {
        if self.tables.is_empty() {
            return Err(PluginConfigError::new(
                "tables",
                "list at least one table, e.g. [\"namespace.table\"]",
            ));
        }
        let mut tables = Vec::with_capacity(self.tables.len());
        for (index, name) in self.tables.iter().enumerate() {
            let ident = parse_table(name)
                .map_err(|message| PluginConfigError::new(format!("tables[{index}]"), message))?;
            if tables.contains(&ident) {
                return Err(PluginConfigError::new(
                    format!("tables[{index}]"),
                    format!("\"{name}\" is listed twice"),
                ));
            }
            tables.push(ident);
        }
        let catalog = match self.catalog_type.trim().to_ascii_lowercase().as_str() {
            "rest" => {
                let uri = self.uri.as_deref().map(str::trim).unwrap_or_default();
                if !(uri.starts_with("http://") || uri.starts_with("https://")) {
                    return Err(PluginConfigError::new(
                        "uri",
                        format!(
                            "the REST catalog's http:// or https:// URL is required with catalog_type = \"rest\", found {:?}",
                            self.uri
                        ),
                    ));
                }
                Catalog::Rest {
                    uri: uri.trim_end_matches('/').to_owned(),
                }
            }
            "memory" => Catalog::Memory {
                warehouse: warehouse_url(self.warehouse.as_deref())?,
            },
            other => {
                return Err(PluginConfigError::new(
                    "catalog_type",
                    format!(
                        "expected \"rest\" or \"memory\" (a local filesystem warehouse), found \"{other}\"; sql, glue and hms catalogs are not built into iggy-connect"
                    ),
                ));
            }
        };
        if self.dynamic_routing && self.dynamic_route_field.trim().is_empty() {
            return Err(PluginConfigError::new(
                "dynamic_route_field",
                "required with dynamic_routing = true: the top-level JSON field naming the table",
            ));
        }
        if self.store_access_key_id.is_some() != self.store_secret_access_key.is_some() {
            return Err(PluginConfigError::new(
                "store_access_key_id",
                "set both store_access_key_id and store_secret_access_key, or neither",
            ));
        }
        if let Some(url) = self.store_url.as_deref().map(str::trim)
            && !url.is_empty()
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(PluginConfigError::new(
                "store_url",
                format!("expected an http:// or https:// URL, found \"{url}\""),
            ));
        }
        if let Some(class) = &self.store_class
            && !["s3", "azure", "gcs"]
                .iter()
                .any(|known| class.eq_ignore_ascii_case(known))
        {
            return Err(PluginConfigError::new(
                "store_class",
                format!("expected \"s3\", \"azure\" or \"gcs\", found \"{class}\""),
            ));
        }
        let mut columns = Vec::with_capacity(self.columns.len());
        for (index, column) in self.columns.iter().enumerate() {
            let field = format!("columns[{index}]");
            if column.name.trim().is_empty() {
                return Err(PluginConfigError::new(
                    format!("{field}.name"),
                    "must not be empty",
                ));
            }
            let data_type = parse_type(&column.data_type)
                .map_err(|message| PluginConfigError::new(format!("{field}.type"), message))?;
            columns.push((column.name.clone(), data_type, column.nullable));
        }
        if self.create_table && columns.is_empty() {
            return Err(PluginConfigError::new(
                "columns",
                "required with create_table = true: the new table's columns, e.g. [{ name = \"id\", type = \"long\" }]",
            ));
        }
        if self.commit_timeout.is_zero() {
            return Err(PluginConfigError::new("commit_timeout", "must be above 0"));
        }
        let max_bytes = lake::max_bytes(self.max_messages_per_file, &self.max_file_size)?;
        Ok(Checked {
            catalog,
            tables,
            columns,
            max_bytes,
        })
    }
}

/// `namespace.table`: the last dot separates the table from its namespace.
fn parse_table(name: &str) -> Result<TableIdent, String> {
    let parts: Vec<&str> = name.trim().split('.').collect();
    if parts.len() < 2 || parts.iter().any(|part| part.is_empty()) {
        return Err(format!("expected \"namespace.table\", found \"{name}\""));
    }
    let (table, namespace) = parts.split_last().ok_or("empty")?;
    let namespace = NamespaceIdent::from_strs(namespace).map_err(|error| error.to_string())?;
    Ok(TableIdent::new(namespace, (*table).to_owned()))
}

/// The memory catalog's warehouse as a `file://` URL (a path made absolute).
fn warehouse_url(warehouse: Option<&str>) -> Result<String, PluginConfigError> {
    let bad = |why: String| PluginConfigError::new("warehouse", why);
    let text = warehouse.map(str::trim).unwrap_or_default();
    if text.is_empty() {
        return Err(bad(
            "required with catalog_type = \"memory\": the warehouse directory (a path or file:// URL)"
                .to_owned(),
        ));
    }
    let path = match text.strip_prefix("file://") {
        Some(path) => std::path::PathBuf::from(path),
        None if text.contains("://") => {
            return Err(bad(format!(
                "the memory catalog writes to a local directory: expected a path or a file:// URL, found \"{text}\""
            )));
        }
        None => std::path::absolute(text).map_err(|error| bad(format!("\"{text}\": {error}")))?,
    };
    if !path.is_absolute() {
        return Err(bad(format!("\"{text}\" is not an absolute file:// URL")));
    }
    Ok(format!(
        "file://{}",
        path.display().to_string().trim_end_matches('/')
    ))
}

/// An Iceberg primitive type by its spec name, of those a JSON value
/// decodes into (not binary, fixed, uuid, time, the nanosecond timestamps).
fn parse_type(text: &str) -> Result<PrimitiveType, String> {
    let name = text.trim().to_ascii_lowercase().replace(' ', "");
    let parsed = serde_json::from_value::<PrimitiveType>(serde_json::Value::String(name)).ok();
    match parsed {
        Some(
            kind @ (PrimitiveType::Boolean
            | PrimitiveType::Int
            | PrimitiveType::Long
            | PrimitiveType::Float
            | PrimitiveType::Double
            | PrimitiveType::String
            | PrimitiveType::Date
            | PrimitiveType::Timestamp
            | PrimitiveType::Timestamptz
            | PrimitiveType::Decimal { .. }),
        ) => Ok(kind),
        _ => Err(format!(
            "expected an Iceberg type a JSON value fits (boolean, int, long, float, double, string, date, timestamp, timestamptz, decimal(p,s)), found \"{text}\""
        )),
    }
}

fn default_catalog_type() -> String {
    "rest".to_owned()
}

fn default_commit_timeout() -> Duration {
    Duration::from_secs(120)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<IcebergSinkConfig, PluginConfigError> {
        let mut value = serde_json::json!({
            "tables": ["shop.orders"],
            "catalog_type": "memory",
            "warehouse": "/tmp/w",
        });
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_a_memory_catalog_when_validated_should_have_a_file_warehouse_and_defaults() {
        let config = config(serde_json::json!({})).unwrap();
        let checked = config.validate().unwrap();
        assert_eq!(
            checked.catalog,
            Catalog::Memory {
                warehouse: "file:///tmp/w".into()
            }
        );
        assert_eq!(checked.tables[0].namespace().join("."), "shop");
        assert_eq!(checked.tables[0].name(), "orders");
        assert_eq!(checked.max_bytes, 64 << 20);
        assert_eq!(config.max_messages_per_file, 100_000);
        assert_eq!(config.flush_interval, Duration::from_secs(10));
    }

    #[test]
    fn given_upstreams_rest_fields_when_validated_should_accept_them() {
        let config = config(serde_json::json!({
            "tables": ["test.messages", "a.b.c"],
            "catalog_type": "rest",
            "warehouse": "warehouse",
            "uri": "http://localhost:8181/",
            "dynamic_routing": false,
            "dynamic_route_field": "",
            "store_url": "http://localhost:9000",
            "store_access_key_id": "admin",
            "store_secret_access_key": "password",
            "store_region": "us-east-1",
            "store_class": "s3",
        }))
        .unwrap();
        let checked = config.validate().unwrap();
        assert_eq!(
            checked.catalog,
            Catalog::Rest {
                uri: "http://localhost:8181".into()
            }
        );
        assert_eq!(checked.tables[1].namespace().join("."), "a.b");
    }

    #[test]
    fn given_columns_when_validated_should_parse_iceberg_types() {
        let config = config(serde_json::json!({
            "create_table": true,
            "columns": [
                {"name": "id", "type": "long", "nullable": false},
                {"name": "price", "type": "decimal(10, 2)"},
                {"name": "at", "type": "timestamptz"},
            ],
        }))
        .unwrap();
        let checked = config.validate().unwrap();
        assert_eq!(checked.columns[0].1, PrimitiveType::Long);
        assert_eq!(checked.columns[2].1, PrimitiveType::Timestamptz);
        assert!(!checked.columns[0].2 && checked.columns[1].2);
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        let cases = [
            (serde_json::json!({"tables": []}), "tables"),
            (serde_json::json!({"tables": ["orders"]}), "tables[0]"),
            (serde_json::json!({"tables": ["a.b", "a.b"]}), "tables[1]"),
            (serde_json::json!({"catalog_type": "sql"}), "catalog_type"),
            (serde_json::json!({"catalog_type": "rest"}), "uri"),
            (serde_json::json!({"warehouse": "s3://b/w"}), "warehouse"),
            (
                serde_json::json!({"dynamic_routing": true}),
                "dynamic_route_field",
            ),
            (
                serde_json::json!({"store_access_key_id": "a"}),
                "store_access_key_id",
            ),
            (serde_json::json!({"store_class": "hdfs"}), "store_class"),
            (
                serde_json::json!({"store_url": "localhost:9000"}),
                "store_url",
            ),
            (serde_json::json!({"create_table": true}), "columns"),
            (
                serde_json::json!({"columns": [{"name": "a", "type": "text"}]}),
                "columns[0].type",
            ),
            (
                serde_json::json!({"columns": [{"name": "a", "type": "uuid"}]}),
                "columns[0].type",
            ),
            (
                serde_json::json!({"max_messages_per_file": 0}),
                "max_messages_per_file",
            ),
            (
                serde_json::json!({"commit_timeout": "0s"}),
                "commit_timeout",
            ),
            (
                serde_json::json!({"max_file_size": "a lot"}),
                "max_file_size",
            ),
        ];
        for (extra, field) in cases {
            let error = config(extra.clone()).unwrap().validate().unwrap_err();
            assert_eq!(error.field, field, "{extra}: {error}");
        }
    }

    #[test]
    fn given_an_unknown_field_when_parsed_should_name_it() {
        let error = config(serde_json::json!({"tabels": ["a.b"]})).unwrap_err();
        assert!(error.to_string().contains("tabels"), "{error}");
    }
}
