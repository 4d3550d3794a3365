//! The `delta` sink's `plugin_config`: upstream's fields (`table_uri` and the
//! storage options), plus table creation (`create_table`, `columns`,
//! `partition_columns`) and the flush triggers.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use deltalake_core::kernel::DataType;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

use crate::connectors::PluginConfigError;
use crate::connectors::kit::lake::{self, Column};

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeltaSinkConfig {
    /// The Delta table: `file:///path/to/table`, `s3://bucket/path/to/table`,
    /// `az://container/path/to/table` (also `abfss://container@account.dfs.core.windows.net/...`)
    /// or `gs://bucket/path/to/table` (a bare path is a local directory).
    pub table_uri: String,
    /// `s3`, `azure` or `gcs` (upstream's); implied by `table_uri`'s scheme,
    /// and it must match it when set.
    #[serde(default)]
    pub storage_backend_type: Option<String>,
    /// S3 access key; set both or neither of it and `aws_s3_secret_key`.
    /// Neither: `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`/`AWS_SESSION_TOKEN`
    /// from the environment, then the instance's role.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub aws_s3_access_key: Option<SecretString>,
    /// S3 secret key that goes with `aws_s3_access_key`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub aws_s3_secret_key: Option<SecretString>,
    /// The bucket's region (default: `AWS_REGION`, then `us-east-1`).
    #[serde(default)]
    pub aws_s3_region: Option<String>,
    /// An S3-compatible endpoint (MinIO, a local test server); path-style
    /// addressing is used with it.
    #[serde(default)]
    pub aws_s3_endpoint_url: Option<String>,
    /// Allow `http://` endpoints.
    #[serde(default)]
    pub aws_s3_allow_http: bool,
    /// Azure storage account (default: `AZURE_STORAGE_ACCOUNT_NAME`, or the
    /// account in an `abfss://container@account.dfs.core.windows.net` URI).
    #[serde(default)]
    pub azure_storage_account_name: Option<String>,
    /// Azure account key (Shared Key); one of it and `azure_storage_sas_token`
    /// at most. Neither: a service principal in `storage_options`
    /// (`azure_client_id`, `azure_client_secret`, `azure_tenant_id`), or the
    /// `AZURE_*` environment, then the managed identity.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub azure_storage_account_key: Option<SecretString>,
    /// Azure SAS token (the query string, with or without its leading `?`).
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub azure_storage_sas_token: Option<SecretString>,
    /// The container, as upstream; the one `table_uri` names wins (upstream's
    /// example names `your-container` beside `az://container/...`).
    #[serde(default)]
    pub azure_container_name: Option<String>,
    /// A GCS service account key (the JSON document). Unset: the `GOOGLE_*`
    /// environment, application default credentials
    /// (`GOOGLE_APPLICATION_CREDENTIALS` or gcloud's file), then the
    /// instance's service account.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub gcs_service_account_key: Option<SecretString>,
    /// Any other option of the table's store, by the `object_store` crate's
    /// names (as delta-rs's `storage_options`): `azure_client_id`,
    /// `azure_client_secret`, `azure_tenant_id`, `azure_storage_endpoint`,
    /// `azure_storage_use_emulator`, `google_application_credentials`,
    /// `google_service_account`, `allow_http`, `aws_session_token`, ...
    /// Values are treated as secrets; they win over the typed fields.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub storage_options: BTreeMap<String, SecretString>,
    /// Create the table at open when there is none at `table_uri`, from
    /// `columns` (and `partition_columns`). Off (upstream's behaviour): a
    /// missing table is fatal.
    #[serde(default)]
    pub create_table: bool,
    /// The table's columns for `create_table`, in order: `{ name = "id",
    /// type = "long", nullable = false }`. Types are Delta's: `string`, `long`,
    /// `integer`, `short`, `byte`, `double`, `float`, `boolean`, `binary`,
    /// `date`, `timestamp`, `timestamp_ntz`, `decimal(p,s)`. When the table
    /// exists, its columns must match these (names and types).
    #[serde(default)]
    pub columns: Vec<Column>,
    /// Partition columns of a table `create_table` creates (names from `columns`).
    #[serde(default)]
    pub partition_columns: Vec<String>,
    /// Commit once this many messages are buffered for a topic.
    #[serde(default = "lake::default_max_messages")]
    pub max_messages_per_file: u64,
    /// Commit once a topic's buffered rows take this much memory (Arrow
    /// columns, before Parquet encoding and compression: `"64MiB"`, `"500KB"`,
    /// or bytes).
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
}

/// Where the table lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Location {
    Local,
    S3,
    Azure,
    Gcs,
}

/// What [`DeltaSinkConfig::validate`] derives.
#[derive(Debug, Clone)]
pub struct Checked {
    pub url: url::Url,
    pub location: Location,
    pub columns: Vec<(String, DataType, bool)>,
    pub max_bytes: u64,
}

impl DeltaSinkConfig {
    /// Checks what serde cannot, naming the field.
    pub fn validate(&self) -> Result<Checked, PluginConfigError> {
        let url = table_url(&self.table_uri)?;
        let location = self.location(&url)?;
        if location == Location::Azure {
            self.check_azure()?;
        }
        if self.aws_s3_access_key.is_some() != self.aws_s3_secret_key.is_some() {
            return Err(PluginConfigError::new(
                "aws_s3_access_key",
                "set both aws_s3_access_key and aws_s3_secret_key, or neither (then the AWS_* environment variables are used)",
            ));
        }
        if let Some(endpoint) = &self.aws_s3_endpoint_url
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(PluginConfigError::new(
                "aws_s3_endpoint_url",
                format!("expected an http:// or https:// URL, found \"{endpoint}\""),
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
        for name in &self.partition_columns {
            if !self.columns.iter().any(|column| &column.name == name) {
                return Err(PluginConfigError::new(
                    "partition_columns",
                    format!("\"{name}\" is not one of `columns`"),
                ));
            }
        }
        let max_bytes = lake::max_bytes(self.max_messages_per_file, &self.max_file_size)?;
        Ok(Checked {
            url,
            location,
            columns,
            max_bytes,
        })
    }

    /// The store `table_uri` names, checked against `storage_backend_type`.
    fn location(&self, url: &url::Url) -> Result<Location, PluginConfigError> {
        let from_uri = match url.scheme() {
            "file" => Location::Local,
            "s3" | "s3a" => Location::S3,
            "gs" => Location::Gcs,
            _ if matches!(
                object_store::ObjectStoreScheme::parse(url),
                Ok((object_store::ObjectStoreScheme::MicrosoftAzure, _))
            ) =>
            {
                Location::Azure
            }
            scheme => {
                return Err(PluginConfigError::new(
                    "table_uri",
                    format!(
                        "expected a file://, s3://, az://, abfss:// or gs:// URI (or a local path), found a {scheme}:// URI"
                    ),
                ));
            }
        };
        let declared = match self.storage_backend_type.as_deref().map(str::trim) {
            None | Some("") => return Ok(from_uri),
            Some("s3") => Location::S3,
            Some("azure") => Location::Azure,
            Some("gcs") => Location::Gcs,
            Some(other) => {
                return Err(PluginConfigError::new(
                    "storage_backend_type",
                    format!(
                        "expected \"s3\", \"azure\" or \"gcs\" (or leave it out for a local table), found \"{other}\""
                    ),
                ));
            }
        };
        if declared != from_uri {
            return Err(PluginConfigError::new(
                "storage_backend_type",
                format!(
                    "{:?} does not match table_uri {url} (a {from_uri:?} location)",
                    self.storage_backend_type.as_deref().unwrap_or_default()
                ),
            ));
        }
        Ok(declared)
    }

    /// Upstream's Azure rule: one of the account key and the SAS token at
    /// most.
    fn check_azure(&self) -> Result<(), PluginConfigError> {
        if self.azure_storage_account_key.is_some() && self.azure_storage_sas_token.is_some() {
            return Err(PluginConfigError::new(
                "azure_storage_account_key",
                "set one of azure_storage_account_key and azure_storage_sas_token, not both",
            ));
        }
        Ok(())
    }

    /// The store's options by `object_store`'s names: the typed fields of
    /// the table's store, then `storage_options` (which win).
    pub fn store_options(&self, location: Location) -> Vec<(String, String)> {
        let mut options: Vec<(String, String)> = match location {
            Location::Local => Vec::new(),
            Location::S3 => self.s3_options().into_iter().collect(),
            Location::Azure => [
                (
                    "azure_storage_account_name",
                    self.azure_storage_account_name.clone(),
                ),
                (
                    "azure_storage_account_key",
                    self.azure_storage_account_key
                        .as_ref()
                        .map(|key| key.expose_secret().to_owned()),
                ),
                (
                    "azure_storage_sas_key",
                    self.azure_storage_sas_token
                        .as_ref()
                        .map(|token| token.expose_secret().to_owned()),
                ),
            ]
            .into_iter()
            .filter_map(|(key, value)| value.map(|value| (key.to_owned(), value)))
            .collect(),
            Location::Gcs => self
                .gcs_service_account_key
                .iter()
                .map(|key| {
                    (
                        "google_service_account_key".to_owned(),
                        key.expose_secret().to_owned(),
                    )
                })
                .collect(),
        };
        options.extend(
            self.storage_options
                .iter()
                .map(|(key, value)| (key.clone(), value.expose_secret().to_owned())),
        );
        options
    }

    /// The S3 settings as `object_store`'s configuration keys.
    pub fn s3_options(&self) -> HashMap<String, String> {
        let mut options = HashMap::new();
        if let (Some(key), Some(secret)) = (&self.aws_s3_access_key, &self.aws_s3_secret_key) {
            options.insert("aws_access_key_id".into(), key.expose_secret().into());
            options.insert(
                "aws_secret_access_key".into(),
                secret.expose_secret().into(),
            );
        }
        if let Some(region) = &self.aws_s3_region {
            options.insert("aws_region".into(), region.clone());
        }
        if let Some(endpoint) = &self.aws_s3_endpoint_url {
            options.insert("aws_endpoint".into(), endpoint.clone());
            options.insert("aws_virtual_hosted_style_request".into(), "false".into());
        }
        if self.aws_s3_allow_http {
            options.insert("aws_allow_http".into(), "true".into());
        }
        options
    }
}

/// `table_uri` as a URL: a bare path is a local directory (made absolute).
fn table_url(uri: &str) -> Result<url::Url, PluginConfigError> {
    let uri = uri.trim();
    if uri.is_empty() {
        return Err(PluginConfigError::new("table_uri", "must not be empty"));
    }
    let bad = |why: String| PluginConfigError::new("table_uri", why);
    if uri.contains("://") {
        let mut url = url::Url::parse(uri).map_err(|error| bad(format!("\"{uri}\": {error}")))?;
        // One trailing slash, so joins stay inside the table.
        if !url.path().ends_with('/') {
            url.set_path(&format!("{}/", url.path()));
        }
        return Ok(url);
    }
    let path = std::path::absolute(uri).map_err(|error| bad(format!("\"{uri}\": {error}")))?;
    url::Url::from_directory_path(&path).map_err(|()| bad(format!("\"{uri}\" is not a path")))
}

/// A Delta primitive type by its protocol name.
fn parse_type(text: &str) -> Result<DataType, String> {
    let name = text.trim().to_ascii_lowercase().replace(' ', "");
    serde_json::from_value::<DataType>(serde_json::Value::String(name)).map_err(|_| {
        format!(
            "expected a Delta type (string, long, integer, short, byte, double, float, boolean, binary, date, timestamp, timestamp_ntz, decimal(p,s)), found \"{text}\""
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<DeltaSinkConfig, PluginConfigError> {
        let mut value = serde_json::json!({"table_uri": "file:///tmp/t"});
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_only_a_table_uri_when_validated_should_be_a_local_table_with_defaults() {
        let config = config(serde_json::json!({})).unwrap();
        let checked = config.validate().unwrap();
        assert_eq!(checked.location, Location::Local);
        assert_eq!(checked.url.as_str(), "file:///tmp/t/");
        assert_eq!(checked.max_bytes, 64 << 20);
        assert_eq!(config.max_messages_per_file, 100_000);
        assert_eq!(config.flush_interval, Duration::from_secs(10));
        assert!(!config.create_table);
    }

    #[test]
    fn given_an_s3_uri_when_validated_should_map_upstreams_storage_options() {
        let config = config(serde_json::json!({
            "table_uri": "s3://lake/events",
            "storage_backend_type": "s3",
            "aws_s3_access_key": "id",
            "aws_s3_secret_key": "secret",
            "aws_s3_region": "eu-west-1",
            "aws_s3_endpoint_url": "http://127.0.0.1:9000",
            "aws_s3_allow_http": true,
        }))
        .unwrap();
        assert_eq!(config.validate().unwrap().location, Location::S3);
        let options = config.s3_options();
        assert_eq!(options["aws_access_key_id"], "id");
        assert_eq!(options["aws_region"], "eu-west-1");
        assert_eq!(options["aws_endpoint"], "http://127.0.0.1:9000");
        assert_eq!(options["aws_allow_http"], "true");
    }

    #[test]
    fn given_upstreams_azure_fields_when_validated_should_map_them_to_the_azure_store() {
        let config = config(serde_json::json!({
            "table_uri": "az://lake/events",
            "storage_backend_type": "azure",
            "azure_storage_account_name": "account",
            "azure_storage_sas_token": "sv=2022-11-02&sig=abc",
            "azure_container_name": "lake",
            "storage_options": {"azure_storage_endpoint": "http://127.0.0.1:10000/account"},
        }))
        .unwrap();
        let location = config.validate().unwrap().location;
        assert_eq!(location, Location::Azure);
        let options: HashMap<String, String> = config.store_options(location).into_iter().collect();
        assert_eq!(options["azure_storage_account_name"], "account");
        assert_eq!(options["azure_storage_sas_key"], "sv=2022-11-02&sig=abc");
        assert_eq!(
            options["azure_storage_endpoint"],
            "http://127.0.0.1:10000/account"
        );
        assert!(!options.contains_key("azure_storage_account_key"));
        for uri in [
            "abfss://lake@account.dfs.core.windows.net/events",
            "https://account.blob.core.windows.net/lake/events",
        ] {
            let config = self::config(serde_json::json!({
                "table_uri": uri,
                "azure_container_name": "lake",
            }))
            .unwrap();
            assert_eq!(
                config.validate().unwrap().location,
                Location::Azure,
                "{uri}"
            );
        }
    }

    #[test]
    fn given_a_gcs_uri_when_validated_should_pass_the_service_account_key() {
        let config = config(serde_json::json!({
            "table_uri": "gs://lake/events",
            "gcs_service_account_key": "{\"type\": \"service_account\"}",
        }))
        .unwrap();
        let location = config.validate().unwrap().location;
        assert_eq!(location, Location::Gcs);
        let options = config.store_options(location);
        assert_eq!(
            options,
            [(
                "google_service_account_key".to_owned(),
                "{\"type\": \"service_account\"}".to_owned()
            )]
        );
    }

    #[test]
    fn given_columns_when_validated_should_parse_delta_types() {
        let config = config(serde_json::json!({
            "create_table": true,
            "columns": [
                {"name": "id", "type": "long", "nullable": false},
                {"name": "price", "type": "decimal(10, 2)"},
                {"name": "at", "type": "timestamp"},
            ],
            "partition_columns": ["at"],
        }))
        .unwrap();
        let checked = config.validate().unwrap();
        let names: Vec<_> = checked.columns.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["id", "price", "at"]);
        assert_eq!(checked.columns[0].1, DataType::LONG);
        assert!(!checked.columns[0].2 && checked.columns[1].2);
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        let cases = [
            (serde_json::json!({"table_uri": " "}), "table_uri"),
            (serde_json::json!({"table_uri": "hdfs://b/t"}), "table_uri"),
            (
                serde_json::json!({"storage_backend_type": "azure"}),
                "storage_backend_type",
            ),
            (
                serde_json::json!({"table_uri": "az://c/t", "storage_backend_type": "gcs"}),
                "storage_backend_type",
            ),
            (
                serde_json::json!({"table_uri": "az://c/t", "azure_storage_account_key": "k", "azure_storage_sas_token": "s"}),
                "azure_storage_account_key",
            ),
            (
                serde_json::json!({"storage_backend_type": "hdfs"}),
                "storage_backend_type",
            ),
            (
                serde_json::json!({"aws_s3_access_key": "a"}),
                "aws_s3_access_key",
            ),
            (
                serde_json::json!({"aws_s3_endpoint_url": "localhost:9000"}),
                "aws_s3_endpoint_url",
            ),
            (serde_json::json!({"create_table": true}), "columns"),
            (
                serde_json::json!({"columns": [{"name": "a", "type": "text"}]}),
                "columns[0].type",
            ),
            (
                serde_json::json!({"columns": [{"name": "a", "type": "long"}], "partition_columns": ["b"]}),
                "partition_columns",
            ),
            (
                serde_json::json!({"max_messages_per_file": 0}),
                "max_messages_per_file",
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
}
