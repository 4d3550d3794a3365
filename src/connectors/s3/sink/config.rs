//! The `s3` sink's `plugin_config`: upstream's fields and defaults, plus
//! `compression`, `part_size` and `flush_interval`, and any store the
//! `object_store` crate speaks through `url` and `options`.

use std::collections::BTreeMap;
use std::time::Duration;

use secrecy::SecretString;
use serde::Deserialize;

use crate::config::size::parse_size;
use crate::connectors::PluginConfigError;

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct S3SinkConfig {
    /// S3 bucket the objects are written to (it must exist: a missing bucket
    /// is fatal at open). Required unless `url` names the store.
    #[serde(default)]
    pub bucket: String,
    /// The bucket's region (`us-east-1`, ...; any value for most S3-compatible
    /// stores). Required with `bucket`.
    #[serde(default)]
    pub region: String,
    /// The store and key prefix as a URL, instead of `bucket`:
    /// `s3://bucket/prefix`, `az://container/prefix` (also `abfss://` and
    /// `https://account.blob.core.windows.net/container/prefix`),
    /// `gs://bucket/prefix` or `file:///directory`. Credentials and other
    /// settings of the store go in `options` (or its usual environment).
    #[serde(default)]
    pub url: Option<String>,
    /// Options of the store (named by `url`, or the `bucket`'s S3), by the
    /// `object_store` crate's names, beside or instead of the typed fields
    /// (`aws_session_token`, ...): Azure `azure_storage_account_name` with
    /// `azure_storage_account_key`, `azure_storage_sas_key` or a service
    /// principal (`azure_client_id`, `azure_client_secret`,
    /// `azure_tenant_id`), `azure_storage_endpoint`; GCS
    /// `google_service_account_key` (the JSON), `google_service_account` (its
    /// path) or `google_application_credentials`; unset, each store's
    /// environment and default credentials (`AZURE_*`, `GOOGLE_*`,
    /// application default credentials, the instance's identity). Values
    /// are treated as secrets.
    #[serde(default)]
    #[schemars(with = "BTreeMap<String, String>")]
    pub options: BTreeMap<String, SecretString>,
    /// Key prefix of every object (slashes around it are trimmed); with
    /// `url`, below the URL's path.
    #[serde(default)]
    pub prefix: Option<String>,
    /// S3-compatible endpoint URL (MinIO, R2, a local test server). Implies
    /// path-style addressing; `http://` is allowed.
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Access key; set both or neither of it and `secret_access_key`.
    /// Neither: `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and
    /// `AWS_SESSION_TOKEN` from the environment, then the instance's role.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub access_key_id: Option<SecretString>,
    /// Secret key that goes with `access_key_id`.
    #[serde(default)]
    #[schemars(with = "Option<String>")]
    pub secret_access_key: Option<SecretString>,
    /// The key's directory part: `{stream}`, `{topic}`, `{partition}`, and
    /// `{date}` (`YYYY-MM-DD`), `{hour}` (`HH`) and `{timestamp}` (epoch
    /// milliseconds) of the file's first message (UTC, its Iggy timestamp:
    /// the same after a replay).
    #[serde(default = "default_path_template")]
    pub path_template: String,
    /// What closes a file: `size` (`max_file_size` of encoded messages,
    /// before compression) or `messages` (`max_messages_per_file`).
    #[serde(default)]
    pub file_rotation: FileRotation,
    /// With `file_rotation = "size"`: a file is closed once its encoded
    /// messages reach this size (`"8MiB"`, `"500KB"`, or a number of bytes).
    #[serde(default = "default_max_file_size")]
    pub max_file_size: String,
    /// With `file_rotation = "messages"` (required there): messages per file.
    #[serde(default)]
    pub max_messages_per_file: Option<u64>,
    /// `json_lines` (alias `jsonl`), `json_array`, or `raw` (the payloads'
    /// bytes back to back).
    #[serde(default)]
    pub output_format: OutputFormat,
    /// With JSON output: each line carries `offset`, `timestamp`, `stream`,
    /// `topic` and `partition_id` beside `payload`.
    #[serde(default = "default_true")]
    pub include_metadata: bool,
    /// With JSON output: each line carries the message's `headers`.
    #[serde(default)]
    pub include_headers: bool,
    /// Attempts of one upload inside one flush when it fails transiently
    /// (alias `max_retries`, 0 counts as 1). Past them the engine retries
    /// the flush with its backoff, committing nothing meanwhile.
    #[serde(default = "default_max_attempts", alias = "max_retries")]
    pub max_attempts: u32,
    /// Delay before the second attempt (doubling, capped at 60 s).
    #[serde(default = "default_retry_delay", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub retry_delay: Duration,
    /// Path-style addressing (`endpoint/bucket/key`); on whenever `endpoint`
    /// is set.
    #[serde(default)]
    pub path_style: Option<bool>,
    /// Compression of each object: `none` (the default), `gzip` (key ends
    /// `.gz`) or `zstd` (`.zst`).
    #[serde(default)]
    pub compression: Compression,
    /// An object larger than this (after compression) is uploaded in parts
    /// of this size (S3's multipart upload; at least 5 MiB).
    #[serde(default = "default_part_size")]
    pub part_size: String,
    /// Upload what is buffered once the oldest message waiting is this old,
    /// even if its file is not full (`"0s"`: only on rotation and at a stop).
    /// Such a file ends where the data happened to end, so after a crash
    /// between its upload and the offset commit, the data read again can
    /// land in a differently bounded object (duplicates, never loss).
    #[serde(default = "default_flush_interval", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub flush_interval: Duration,
    /// Timeout of one request to S3.
    #[serde(default = "default_request_timeout", with = "crate::config::duration")]
    #[schemars(with = "crate::config::duration::Text")]
    pub request_timeout: Duration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum FileRotation {
    #[default]
    Size,
    Messages,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    #[default]
    #[serde(alias = "jsonl", alias = "jsonlines")]
    JsonLines,
    JsonArray,
    Raw,
}

impl OutputFormat {
    pub fn extension(self) -> &'static str {
        match self {
            OutputFormat::JsonLines => "jsonl",
            OutputFormat::JsonArray => "json",
            OutputFormat::Raw => "bin",
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Zstd,
}

impl Compression {
    pub fn extension(self) -> &'static str {
        match self {
            Compression::None => "",
            Compression::Gzip => ".gz",
            Compression::Zstd => ".zst",
        }
    }
}

/// Where the objects go, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// The store's URL (`s3://bucket` for `bucket`).
    pub url: url::Url,
    /// The field naming the store, for messages: `bucket` or `url`.
    pub field: &'static str,
}

/// When a file is closed, in checked numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rotation {
    Bytes(u64),
    Messages(u64),
}

/// S3 refuses parts smaller than this (but the last).
pub const MIN_PART_SIZE: u64 = 5 << 20;

impl S3SinkConfig {
    /// Checks what serde cannot, naming the field.
    pub fn validate(&self) -> Result<(Place, Rotation, u64), PluginConfigError> {
        let place = self.place()?;
        if self.path_template.trim().is_empty() {
            return Err(PluginConfigError::new(
                "path_template",
                "must not be empty (the default is \"{stream}/{topic}/{date}/{hour}\")",
            ));
        }
        crate::connectors::kit::store::check_s3_fields(
            self.access_key_id.is_some(),
            self.secret_access_key.is_some(),
            self.endpoint.as_deref(),
        )?;
        let rotation = match self.file_rotation {
            FileRotation::Size => {
                let bytes = parse_size(&self.max_file_size)
                    .map_err(|message| PluginConfigError::new("max_file_size", message))?;
                if bytes == 0 {
                    return Err(PluginConfigError::new("max_file_size", "must be above 0"));
                }
                Rotation::Bytes(bytes)
            }
            FileRotation::Messages => match self.max_messages_per_file {
                Some(count) if count > 0 => Rotation::Messages(count),
                Some(_) => {
                    return Err(PluginConfigError::new(
                        "max_messages_per_file",
                        "must be above 0",
                    ));
                }
                None => {
                    return Err(PluginConfigError::new(
                        "max_messages_per_file",
                        "required with file_rotation = \"messages\"",
                    ));
                }
            },
        };
        let part_size = parse_size(&self.part_size)
            .map_err(|message| PluginConfigError::new("part_size", message))?;
        if part_size < MIN_PART_SIZE {
            return Err(PluginConfigError::new(
                "part_size",
                "must be at least 5MiB (S3's smallest part)",
            ));
        }
        Ok((place, rotation, part_size))
    }

    /// `url`, or the bucket (and its region) as an `s3://` URL.
    fn place(&self) -> Result<Place, PluginConfigError> {
        let Some(text) = self.url.as_deref().map(str::trim) else {
            for (field, value) in [("bucket", &self.bucket), ("region", &self.region)] {
                if value.trim().is_empty() {
                    return Err(PluginConfigError::new(
                        field,
                        "must not be empty (or name the store with `url`)",
                    ));
                }
            }
            let url = url::Url::parse(&format!("s3://{}", self.bucket.trim()))
                .map_err(|error| PluginConfigError::new("bucket", error.to_string()))?;
            return Ok(Place {
                url,
                field: "bucket",
            });
        };
        if !self.bucket.trim().is_empty() {
            return Err(PluginConfigError::new(
                "bucket",
                "set either `bucket` or `url`, not both",
            ));
        }
        let url = url::Url::parse(text).map_err(|error| {
            PluginConfigError::new(
                "url",
                format!(
                    "expected an s3://, az://, gs:// or file:// URL, found \"{text}\" ({error})"
                ),
            )
        })?;
        if object_store::ObjectStoreScheme::parse(&url).is_err() {
            return Err(PluginConfigError::new(
                "url",
                format!("\"{url}\" names no store (s3://, az://, abfss://, gs://, file://)"),
            ));
        }
        if !matches!(url.scheme(), "s3" | "s3a") {
            let s3_fields = [
                ("endpoint", self.endpoint.is_some()),
                ("access_key_id", self.access_key_id.is_some()),
                ("path_style", self.path_style.is_some()),
            ];
            if let Some((field, _)) = s3_fields.iter().find(|(_, set)| *set) {
                return Err(PluginConfigError::new(
                    *field,
                    format!(
                        "an S3 setting, but `url` names a {}:// store: put its settings in `options`",
                        url.scheme()
                    ),
                ));
            }
        }
        Ok(Place { url, field: "url" })
    }

    /// Path-style addressing: asked for, or implied by `endpoint`.
    pub fn path_style(&self) -> bool {
        self.path_style.unwrap_or(self.endpoint.is_some())
    }
}

fn default_path_template() -> String {
    "{stream}/{topic}/{date}/{hour}".to_owned()
}

fn default_max_file_size() -> String {
    "8MiB".to_owned()
}

fn default_part_size() -> String {
    "8MiB".to_owned()
}

fn default_true() -> bool {
    true
}

fn default_max_attempts() -> u32 {
    3
}

fn default_retry_delay() -> Duration {
    Duration::from_secs(1)
}

fn default_flush_interval() -> Duration {
    Duration::from_secs(60)
}

fn default_request_timeout() -> Duration {
    Duration::from_secs(30)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: serde_json::Value) -> Result<S3SinkConfig, PluginConfigError> {
        let mut value = serde_json::json!({"bucket": "b", "region": "us-east-1"});
        for (key, field) in extra.as_object().unwrap() {
            value[key] = field.clone();
        }
        crate::connectors::parse_plugin_config(&value)
    }

    #[test]
    fn given_upstreams_required_fields_when_parsed_should_take_upstreams_defaults() {
        let config = config(serde_json::json!({})).unwrap();
        assert_eq!(config.path_template, "{stream}/{topic}/{date}/{hour}");
        assert_eq!(config.file_rotation, FileRotation::Size);
        assert_eq!(config.output_format, OutputFormat::JsonLines);
        assert!(config.include_metadata && !config.include_headers);
        assert_eq!(config.max_attempts, 3);
        assert_eq!(config.retry_delay, Duration::from_secs(1));
        let (place, rotation, part_size) = config.validate().unwrap();
        assert_eq!(place.url.as_str(), "s3://b");
        assert_eq!(place.field, "bucket");
        assert_eq!((rotation, part_size), (Rotation::Bytes(8 << 20), 8 << 20));
        assert!(!config.path_style());
    }

    #[test]
    fn given_bad_values_when_validated_should_name_the_field() {
        let cases = [
            (serde_json::json!({"bucket": " "}), "bucket"),
            (serde_json::json!({"access_key_id": "a"}), "access_key_id"),
            (
                serde_json::json!({"max_file_size": "8 parsecs"}),
                "max_file_size",
            ),
            (
                serde_json::json!({"file_rotation": "messages"}),
                "max_messages_per_file",
            ),
            (
                serde_json::json!({"file_rotation": "messages", "max_messages_per_file": 0}),
                "max_messages_per_file",
            ),
            (serde_json::json!({"part_size": "1MiB"}), "part_size"),
            (serde_json::json!({"url": "az://c/p"}), "bucket"),
            (
                serde_json::json!({"bucket": "", "url": "hdfs://c/p"}),
                "url",
            ),
            (
                serde_json::json!({"bucket": "", "url": "az://c/p", "endpoint": "http://x"}),
                "endpoint",
            ),
            (
                serde_json::json!({"endpoint": "localhost:9000"}),
                "endpoint",
            ),
        ];
        for (extra, field) in cases {
            let error = config(extra.clone()).unwrap().validate().unwrap_err();
            assert_eq!(error.field, field, "{extra}: {error}");
        }
        let error = config(serde_json::json!({"output_format": "csv"})).unwrap_err();
        assert_eq!(error.field, "output_format");
        let error = config(serde_json::json!({"bucket": "", "region": ""}))
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(error.field, "bucket");
    }

    #[test]
    fn given_a_url_when_validated_should_name_the_store_without_bucket_or_region() {
        for url in [
            "az://landing/iggy",
            "abfss://landing@account.dfs.core.windows.net/iggy",
            "gs://lake/iggy",
            "file:///tmp/iggy",
            "s3://lake/iggy",
        ] {
            let config =
                config(serde_json::json!({"bucket": "", "region": "", "url": url})).unwrap();
            let (place, _, _) = config.validate().unwrap();
            assert_eq!(place.url.as_str(), url);
            assert_eq!(place.field, "url");
        }
    }
}
