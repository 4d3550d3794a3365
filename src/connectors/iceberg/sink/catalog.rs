//! The catalog the tables are in (REST or memory), opening (or creating)
//! each table, checking it, and which Iceberg errors are worth retrying.

use std::collections::HashMap;
use std::sync::Arc;

use iceberg::memory::{MEMORY_CATALOG_WAREHOUSE, MemoryCatalogBuilder};
use iceberg::spec::{NestedField, Schema, Type};
use iceberg::table::Table;
use iceberg::{
    Catalog, CatalogBuilder, Error, ErrorKind, NamespaceIdent, TableCreation, TableIdent,
};
use iceberg_catalog_rest::{
    REST_CATALOG_PROP_URI, REST_CATALOG_PROP_WAREHOUSE, RestCatalogBuilder,
};

use super::config::{Catalog as CatalogKind, Checked, IcebergSinkConfig};
use super::files::{Files, S3Settings};
use crate::connectors::{ConnectorError, SinkError};

/// `namespace.table`.
pub fn table_name(ident: &TableIdent) -> String {
    format!("{}.{}", ident.namespace().join("."), ident.name())
}

/// The configured catalog. Table files go to the local filesystem or, for
/// `s3://` locations, to S3 with the `store_*` settings, for Azure and GCS
/// locations to those stores with `store_options`.
pub async fn connect(
    config: &IcebergSinkConfig,
    checked: &Checked,
) -> Result<Arc<dyn Catalog>, ConnectorError> {
    let storage = Arc::new(Files::new(S3Settings {
        endpoint: config
            .store_url
            .clone()
            .filter(|url| !url.trim().is_empty()),
        access_key_id: config.store_access_key_id.clone(),
        secret_access_key: config.store_secret_access_key.clone(),
        region: config
            .store_region
            .clone()
            .filter(|region| !region.trim().is_empty()),
        options: config.store_options.clone(),
    }));
    match &checked.catalog {
        CatalogKind::Rest { uri } => {
            let mut properties = HashMap::from([(REST_CATALOG_PROP_URI.to_owned(), uri.clone())]);
            if let Some(warehouse) = config.warehouse.as_deref().filter(|w| !w.is_empty()) {
                properties.insert(REST_CATALOG_PROP_WAREHOUSE.to_owned(), warehouse.to_owned());
            }
            let catalog = RestCatalogBuilder::default()
                .with_storage_factory(storage)
                .load("iggy-connect", properties)
                .await
                .map_err(|error| open_error("uri", uri, error))?;
            Ok(Arc::new(catalog))
        }
        CatalogKind::Memory { warehouse } => {
            let catalog = MemoryCatalogBuilder::default()
                .with_storage_factory(storage)
                .load(
                    "iggy-connect",
                    HashMap::from([(MEMORY_CATALOG_WAREHOUSE.to_owned(), warehouse.clone())]),
                )
                .await
                .map_err(|error| open_error("warehouse", warehouse, error))?;
            Ok(Arc::new(catalog))
        }
    }
}

/// Loads `ident`, creating it (and its namespace) with `create_table`. The
/// memory catalog starts empty in each process: it finds a table again from
/// the newest metadata file under its directory in the warehouse.
pub async fn open_table(
    catalog: &dyn Catalog,
    config: &IcebergSinkConfig,
    checked: &Checked,
    ident: &TableIdent,
) -> Result<Table, ConnectorError> {
    let name = table_name(ident);
    let missing = match &checked.catalog {
        CatalogKind::Memory { warehouse } => {
            create_namespaces(catalog, ident.namespace(), &name).await?;
            match newest_metadata(warehouse, ident).map_err(|error| {
                ConnectorError::transient(format!("tables: {name}: reading the warehouse: {error}"))
            })? {
                Some(location) => {
                    return catalog
                        .register_table(ident, location)
                        .await
                        .map_err(|error| open_error("tables", &name, error));
                }
                None => format!("no table {name} in the warehouse {warehouse}"),
            }
        }
        CatalogKind::Rest { uri } => match catalog.load_table(ident).await {
            Ok(table) => return Ok(table),
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::TableNotFound | ErrorKind::NamespaceNotFound
                ) =>
            {
                format!("the catalog at {uri} has no table {name}")
            }
            Err(error) => return Err(open_error("tables", &name, error)),
        },
    };
    if !config.create_table {
        return Err(ConnectorError::fatal(format!(
            "tables: {missing}: create it, or set create_table = true with `columns`"
        )));
    }
    if matches!(checked.catalog, CatalogKind::Rest { .. }) {
        create_namespaces(catalog, ident.namespace(), &name).await?;
    }
    let fields =
        checked
            .columns
            .iter()
            .enumerate()
            .map(|(index, (column, data_type, nullable))| {
                let id = i32::try_from(index + 1).unwrap_or(i32::MAX);
                Arc::new(NestedField::new(
                    id,
                    column,
                    Type::Primitive(data_type.clone()),
                    !nullable,
                ))
            });
    let schema = Schema::builder()
        .with_fields(fields)
        .build()
        .map_err(|error| ConnectorError::fatal(format!("columns: {error}")))?;
    let creation = TableCreation::builder()
        .name(ident.name().to_owned())
        .schema(schema)
        .build();
    let table = catalog
        .create_table(ident.namespace(), creation)
        .await
        .map_err(|error| open_error("tables", &name, error))?;
    tracing::info!(table = %name, "iceberg table created");
    Ok(table)
}

/// The table as it is now. The memory catalog lives in this process only:
/// another writer of the warehouse (another connector, a run before) may
/// have committed since it was loaded, so its newest metadata file wins.
pub async fn current_table(
    catalog: &dyn Catalog,
    checked: &Checked,
    ident: &TableIdent,
) -> iceberg::Result<Table> {
    let table = catalog.load_table(ident).await?;
    if let CatalogKind::Memory { warehouse } = &checked.catalog {
        let newest = newest_metadata(warehouse, ident).map_err(|error| {
            Error::new(ErrorKind::Unexpected, "reading the warehouse").with_source(error)
        })?;
        if let Some(newest) = newest
            && table.metadata_location() != Some(newest.as_str())
        {
            catalog.drop_table(ident).await?;
            return catalog.register_table(ident, newest).await;
        }
    }
    Ok(table)
}

/// The namespace and its parents, created where missing.
async fn create_namespaces(
    catalog: &dyn Catalog,
    namespace: &NamespaceIdent,
    name: &str,
) -> Result<(), ConnectorError> {
    let levels: Vec<String> = namespace.iter().cloned().collect();
    for depth in 1..=levels.len() {
        let level = NamespaceIdent::from_vec(levels[..depth].to_vec())
            .map_err(|error| ConnectorError::fatal(format!("tables: {name}: {error}")))?;
        let exists = catalog
            .namespace_exists(&level)
            .await
            .map_err(|error| open_error("tables", name, error))?;
        if !exists {
            match catalog.create_namespace(&level, HashMap::new()).await {
                Ok(_) => {}
                // Another writer made it meanwhile.
                Err(error) if error.kind() == ErrorKind::NamespaceAlreadyExists => {}
                Err(error) => return Err(open_error("tables", name, error)),
            }
        }
    }
    Ok(())
}

/// The newest `NNNNN-<uuid>.metadata.json` of the table's directory in a
/// `file://` warehouse, as the memory catalog lays tables out.
fn newest_metadata(warehouse: &str, ident: &TableIdent) -> std::io::Result<Option<String>> {
    let root = warehouse.strip_prefix("file://").unwrap_or(warehouse);
    let mut dir = std::path::PathBuf::from(root);
    dir.extend(ident.namespace().iter());
    dir.push(ident.name());
    dir.push("metadata");
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut newest: Option<(u64, String)> = None;
    for entry in entries {
        let file = entry?.file_name().to_string_lossy().into_owned();
        let Some(version) = file
            .strip_suffix(".metadata.json")
            .and_then(|stem| stem.split_once('-'))
            .and_then(|(version, _)| version.parse::<u64>().ok())
        else {
            continue;
        };
        if newest.as_ref().is_none_or(|(best, _)| version > *best) {
            newest = Some((version, file));
        }
    }
    Ok(newest.map(|(_, file)| format!("file://{}", dir.join(file).display())))
}

/// The table must be writable by this build (unpartitioned, on the local
/// filesystem or S3) and have the configured columns, where any are
/// configured.
pub fn check_table(table: &Table, name: &str, checked: &Checked) -> Result<(), ConnectorError> {
    let metadata = table.metadata();
    let location = metadata.location();
    let supported = [
        "file:", "/", "s3://", "s3a://", "az://", "abfs://", "abfss://", "gs://",
    ];
    if !supported.iter().any(|prefix| location.starts_with(prefix)) {
        return Err(ConnectorError::fatal(format!(
            "store_class: the table {name} is at {location}; this build writes Iceberg files to a local filesystem (file://), S3 (s3://), Azure (az://, abfss://) or GCS (gs://) only"
        )));
    }
    if !metadata.default_partition_spec().is_unpartitioned() {
        return Err(ConnectorError::fatal(format!(
            "tables: {name} is partitioned; the iceberg sink writes unpartitioned tables only"
        )));
    }
    let schema = metadata.current_schema();
    for (column, data_type, _) in &checked.columns {
        match schema.field_by_name(column) {
            Some(field) if *field.field_type == Type::Primitive(data_type.clone()) => {}
            Some(field) => {
                return Err(ConnectorError::fatal(format!(
                    "columns: \"{column}\" is {} in the table {name}, not {data_type}: fix `columns` or the table",
                    field.field_type
                )));
            }
            None => {
                return Err(ConnectorError::fatal(format!(
                    "columns: the table {name} has no column \"{column}\" (it has {}): fix `columns` or the table",
                    schema
                        .as_struct()
                        .fields()
                        .iter()
                        .map(|field| field.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
    }
    Ok(())
}

fn open_error(field: &str, what: &str, error: Error) -> ConnectorError {
    match classify(what, error) {
        SinkError::Transient { error, .. } => ConnectorError::transient(error.to_string()),
        SinkError::Fatal(error) => {
            let message = error.to_string();
            // Name the field to fix, unless the message does already.
            if message.starts_with("tables:") || message.starts_with("uri:") {
                ConnectorError::fatal(message)
            } else {
                ConnectorError::fatal(format!("{field}: {message}"))
            }
        }
        SinkError::Rejected(_) | SinkError::Partial(_) | SinkError::Disconnected(_) => {
            ConnectorError::fatal(format!("{field}: {what}"))
        }
    }
}

/// Which Iceberg errors are worth retrying: commit conflicts, and the
/// catalog or the files unreachable or failing (5xx, I/O); a refused request
/// (401/403) or a table gone are not.
pub fn classify(table: &str, error: Error) -> SinkError {
    let message = format!("iceberg table {table}: {error}");
    if error.kind() == ErrorKind::CatalogCommitConflicts || error.retryable() {
        return SinkError::transient(message);
    }
    match error.kind() {
        ErrorKind::TableNotFound | ErrorKind::NamespaceNotFound => SinkError::fatal(format!(
            "tables: {table} is not in the catalog: create it, or set create_table = true with `columns` ({message})"
        )),
        ErrorKind::Unexpected
            if ["401 Unauthorized", "403 Forbidden"]
                .iter()
                .any(|status| message.contains(status)) =>
        {
            SinkError::fatal(format!(
                "uri: the catalog refused the request: check the catalog's access rules for this client ({message})"
            ))
        }
        ErrorKind::Unexpected => SinkError::transient(message),
        _ => SinkError::fatal(message),
    }
}
