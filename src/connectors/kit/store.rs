//! Object stores (the `object_store` crate) for the connectors that read or
//! write objects: a store from a URL and its options, and which store errors
//! are refusals that no retry fixes.

use std::sync::Arc;
use std::time::Duration;

use object_store::aws::AmazonS3Builder;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::{BackoffConfig, ClientOptions, ObjectStore, ObjectStoreScheme, RetryConfig};

/// What a store refuses for good, whatever is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    NoBucket,
    Credentials,
}

impl Refusal {
    /// S3 (and GCS's XML API) answers a missing bucket 404 `NoSuchBucket`
    /// and bad credentials 403 (`InvalidAccessKeyId`, `SignatureDoesNotMatch`,
    /// `AccessDenied`), Azure a missing container `ContainerNotFound`, a bad
    /// key `AuthenticationFailed` and a bad or too narrow SAS token
    /// `AuthorizationFailure` (or `AuthorizationPermissionMismatch`);
    /// `object_store` passes some of them on as generic errors with the
    /// store's body.
    pub fn of(error: &object_store::Error) -> Option<Self> {
        let text = error.to_string();
        match error {
            object_store::Error::PermissionDenied { .. }
            | object_store::Error::Unauthenticated { .. } => return Some(Refusal::Credentials),
            _ if text.contains("NoSuchBucket") || text.contains("ContainerNotFound") => {
                return Some(Refusal::NoBucket);
            }
            _ => {}
        }
        [
            "InvalidAccessKeyId",
            "SignatureDoesNotMatch",
            "AccessDenied",
            "AuthenticationFailed",
            "AuthorizationFailure",
            "AuthorizationPermissionMismatch",
        ]
        .iter()
        .any(|code| text.contains(code))
        .then_some(Refusal::Credentials)
    }
}

/// Request timeout and the client's own retries of one request.
#[derive(Debug, Clone, Copy)]
pub struct Requests {
    pub timeout: Duration,
    /// Attempts of one request inside the client (0 counts as 1).
    pub attempts: u32,
    pub first_delay: Duration,
}

/// A store for `url` (`s3://`, `az://`/`abfss://`/Azure `https://`,
/// `gs://`, `file://`, `memory://`) and the path of its prefix. `options`
/// are the crate's config keys for that store (`aws_endpoint`,
/// `azure_storage_account_key`, ...); the environment is read first and
/// the options win over it. The error names the offending option key, or
/// is empty for the URL.
pub fn open(
    url: &url::Url,
    options: &[(String, String)],
    requests: Requests,
) -> Result<(Arc<dyn ObjectStore>, Path), (String, String)> {
    let (scheme, prefix) =
        ObjectStoreScheme::parse(url).map_err(|error| (String::new(), error.to_string()))?;
    let client = ClientOptions::new()
        .with_timeout(requests.timeout)
        .with_connect_timeout(requests.timeout.min(Duration::from_secs(10)));
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: requests.first_delay,
            max_backoff: Duration::from_secs(60),
            base: 2.0,
        },
        max_retries: requests.attempts.saturating_sub(1) as usize,
        retry_timeout: Duration::from_secs(180),
    };
    let store: Arc<dyn ObjectStore> = match scheme {
        #[cfg(feature = "kit-store-fs")]
        ObjectStoreScheme::Local => Arc::new(object_store::local::LocalFileSystem::new()),
        ObjectStoreScheme::Memory => Arc::new(InMemory::new()),
        ObjectStoreScheme::AmazonS3 => cloud::<AmazonS3Builder>(url, client, retry, options)?,
        #[cfg(feature = "kit-store-azure")]
        ObjectStoreScheme::MicrosoftAzure => {
            cloud::<object_store::azure::MicrosoftAzureBuilder>(url, client, retry, options)?
        }
        #[cfg(feature = "kit-store-gcp")]
        ObjectStoreScheme::GoogleCloudStorage => {
            cloud::<object_store::gcp::GoogleCloudStorageBuilder>(url, client, retry, options)?
        }
        other => {
            return Err((
                String::new(),
                format!("{other:?} stores are not compiled in"),
            ));
        }
    };
    Ok((store, prefix))
}

/// The builders of the cloud stores, alike: from the environment, then the
/// URL, then our client and retry settings, then the options.
trait CloudBuilder: Sized {
    type Key: std::str::FromStr;
    type Store: ObjectStore;
    fn from_env() -> Self;
    fn with_url(self, url: &str) -> Self;
    fn with_client_options(self, options: ClientOptions) -> Self;
    fn with_retry(self, retry: RetryConfig) -> Self;
    fn with_config(self, key: Self::Key, value: &str) -> Self;
    fn build(self) -> object_store::Result<Self::Store>;
}

macro_rules! cloud_builder {
    ($builder:ty, $key:ty, $store:ty) => {
        impl CloudBuilder for $builder {
            type Key = $key;
            type Store = $store;
            fn from_env() -> Self {
                <$builder>::from_env()
            }
            fn with_url(self, url: &str) -> Self {
                <$builder>::with_url(self, url)
            }
            fn with_client_options(self, options: ClientOptions) -> Self {
                <$builder>::with_client_options(self, options)
            }
            fn with_retry(self, retry: RetryConfig) -> Self {
                <$builder>::with_retry(self, retry)
            }
            fn with_config(self, key: Self::Key, value: &str) -> Self {
                <$builder>::with_config(self, key, value)
            }
            fn build(self) -> object_store::Result<Self::Store> {
                <$builder>::build(self)
            }
        }
    };
}

cloud_builder!(
    AmazonS3Builder,
    object_store::aws::AmazonS3ConfigKey,
    object_store::aws::AmazonS3
);
#[cfg(feature = "kit-store-azure")]
cloud_builder!(
    object_store::azure::MicrosoftAzureBuilder,
    object_store::azure::AzureConfigKey,
    object_store::azure::MicrosoftAzure
);
#[cfg(feature = "kit-store-gcp")]
cloud_builder!(
    object_store::gcp::GoogleCloudStorageBuilder,
    object_store::gcp::GoogleConfigKey,
    object_store::gcp::GoogleCloudStorage
);

/// A cloud store for `url`. The options come last: a client option among
/// them wins over `client`.
fn cloud<B: CloudBuilder>(
    url: &url::Url,
    client: ClientOptions,
    retry: RetryConfig,
    options: &[(String, String)],
) -> Result<Arc<dyn ObjectStore>, (String, String)> {
    let mut builder = B::from_env()
        .with_url(url.as_str())
        .with_client_options(client)
        .with_retry(retry);
    for (key, value) in options {
        builder = builder.with_config(parse_key(key)?, value);
    }
    let store = builder
        .build()
        .map_err(|error| (String::new(), error.to_string()))?;
    Ok(Arc::new(store))
}

/// Checks the S3 fields every S3-speaking connector has: both credentials or
/// neither (then the `AWS_*` environment variables are used), and an
/// endpoint that is an HTTP URL.
pub fn check_s3_fields(
    has_access_key_id: bool,
    has_secret_access_key: bool,
    endpoint: Option<&str>,
) -> Result<(), crate::connectors::PluginConfigError> {
    use crate::connectors::PluginConfigError;
    if has_access_key_id != has_secret_access_key {
        return Err(PluginConfigError::new(
            "access_key_id",
            "set both access_key_id and secret_access_key, or neither (then the AWS_* environment variables are used)",
        ));
    }
    if let Some(endpoint) = endpoint
        && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
    {
        return Err(PluginConfigError::new(
            "endpoint",
            format!("expected an http:// or https:// URL, found \"{endpoint}\""),
        ));
    }
    Ok(())
}

/// The S3 options for an S3-compatible `endpoint` (path-style addressing,
/// `http://` allowed) and explicit credentials.
pub fn s3_options(
    region: Option<&str>,
    endpoint: Option<&str>,
    credentials: Option<(&str, &str)>,
) -> Vec<(String, String)> {
    let mut options = Vec::new();
    if let Some(region) = region {
        options.push(("aws_region".to_owned(), region.to_owned()));
    }
    if let Some(endpoint) = endpoint {
        options.push(("aws_endpoint".to_owned(), endpoint.to_owned()));
        options.push((
            "aws_virtual_hosted_style_request".to_owned(),
            "false".to_owned(),
        ));
        options.push(("allow_http".to_owned(), "true".to_owned()));
    }
    if let Some((key, secret)) = credentials {
        options.push(("aws_access_key_id".to_owned(), key.to_owned()));
        options.push(("aws_secret_access_key".to_owned(), secret.to_owned()));
    }
    options
}

fn parse_key<K: std::str::FromStr>(key: &str) -> Result<K, (String, String)> {
    key.parse().map_err(|_| {
        (
            key.to_owned(),
            format!("\"{key}\" is not an option of this store"),
        )
    })
}
