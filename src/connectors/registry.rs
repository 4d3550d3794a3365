//! Maps a connector name and kind to the compiled-in implementation.
//!
//! Each connector module exports one `ENTRY`; the lists below hold one line per
//! connector, gated by its cargo feature, so the binary contains exactly the
//! connectors it was built with.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

use crate::connectors::{PluginConfigError, Sink, Source};

/// Every source compiled into this binary.
static SOURCES: &[SourceEntry] = &[
    #[cfg(feature = "random-source")]
    super::sources::random::ENTRY,
    #[cfg(feature = "postgres-source")]
    super::sources::postgres::ENTRY,
    #[cfg(feature = "http-source")]
    super::sources::http::ENTRY,
];

/// Every sink compiled into this binary.
static SINKS: &[SinkEntry] = &[
    #[cfg(feature = "stdout-sink")]
    super::sinks::stdout::ENTRY,
    #[cfg(feature = "faulty-sink")]
    super::sinks::faulty::ENTRY,
    #[cfg(feature = "postgres-sink")]
    super::sinks::postgres::ENTRY,
    #[cfg(feature = "http-sink")]
    super::sinks::http::ENTRY,
];

/// Every connector that exists in this source tree, compiled in or not, so a
/// binary built without one can name the cargo feature that brings it in.
const IN_TREE: &[(&str, ConnectorKind)] = &[
    ("random", ConnectorKind::Source),
    ("postgres", ConnectorKind::Source),
    ("http", ConnectorKind::Source),
    ("stdout", ConnectorKind::Sink),
    ("postgres", ConnectorKind::Sink),
    ("http", ConnectorKind::Sink),
    ("faulty", ConnectorKind::Sink),
];

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

pub type SourceBuilder = fn(&serde_json::Value) -> Result<Box<dyn Source>, PluginConfigError>;
pub type SinkBuilder = fn(&serde_json::Value) -> Result<Box<dyn Sink>, PluginConfigError>;

/// A compiled-in source: its name, its cargo feature and how to build it from
/// its `plugin_config`. Building only parses and checks the config; I/O happens
/// in `open`.
pub struct SourceEntry {
    pub name: &'static str,
    pub feature: &'static str,
    pub description: &'static str,
    /// `plugin_config` fields (dotted paths) that hold secrets; a `*` segment
    /// matches every key of a table or element of an array (`headers.*`).
    pub secret_fields: &'static [&'static str],
    pub build: SourceBuilder,
}

/// A compiled-in sink; see [`SourceEntry`].
pub struct SinkEntry {
    pub name: &'static str,
    pub feature: &'static str,
    pub description: &'static str,
    pub secret_fields: &'static [&'static str],
    pub build: SinkBuilder,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error(
        "{kind} connector \"{name}\" is not compiled into this binary; rebuild with `--features {feature}`"
    )]
    NotCompiledIn {
        name: String,
        kind: ConnectorKind,
        feature: String,
    },
    #[error("unknown {kind} connector \"{name}\"; this binary has: {available}")]
    Unknown {
        name: String,
        kind: ConnectorKind,
        available: String,
    },
}

/// The lookup over the compiled-in connectors.
pub struct Registry;

impl Registry {
    pub fn sources() -> &'static [SourceEntry] {
        SOURCES
    }

    pub fn sinks() -> &'static [SinkEntry] {
        SINKS
    }

    pub fn source(name: &str) -> Result<&'static SourceEntry, RegistryError> {
        SOURCES
            .iter()
            .find(|entry| entry.name == name)
            .ok_or_else(|| missing(name, ConnectorKind::Source))
    }

    pub fn sink(name: &str) -> Result<&'static SinkEntry, RegistryError> {
        SINKS
            .iter()
            .find(|entry| entry.name == name)
            .ok_or_else(|| missing(name, ConnectorKind::Sink))
    }

    /// The secret `plugin_config` fields of a connector, if it is compiled in.
    pub fn secret_fields(name: &str, kind: ConnectorKind) -> &'static [&'static str] {
        match kind {
            ConnectorKind::Source => Self::source(name).map(|entry| entry.secret_fields),
            ConnectorKind::Sink => Self::sink(name).map(|entry| entry.secret_fields),
        }
        .unwrap_or(&[])
    }
}

/// Turns an upstream `path` (a shared library such as
/// `/usr/lib/libiggy_connector_postgres_sink.so`) or a bare connector name into
/// the connector name used by the registry.
pub fn connector_name_from_path(path: &str, kind: ConnectorKind) -> String {
    let stem = Path::new(path)
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or(path);
    let stem = ["so", "dylib", "dll"]
        .iter()
        .find_map(|extension| stem.strip_suffix(&format!(".{extension}")))
        .unwrap_or(stem);
    let stem = stem.strip_prefix("lib").unwrap_or(stem);
    let stem = stem.strip_prefix("iggy_connector_").unwrap_or(stem);
    let suffix = format!("_{kind}");
    let stem = stem.strip_suffix(&suffix).unwrap_or(stem);
    stem.to_owned()
}

fn missing(name: &str, kind: ConnectorKind) -> RegistryError {
    if IN_TREE.contains(&(name, kind)) {
        return RegistryError::NotCompiledIn {
            name: name.to_owned(),
            kind,
            feature: format!("{name}-{kind}"),
        };
    }
    let available: Vec<&str> = match kind {
        ConnectorKind::Source => SOURCES.iter().map(|entry| entry.name).collect(),
        ConnectorKind::Sink => SINKS.iter().map(|entry| entry.name).collect(),
    };
    RegistryError::Unknown {
        name: name.to_owned(),
        kind,
        available: if available.is_empty() {
            "none".to_owned()
        } else {
            available.join(", ")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_upstream_library_paths_when_mapped_should_yield_connector_names() {
        let cases = [
            (
                "libiggy_connector_postgres_sink",
                ConnectorKind::Sink,
                "postgres",
            ),
            (
                "/usr/lib/libiggy_connector_random_source.so",
                ConnectorKind::Source,
                "random",
            ),
            (
                "target/release/libiggy_connector_stdout_sink.dylib",
                ConnectorKind::Sink,
                "stdout",
            ),
            (
                "iggy_connector_http_source.dll",
                ConnectorKind::Source,
                "http",
            ),
            ("postgres", ConnectorKind::Source, "postgres"),
        ];
        for (path, kind, expected) in cases {
            assert_eq!(connector_name_from_path(path, kind), expected, "{path}");
        }
    }

    #[test]
    fn given_in_tree_connector_not_compiled_in_when_looked_up_should_name_the_feature() {
        let compiled_in = |name: &str, kind: ConnectorKind| match kind {
            ConnectorKind::Source => Registry::source(name).is_ok(),
            ConnectorKind::Sink => Registry::sink(name).is_ok(),
        };
        let Some(&(name, kind)) = IN_TREE
            .iter()
            .find(|(name, kind)| !compiled_in(name, *kind))
        else {
            return; // a build with every connector has nothing to refuse
        };
        let error = match kind {
            ConnectorKind::Source => Registry::source(name).err(),
            ConnectorKind::Sink => Registry::sink(name).err(),
        }
        .expect("not compiled in");
        let feature = format!("{name}-{kind}");
        assert_eq!(
            error,
            RegistryError::NotCompiledIn {
                name: name.into(),
                kind,
                feature: feature.clone(),
            }
        );
        assert!(error.to_string().contains(&format!("--features {feature}")));
    }

    #[test]
    fn given_unknown_connector_when_looked_up_should_list_what_is_available() {
        let error = Registry::source("nope").err().expect("unknown");
        assert!(matches!(error, RegistryError::Unknown { .. }));
        assert!(
            error
                .to_string()
                .contains("unknown source connector \"nope\"")
        );
    }
}
