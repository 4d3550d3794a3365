//! The lookup over the connectors compiled into this binary: the entries the
//! connectors registered (`entry::sources`, `entry::sinks`), and `IN_TREE` (every
//! connector of the source tree, from Cargo.toml) to say which feature brings
//! in one that is not compiled in.

use std::path::Path;

pub use crate::connectors::entry::{
    BuildError, ConnectorKind, InTree, RegistryError, SinkEntry, SourceEntry,
};
use crate::connectors::entry::{sinks, sources};
use crate::connectors::{IN_TREE, Sink, Source};

/// What the CLI and the API show about one compiled-in connector, whatever its kind.
#[derive(Clone, Copy)]
pub struct ConnectorInfo {
    pub name: &'static str,
    pub kind: ConnectorKind,
    pub feature: &'static str,
    pub description: &'static str,
    pub secret_fields: &'static [&'static str],
    pub sample_config: &'static str,
    pub config_schema: fn() -> schemars::Schema,
}

impl ConnectorInfo {
    /// The sample `plugin_config` as JSON, with the word `secret` in each of its
    /// secret fields replaced by `secret` (so tests can plant a value and look for
    /// it), and which secret paths held no such word (a declared secret the
    /// sample does not show).
    pub fn sample_with_secret(&self, secret: &str) -> (serde_json::Value, Vec<&'static str>) {
        let mut config: serde_json::Value =
            toml::from_str(self.sample_config).unwrap_or_else(|_| serde_json::json!({}));
        let missing = self
            .secret_fields
            .iter()
            .copied()
            .filter(|path| {
                let segments: Vec<&str> = path.split('.').collect();
                plant(&mut config, &segments, secret) == 0
            })
            .collect();
        (config, missing)
    }
}

/// Replaces `secret` by `value` in the strings at `segments` (`*`: every key or
/// element); returns how many it changed.
fn plant(config: &mut serde_json::Value, segments: &[&str], value: &str) -> usize {
    use serde_json::Value;
    match (config, segments.split_first()) {
        (Value::String(text), None) if text.contains("secret") => {
            *text = text.replace("secret", value);
            1
        }
        (Value::Array(items), Some((&"*", rest))) => {
            items.iter_mut().map(|item| plant(item, rest, value)).sum()
        }
        (Value::Array(items), Some(_)) => items
            .iter_mut()
            .map(|item| plant(item, segments, value))
            .sum(),
        (Value::Object(map), Some((&"*", rest))) => map
            .values_mut()
            .map(|field| plant(field, rest, value))
            .sum(),
        (Value::Object(map), Some((first, rest))) => map
            .get_mut(*first)
            .map_or(0, |field| plant(field, rest, value)),
        _ => 0,
    }
}

macro_rules! info_of {
    ($entry:expr) => {{
        let entry = $entry;
        ConnectorInfo {
            name: entry.name,
            kind: entry.kind(),
            feature: entry.feature,
            description: entry.description,
            secret_fields: entry.secret_fields,
            sample_config: entry.sample_config,
            config_schema: entry.config_schema,
        }
    }};
}

/// The lookup over the compiled-in connectors.
pub struct Registry;

impl Registry {
    pub fn sources() -> &'static [&'static SourceEntry] {
        sources()
    }

    pub fn sinks() -> &'static [&'static SinkEntry] {
        sinks()
    }

    /// Every connector of this source tree, compiled in or not.
    pub fn in_tree() -> &'static [InTree] {
        IN_TREE
    }

    /// Every compiled-in connector, sources first.
    pub fn all() -> Vec<ConnectorInfo> {
        let sources = sources().iter().map(|entry| info_of!(entry));
        sources
            .chain(sinks().iter().map(|entry| info_of!(entry)))
            .collect()
    }

    pub fn source(name: &str) -> Result<&'static SourceEntry, RegistryError> {
        sources()
            .iter()
            .copied()
            .find(|entry| entry.name == name)
            .ok_or_else(|| missing(name, ConnectorKind::Source))
    }

    pub fn sink(name: &str) -> Result<&'static SinkEntry, RegistryError> {
        sinks()
            .iter()
            .copied()
            .find(|entry| entry.name == name)
            .ok_or_else(|| missing(name, ConnectorKind::Sink))
    }

    pub fn info(kind: ConnectorKind, name: &str) -> Result<ConnectorInfo, RegistryError> {
        Ok(match kind {
            ConnectorKind::Source => info_of!(Self::source(name)?),
            ConnectorKind::Sink => info_of!(Self::sink(name)?),
        })
    }

    /// Builds the source named `name` from its `plugin_config` (no I/O).
    pub fn build_source(
        name: &str,
        plugin_config: &serde_json::Value,
    ) -> Result<Box<dyn Source>, BuildError> {
        Self::source(name)?.build(plugin_config)
    }

    /// Builds the sink named `name` from its `plugin_config` (no I/O).
    pub fn build_sink(
        name: &str,
        plugin_config: &serde_json::Value,
    ) -> Result<Box<dyn Sink>, BuildError> {
        Self::sink(name)?.build(plugin_config)
    }

    /// Whether a connector of this kind and name builds from `plugin_config`.
    pub fn check(
        kind: ConnectorKind,
        name: &str,
        plugin_config: &serde_json::Value,
    ) -> Result<(), BuildError> {
        match kind {
            ConnectorKind::Source => Self::build_source(name, plugin_config).map(drop),
            ConnectorKind::Sink => Self::build_sink(name, plugin_config).map(drop),
        }
    }

    /// The secret `plugin_config` fields of a connector, if it is compiled in.
    pub fn secret_fields(name: &str, kind: ConnectorKind) -> &'static [&'static str] {
        Self::info(kind, name)
            .map(|info| info.secret_fields)
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
    if let Some(connector) = IN_TREE
        .iter()
        .find(|connector| connector.name == name && connector.kind == kind)
    {
        return RegistryError::NotCompiledIn(*connector);
    }
    let available: Vec<&str> = match kind {
        ConnectorKind::Source => sources().iter().map(|entry| entry.name).collect(),
        ConnectorKind::Sink => sinks().iter().map(|entry| entry.name).collect(),
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
    fn given_in_tree_connector_not_compiled_in_when_looked_up_should_name_its_feature() {
        let Some(connector) = IN_TREE
            .iter()
            .find(|connector| Registry::info(connector.kind, connector.name).is_err())
        else {
            return; // a build with every connector has nothing to refuse
        };
        let error = Registry::info(connector.kind, connector.name)
            .err()
            .expect("not compiled in");
        assert_eq!(error, RegistryError::NotCompiledIn(*connector));
        let feature = format!("--features {}", connector.feature);
        assert!(error.to_string().contains(&feature), "{error}");
    }

    #[test]
    fn given_registered_entries_when_compared_with_the_tree_should_be_named_after_their_folder_and_feature()
     {
        let registered = Registry::all();
        assert!(!registered.is_empty(), "no connector registered itself");
        for info in registered {
            let in_tree = InTree {
                name: info.name,
                kind: info.kind,
                feature: info.feature,
            };
            assert!(
                IN_TREE.contains(&in_tree),
                "{} {}: its ENTRY must be named after its folder (src/connectors/<name>/) and \
                 carry the feature `<name>-{}` of Cargo.toml",
                info.kind,
                info.name,
                info.kind,
            );
        }
        let compiled_in = IN_TREE
            .iter()
            .filter(|connector| Registry::info(connector.kind, connector.name).is_ok())
            .count();
        assert_eq!(
            compiled_in,
            Registry::all().len(),
            "a connector registered twice"
        );
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
