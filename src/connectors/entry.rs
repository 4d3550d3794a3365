//! What a connector module declares about itself (its `ENTRY`), and the error of
//! building a connector from its `plugin_config`. The registry only lists entries.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use crate::connectors::{PluginConfigError, Sink, Source};

#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ConnectorKind {
    Source,
    Sink,
}

impl fmt::Display for ConnectorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ConnectorKind::Source => "source",
            ConnectorKind::Sink => "sink",
        })
    }
}

impl FromStr for ConnectorKind {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "source" => Ok(ConnectorKind::Source),
            "sink" => Ok(ConnectorKind::Sink),
            other => Err(format!(
                "expected \"source\" or \"sink\", found \"{other}\""
            )),
        }
    }
}

/// A connector interface (`dyn Source` or `dyn Sink`), so one entry type serves
/// both kinds.
pub trait Interface {
    const KIND: ConnectorKind;
}

impl Interface for dyn Source {
    const KIND: ConnectorKind = ConnectorKind::Source;
}

impl Interface for dyn Sink {
    const KIND: ConnectorKind = ConnectorKind::Sink;
}

/// Everything about one connector, declared once in its module as `ENTRY` and
/// registered there with `inventory::submit!(ENTRY);`.
pub struct Entry<C: ?Sized> {
    /// The name configs use (`path = "random"` or an upstream library path).
    pub name: &'static str,
    /// The cargo feature that compiles it in.
    pub feature: &'static str,
    /// One line for `list`.
    pub description: &'static str,
    /// `plugin_config` fields (dotted paths) that hold secrets; a `*` segment
    /// matches every key of a table or element of an array (`headers.*`).
    pub secret_fields: &'static [&'static str],
    /// A `[plugin_config]` body (TOML) that builds: `describe --example` prints
    /// it and the tests use it. Every secret field's value in it contains the
    /// word `secret`, so tests can swap in a value they look for.
    pub sample_config: &'static str,
    /// The JSON Schema of its `plugin_config` (field docs come from the config
    /// type's doc comments): `schema_of::<TheConfig>`.
    pub config_schema: fn() -> schemars::Schema,
    /// Parses and checks `plugin_config`; no I/O (that happens in `open`).
    pub build: fn(&serde_json::Value) -> Result<Box<C>, PluginConfigError>,
}

pub type SourceEntry = Entry<dyn Source>;
pub type SinkEntry = Entry<dyn Sink>;

// Each connector registers its `ENTRY` from its own module with
// `inventory::submit!(ENTRY);`, so no central list names it.
inventory::collect!(SourceEntry);
inventory::collect!(SinkEntry);

/// Every source compiled into this binary, by name.
pub fn sources() -> &'static [&'static SourceEntry] {
    static SOURCES: OnceLock<Vec<&'static SourceEntry>> = OnceLock::new();
    SOURCES.get_or_init(|| by_name(inventory::iter::<SourceEntry>))
}

/// Every sink compiled into this binary, by name.
pub fn sinks() -> &'static [&'static SinkEntry] {
    static SINKS: OnceLock<Vec<&'static SinkEntry>> = OnceLock::new();
    SINKS.get_or_init(|| by_name(inventory::iter::<SinkEntry>))
}

fn by_name<C: ?Sized>(
    entries: impl IntoIterator<Item = &'static Entry<C>>,
) -> Vec<&'static Entry<C>> {
    let mut entries: Vec<_> = entries.into_iter().collect();
    entries.sort_by_key(|entry| entry.name);
    entries
}

impl<C: ?Sized + Interface> Entry<C> {
    pub const KIND: ConnectorKind = C::KIND;

    pub fn kind(&self) -> ConnectorKind {
        C::KIND
    }

    /// Builds the connector, naming the `plugin_config` field that is wrong.
    pub fn build(&self, plugin_config: &serde_json::Value) -> Result<Box<C>, BuildError> {
        (self.build)(plugin_config).map_err(BuildError::PluginConfig)
    }
}

/// `config_schema` for a config type.
pub fn schema_of<T: schemars::JsonSchema>() -> schemars::Schema {
    schemars::SchemaGenerator::default().into_root_schema_for::<T>()
}

/// A connector that exists in this source tree, compiled in or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InTree {
    pub name: &'static str,
    pub kind: ConnectorKind,
    pub feature: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "{} connector \"{}\" is not compiled into this binary; rebuild with `--features {}`",
        .0.kind, .0.name, .0.feature
    )]
    NotCompiledIn(InTree),
    #[error("unknown {kind} connector \"{name}\"; this binary has: {available}")]
    Unknown {
        name: String,
        kind: ConnectorKind,
        available: String,
    },
}

/// Why a connector could not be built from its config.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Registry(#[from] RegistryError),
    /// Its `plugin_config` is invalid.
    #[error("field `{}`: {}", .0.path(), .0.message)]
    PluginConfig(PluginConfigError),
}

impl PluginConfigError {
    /// The field's path in the connector file: `plugin_config` or
    /// `plugin_config.{field}`.
    pub fn path(&self) -> String {
        if self.field.is_empty() {
            "plugin_config".to_owned()
        } else {
            format!("plugin_config.{}", self.field)
        }
    }
}
