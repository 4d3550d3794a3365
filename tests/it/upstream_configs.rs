//! Upstream's example connector files, unchanged: each one whose connector is
//! compiled in passes `validate` as it is, and so does upstream's runtime example
//! (with the connector files whose connector is compiled in), run from the
//! directory upstream runs it from. A template with empty values is refused,
//! naming each empty field. A new connector is covered the day it lands.
#![cfg(all(feature = "random-source", feature = "stdout-sink"))]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use iggy_connect::connectors::registry::connector_name_from_path;
use iggy_connect::connectors::{ConnectorKind, Registry};

/// `shared/reference/upstream-configs/` beside the repository (CI has `shared/`
/// beside the clone) or beside one of its parent directories (a worktree).
fn upstream() -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    repo.ancestors()
        .skip(1)
        .map(|dir| dir.join("shared/reference/upstream-configs"))
        .find(|dir| dir.is_dir())
        .unwrap_or_else(|| {
            panic!(
                "no shared/reference/upstream-configs beside {}",
                repo.display()
            )
        })
}

fn validate(dir: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_iggy-connect"))
        .args(["validate", "--config", "config.toml"])
        .current_dir(dir)
        .output()
        .expect("run iggy-connect")
}

const RUNTIME_CONFIG: &str = "[iggy]\naddress = \"127.0.0.1:8090\"\nusername = \"iggy\"\npassword = \"iggy\"\n[state]\npath = \"state\"\n[connectors]\nconfig_type = \"local\"\nconfig_dir = \"connectors\"\n";

/// Whether this binary has the connector a connector file names.
fn compiled_in(text: &str) -> bool {
    let table: toml::Table = toml::from_str(text).expect("upstream's file is TOML");
    let kind: ConnectorKind = table["type"].as_str().unwrap().parse().unwrap();
    let name = connector_name_from_path(table["path"].as_str().unwrap(), kind);
    Registry::info(kind, &name).is_ok()
}

/// `streams[i].field` for every empty string or list in a file's streams.
fn empty_stream_fields(text: &str) -> Vec<String> {
    let table: toml::Table = toml::from_str(text).unwrap();
    let mut empty = Vec::new();
    for (index, stream) in table["streams"].as_array().unwrap().iter().enumerate() {
        for (field, value) in stream.as_table().unwrap() {
            let is_empty = match value {
                toml::Value::String(text) => text.is_empty(),
                toml::Value::Array(items) => items.is_empty(),
                _ => false,
            };
            if is_empty {
                empty.push(format!("streams[{index}].{field}"));
            }
        }
    }
    empty
}

fn connector_files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut files: Vec<(PathBuf, String)> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("{}: {error}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "toml")
        })
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_upstream_example_file_of_a_compiled_in_connector_validates_unchanged() {
    let files = connector_files(&upstream());
    assert!(files.len() > 10, "{} upstream files", files.len());
    let mut validated = 0;
    for (path, text) in files {
        // Templates with empty values: the next test.
        if !compiled_in(&text) || !empty_stream_fields(&text).is_empty() {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("connectors")).unwrap();
        std::fs::copy(
            &path,
            dir.path()
                .join("connectors")
                .join(path.file_name().unwrap()),
        )
        .unwrap();
        std::fs::write(dir.path().join("config.toml"), RUNTIME_CONFIG).unwrap();
        let output = validate(dir.path());
        assert!(
            output.status.success(),
            "{}: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
        validated += 1;
    }
    assert!(validated > 0, "no upstream file's connector is compiled in");
}

#[test]
fn upstream_templates_with_empty_values_are_refused_naming_each_empty_field() {
    let mut templates = 0;
    for (path, text) in connector_files(&upstream()) {
        let empty = empty_stream_fields(&text);
        if empty.is_empty() {
            continue;
        }
        templates += 1;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("connectors")).unwrap();
        std::fs::copy(&path, dir.path().join("connectors/template.toml")).unwrap();
        std::fs::write(dir.path().join("config.toml"), RUNTIME_CONFIG).unwrap();
        let output = validate(dir.path());
        assert_eq!(output.status.code(), Some(2), "{}", path.display());
        let stderr = String::from_utf8_lossy(&output.stderr);
        for field in empty {
            assert!(
                stderr.contains(&format!("field `{field}`")),
                "{}: {field} is not named: {stderr}",
                path.display()
            );
        }
    }
    assert!(templates > 0, "upstream ships templates with empty values");
}

#[test]
fn upstream_runtime_example_validates_from_the_directory_upstream_runs_it_from() {
    let example = upstream().join("runtime-example");
    let config = std::fs::read_to_string(example.join("config.toml")).unwrap();
    let table: toml::Table = toml::from_str(&config).unwrap();
    let config_dir = table["connectors"]["config_dir"].as_str().unwrap();

    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("config.toml"), &config).unwrap();
    let connectors = root.path().join(config_dir);
    std::fs::create_dir_all(&connectors).unwrap();
    let mut copied = 0;
    for (path, text) in connector_files(&example.join("connectors")) {
        if compiled_in(&text) {
            std::fs::copy(&path, connectors.join(path.file_name().unwrap())).unwrap();
            copied += 1;
        }
    }
    assert!(
        copied > 0,
        "none of the runtime example's connectors is compiled in"
    );
    let output = validate(root.path());
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
