//! How the delta sink classifies `deltalake-core`'s errors: what is worth
//! retrying, what needs the user to fix a field.

use deltalake_core::DeltaTableError;

use crate::connectors::SinkError;
use crate::connectors::kit::store::Refusal;

/// Which Delta errors are worth retrying. A store's error may come wrapped
/// (by the Delta kernel reading the log, by the Parquet writer): the chain
/// of sources is searched for it.
pub(super) fn classify(url: &url::Url, error: DeltaTableError) -> SinkError {
    let message = format!("delta table {url}: {error}");
    let kernel = kernel_error(&error);
    let kernel_store = match kernel {
        Some(delta_kernel::Error::ObjectStore(store_error)) => Some(store_error),
        _ => None,
    };
    if let Some(store_error) = kernel_store.or_else(|| source_of::<object_store::Error>(&error)) {
        return match Refusal::of(store_error) {
            Some(Refusal::Credentials) => SinkError::fatal(format!(
                "{}: the store refused the credentials: fix them ({message})",
                credentials_field(url)
            )),
            Some(Refusal::NoBucket) => SinkError::fatal(format!(
                "table_uri: the bucket or container of {url} does not exist: create it or fix `table_uri` ({message})"
            )),
            None => SinkError::transient(message),
        };
    }
    match &error {
        DeltaTableError::NotATable(_) => SinkError::fatal(format!(
            "table_uri: no Delta table at {url}: create it, or set create_table = true with `columns` ({error})"
        )),
        DeltaTableError::Io { .. }
        | DeltaTableError::Transaction { .. }
        | DeltaTableError::VersionAlreadyExists(_)
        | DeltaTableError::VersionMismatch(..) => SinkError::transient(message),
        _ if matches!(
            kernel,
            Some(delta_kernel::Error::IOError(_) | delta_kernel::Error::Reqwest(_))
        ) =>
        {
            SinkError::transient(message)
        }
        _ if source_of::<std::io::Error>(&error).is_some() => SinkError::transient(message),
        // The log's listing loses the store's error to its text: a request
        // that did not get through (connection refused or cut, a timeout, a
        // 5xx) is worth retrying; a refusal is caught above or stays fatal.
        DeltaTableError::Generic(text)
            if text.contains("Error interacting with object store")
                && ["error sending request", "timed out", "Server returned"]
                    .iter()
                    .any(|sign| text.contains(sign)) =>
        {
            SinkError::transient(message)
        }
        _ => SinkError::fatal(message),
    }
}

/// The field holding the credentials of the table's store.
fn credentials_field(url: &url::Url) -> &'static str {
    match url.scheme() {
        "s3" | "s3a" => "aws_s3_access_key (or AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY)",
        "gs" => "gcs_service_account_key (or storage_options, GOOGLE_*)",
        _ => "azure_storage_account_key (or azure_storage_sas_token, storage_options, AZURE_*)",
    }
}

/// The Delta kernel's error inside `error`, unwrapped from its backtraces
/// (the kernel does not name the store's error as its source).
fn kernel_error(error: &DeltaTableError) -> Option<&delta_kernel::Error> {
    let DeltaTableError::KernelError(kernel) = error else {
        return None;
    };
    let mut kernel = kernel;
    while let delta_kernel::Error::Backtraced { source, .. } = kernel {
        kernel = source.as_ref();
    }
    Some(kernel)
}

/// The first error of type `T` in `error`'s chain of sources, itself included.
fn source_of<'a, T: std::error::Error + 'static>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a T> {
    std::iter::successors(Some(error), |error| error.source())
        .find_map(|error| error.downcast_ref::<T>())
}
