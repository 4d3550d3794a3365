//! `[state]`: where sources keep their committed state.
//!
//! The file store (upstream's `path`) is built in. Every other store is kept
//! by a backend's folder, behind the feature `<kind>-state`, and declares
//! itself there with `inventory::submit!(StateKind { .. })`: its name (what
//! `type = "<kind>"`, or upstream's `storage = "<kind>"`, says), its fields
//! (keys of `[state]` beside `path`, read and checked by the backend) and its
//! check. Nothing here names a backend.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::DeserializeOwned;
use toml::Table;

use crate::config::ConfigIssue;
use crate::config::env::Kind;
use crate::connectors::STATE_KINDS_IN_TREE;

/// The built-in store: one file per source under `path`.
pub const FILE: &str = "file";

/// `[state]` as the runtime file and the environment give it.
#[derive(Clone, Deserialize)]
#[serde(try_from = "RawState")]
pub struct StateConfig {
    /// The store: [`FILE`] (the default) or the name of a registered
    /// [`StateKind`].
    pub kind: String,
    /// The file store's directory.
    pub path: PathBuf,
    /// The other keys of `[state]`: the fields of the store `kind` names,
    /// read by its backend ([`StateConfig::settings`]).
    pub settings: Table,
    /// Whether upstream's `storage` named the store (else `type`).
    named_by_storage: bool,
}

/// A state store a backend's folder adds. Registered with
/// `inventory::submit!`, beside the store's code.
pub struct StateKind {
    /// What `[state] type` (or `storage`) names it by.
    pub name: &'static str,
    /// The cargo feature that compiles it in (`<name>-state`).
    pub feature: &'static str,
    /// The keys of `[state]` it reads, beside `type`, `storage` and `path`.
    pub fields: &'static [StateField],
    /// Checks its fields without I/O; each issue names `state.<field>`.
    pub check: fn(&StateConfig, &Path) -> Vec<ConfigIssue>,
}

inventory::collect!(StateKind);

/// One key of `[state]` a store reads: its dotted path below `[state]`
/// (`server.url`; `server.headers.*` for a table of free keys) and the
/// type an `IGGY_CONNECTORS_STATE_<PATH>` override is read as.
pub struct StateField {
    pub path: &'static str,
    pub kind: Kind,
}

impl StateField {
    pub const fn new(path: &'static str, kind: Kind) -> Self {
        Self { path, kind }
    }
}

/// The keys every `[state]` may hold, whatever the store.
const COMMON_KEYS: &[&str] = &["type", "storage", "path"];

impl StateKind {
    /// The registered stores, by name.
    pub fn all() -> Vec<&'static StateKind> {
        let mut kinds: Vec<&'static StateKind> = inventory::iter::<StateKind>.into_iter().collect();
        kinds.sort_by_key(|kind| kind.name);
        kinds
    }

    /// The registered store called `name`.
    pub fn named(name: &str) -> Option<&'static StateKind> {
        inventory::iter::<StateKind>
            .into_iter()
            .find(|kind| kind.name == name)
    }
}

/// Every key `[state]` may hold in this build, as dotted paths: the common
/// keys, then each registered store's fields.
pub fn known_keys() -> Vec<&'static str> {
    COMMON_KEYS
        .iter()
        .copied()
        .chain(
            StateKind::all()
                .into_iter()
                .flat_map(|kind| kind.fields.iter().map(|field| field.path)),
        )
        .collect()
}

/// The environment overrides of the registered stores' fields:
/// `STATE_<PATH>` (dots as underscores, upper case), the field's path in the
/// runtime file and its type. A table of free keys has none.
pub fn env_fields() -> Vec<(String, Vec<&'static str>, Kind)> {
    StateKind::all()
        .into_iter()
        .flat_map(|kind| kind.fields.iter())
        .filter(|field| !field.path.ends_with(".*"))
        .map(|field| {
            let name = format!("STATE_{}", field.path.replace('.', "_").to_uppercase());
            let path = std::iter::once("state")
                .chain(field.path.split('.'))
                .collect();
            (name, path, field.kind)
        })
        .collect()
}

impl StateConfig {
    /// Checks the store `kind` names: a registered one checks its fields; a
    /// name that is not compiled in is an error naming the file, the field,
    /// the stores of this build and the feature that would add it.
    pub fn check(&self, file: &Path) -> Vec<ConfigIssue> {
        if self.kind == FILE {
            return Vec::new();
        }
        if let Some(kind) = StateKind::named(&self.kind) {
            return (kind.check)(self, file);
        }
        let field = match self.named_by_storage {
            true => "state.storage",
            false => "state.type",
        };
        let built: Vec<&str> = std::iter::once(FILE)
            .chain(StateKind::all().into_iter().map(|kind| kind.name))
            .collect();
        let message = match STATE_KINDS_IN_TREE
            .iter()
            .find(|(name, _)| *name == self.kind)
        {
            Some((_, feature)) => format!(
                "\"{}\" needs a build with the {feature} feature (cargo install --features {feature}); \
                 this build keeps state in: {}",
                self.kind,
                built.join(", ")
            ),
            None => {
                let others: Vec<String> = STATE_KINDS_IN_TREE
                    .iter()
                    .filter(|(name, _)| !built.contains(name))
                    .map(|(name, feature)| format!("{name} (feature {feature})"))
                    .collect();
                let more = match others.is_empty() {
                    true => String::new(),
                    false => format!("; other builds also have {}", others.join(", ")),
                };
                format!(
                    "unknown state store \"{}\": this build has {}{more}",
                    self.kind,
                    built.join(", ")
                )
            }
        };
        vec![ConfigIssue::error(file, field, message)]
    }

    /// The store's fields as its backend's config type, or an error naming
    /// the field (`state.server.timeout`) and what is wrong with it.
    pub fn settings<T: DeserializeOwned>(&self) -> Result<T, SettingsError> {
        serde_path_to_error::deserialize(self.settings.clone()).map_err(|error| {
            let (field, message) = crate::connectors::serde_field(error);
            SettingsError {
                field: match field.as_str() {
                    "" => "state".to_owned(),
                    field => format!("state.{field}"),
                },
                message,
            }
        })
    }

    /// [`settings`](Self::settings) as a config issue of `file`.
    pub fn read<T: DeserializeOwned>(&self, file: &Path) -> Result<T, ConfigIssue> {
        self.settings()
            .map_err(|error| ConfigIssue::error(file, error.field, error.message))
    }
}

/// A field of `[state]` its store cannot read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct SettingsError {
    pub field: String,
    pub message: String,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            kind: FILE.to_owned(),
            path: PathBuf::from("local_state"),
            settings: Table::new(),
            named_by_storage: false,
        }
    }
}

/// The fields' values may be secrets (a connection string, a header): their
/// names only.
impl fmt::Debug for StateConfig {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("StateConfig")
            .field("kind", &self.kind)
            .field("path", &self.path)
            .field("settings", &self.settings.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `[state]` as written: ours names the store with `type`, upstream with
/// `storage`.
#[derive(Default, Deserialize)]
#[serde(default)]
struct RawState {
    #[serde(rename = "type")]
    kind: Option<String>,
    storage: Option<String>,
    path: Option<PathBuf>,
    #[serde(flatten)]
    settings: Table,
}

impl TryFrom<RawState> for StateConfig {
    type Error = String;

    fn try_from(raw: RawState) -> Result<Self, Self::Error> {
        let (kind, named_by_storage) = match (raw.kind, raw.storage) {
            (Some(kind), Some(storage)) if !kind.eq_ignore_ascii_case(&storage) => {
                return Err(format!(
                    "`type = \"{kind}\"` and `storage = \"{storage}\"` name different state stores; \
                     keep one (`storage` is upstream's name for `type`)"
                ));
            }
            (Some(kind), _) => (kind, false),
            (None, Some(storage)) => (storage, true),
            (None, None) => (FILE.to_owned(), false),
        };
        let defaults = Self::default();
        Ok(Self {
            kind: kind.to_ascii_lowercase(),
            path: raw.path.unwrap_or(defaults.path),
            settings: raw.settings,
            named_by_storage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(text: &str) -> Result<StateConfig, String> {
        toml::from_str::<StateConfig>(text).map_err(|error| error.to_string())
    }

    #[test]
    fn given_upstreams_path_only_section_when_parsed_should_be_the_file_store() {
        let state = parsed("path = \"local_state\"").unwrap();
        assert_eq!(state.kind, FILE);
        assert_eq!(state.path, Path::new("local_state"));
        assert!(state.settings.is_empty());
        assert!(state.check(Path::new("config.toml")).is_empty());
    }

    #[test]
    fn given_storage_or_type_when_parsed_should_name_the_store_and_keep_its_fields() {
        let state = parsed("storage = \"ACME\"\n[acme]\nurl = \"http://h/state\"\n").unwrap();
        assert_eq!(state.kind, "acme");
        assert!(state.named_by_storage);
        assert_eq!(
            state.settings["acme"]["url"].as_str(),
            Some("http://h/state")
        );
        let state = parsed("type = \"file\"\nstorage = \"file\"\n").unwrap();
        assert_eq!(state.kind, FILE);
        let refused = parsed("type = \"one\"\nstorage = \"two\"\n").unwrap_err();
        assert!(refused.contains("name different state stores"), "{refused}");
    }

    #[test]
    fn given_a_store_no_build_has_when_checked_should_name_the_field_and_the_stores_built_in() {
        let state = parsed("storage = \"s3\"").unwrap();
        let issues = state.check(Path::new("/etc/config.toml"));
        assert_eq!(issues.len(), 1, "{issues:?}");
        assert_eq!(issues[0].field, "state.storage");
        let shown = issues[0].to_string();
        assert!(shown.contains("/etc/config.toml"), "{shown}");
        assert!(shown.contains("unknown state store \"s3\""), "{shown}");
        assert!(shown.contains("this build has file"), "{shown}");
    }

    #[test]
    fn given_a_state_config_when_debug_printed_should_show_field_names_not_values() {
        let state = parsed("type = \"x\"\nconnection_string = \"db://u:secret@h/db\"\n").unwrap();
        let shown = format!("{state:?}");
        assert!(shown.contains("connection_string"), "{shown}");
        assert!(!shown.contains("secret@"), "{shown}");
    }
}
