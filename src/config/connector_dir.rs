//! A connector directory: its connector files, each key's versions, and
//! `.active_versions.toml`.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

use crate::config::ConfigIssue;
use crate::config::ConfigIssues;
use crate::config::connector::{ConnectorConfig, parse_connector_file};
use crate::config::env::EnvVars;
use crate::config::reader::describe;
use crate::connectors::ConnectorKind;

/// Reads every connector file of `dir` (see [`is_connector_file`]) and picks the active version of each key (`.active_versions.toml`, else the
/// highest). Returns the chosen configs and every issue found.
pub fn load_connector_dir(dir: &Path, vars: &EnvVars) -> (Vec<ConnectorConfig>, Vec<ConfigIssue>) {
    let mut issues = Vec::new();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) => {
            issues.push(ConfigIssue::error(
                dir,
                "",
                format!("cannot read connector directory: {error}"),
            ));
            return (Vec::new(), issues);
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| is_connector_file(path))
        .collect();
    files.sort();

    let mut versions: BTreeMap<(ConnectorKind, String), BTreeMap<u64, ConnectorConfig>> =
        BTreeMap::new();
    for file in files {
        let text = match fs::read_to_string(&file) {
            Ok(text) => text,
            Err(error) => {
                issues.push(ConfigIssue::error(
                    &file,
                    "",
                    format!("cannot read file: {error}"),
                ));
                continue;
            }
        };
        match parse_connector_file(&file, &text, vars) {
            Ok((config, warnings)) => {
                issues.extend(warnings);
                let by_version = versions
                    .entry((config.kind, config.key.clone()))
                    .or_default();
                if let Some(previous) = by_version.get(&config.version) {
                    issues.push(ConfigIssue::error(
                        &file,
                        "version",
                        format!(
                            "{} \"{}\" version {} is also defined in {}",
                            config.kind,
                            config.key,
                            config.version,
                            previous.origin().display()
                        ),
                    ));
                    continue;
                }
                by_version.insert(config.version, config);
            }
            Err(ConfigIssues(found)) => issues.extend(found),
        }
    }

    let active = read_active_versions(dir, &mut issues);
    let mut chosen = Vec::with_capacity(versions.len());
    for ((kind, key), mut by_version) in versions {
        let pinned = active.get(&(kind, key.clone())).copied();
        let picked = match pinned {
            Some(version) => by_version.remove(&version).or_else(|| {
                issues.push(ConfigIssue::error(
                    &dir.join(ACTIVE_VERSIONS_FILE),
                    format!("{kind}s.{key}"),
                    format!(
                        "active version {version} does not exist (found: {:?})",
                        by_version.keys().collect::<Vec<_>>()
                    ),
                ));
                None
            }),
            None => by_version.pop_last().map(|(_, config)| config),
        };
        chosen.extend(picked);
    }
    (chosen, issues)
}

const ACTIVE_VERSIONS_FILE: &str = ".active_versions.toml";

/// A connector file of a connector directory: `*.toml`, not hidden, not
/// `Cargo.toml`, and not the tests of one (`NAME.test.toml`, which
/// `iggy-connect test` reads beside `NAME.toml`).
pub fn is_connector_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|name| name.to_str()) else {
        return false;
    };
    name.ends_with(".toml")
        && !name.ends_with(".test.toml")
        && !name.starts_with('.')
        && name != "Cargo.toml"
        && path.is_file()
}

fn read_active_versions(
    dir: &Path,
    issues: &mut Vec<ConfigIssue>,
) -> BTreeMap<(ConnectorKind, String), u64> {
    let path = dir.join(ACTIVE_VERSIONS_FILE);
    let mut active = BTreeMap::new();
    let Ok(text) = fs::read_to_string(&path) else {
        return active;
    };
    let table: Table = match toml::from_str(&text) {
        Ok(table) => table,
        Err(error) => {
            issues.push(ConfigIssue::error(
                &path,
                "",
                format!("not valid TOML: {error}"),
            ));
            return active;
        }
    };
    for (section, kind) in [
        ("sinks", ConnectorKind::Sink),
        ("sources", ConnectorKind::Source),
    ] {
        let Some(Value::Table(entries)) = table.get(section) else {
            continue;
        };
        for (key, version) in entries {
            match version {
                Value::Integer(version) if *version >= 0 => {
                    active.insert((kind, key.clone()), *version as u64);
                }
                other => issues.push(ConfigIssue::error(
                    &path,
                    format!("{section}.{key}"),
                    format!("expected a version number, found {}", describe(other)),
                )),
            }
        }
    }
    active
}
