//! Finds the connectors of this source tree, so that adding one takes its
//! folder and its cargo feature and nothing else.
//!
//! A connector is a cargo feature named `<backend>-source` or
//! `<backend>-sink` in Cargo.toml, and its code is the folder
//! `src/connectors/<backend>/` (a `mod.rs` declaring `source` and/or `sink`).
//! This writes `$OUT_DIR/connectors.rs`, included by `src/connectors/mod.rs`:
//! one module per backend folder, compiled in when any feature named
//! `<backend>-*` is on, and `IN_TREE`, every connector of the tree whether
//! compiled in or not (so a binary without one can say which feature brings
//! it in), and `STATE_KINDS_IN_TREE`, every `<kind>-state` feature (a state
//! store kept by a backend's folder). Each connector registers itself from
//! its own module (see `connectors::entry`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

fn main() {
    println!("cargo::rerun-if-changed=Cargo.toml");
    println!("cargo::rerun-if-changed=src/connectors");

    let manifest = std::fs::read_to_string("Cargo.toml").expect("reading Cargo.toml");
    let features = feature_names(&manifest);
    // Read when the script runs, not when it is compiled: one compiled
    // script may serve clones at other paths (a shared target directory).
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let connectors_dir = Path::new(&manifest_dir).join("src/connectors");

    // backend -> the features that compile its folder in
    let mut backends: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    let mut in_tree = String::new();
    let mut state_kinds = String::new();
    for feature in &features {
        let Some((backend, kind)) = feature.rsplit_once('-') else {
            continue;
        };
        if kind == "state" {
            writeln!(state_kinds, "    ({backend:?}, {feature:?}),").unwrap();
            continue;
        }
        let kind = match kind {
            "source" => "Source",
            "sink" => "Sink",
            _ => continue,
        };
        let module = backend.replace('-', "_");
        let folder = connectors_dir.join(&module);
        let kind_file = folder.join(kind.to_lowercase());
        assert!(
            kind_file.with_extension("rs").is_file() || kind_file.is_dir(),
            "Cargo.toml has the feature `{feature}`, so {} (or the folder {}) must hold that connector",
            kind_file.with_extension("rs").display(),
            kind_file.display(),
        );
        backends.insert(module.clone(), Vec::new());
        writeln!(
            in_tree,
            "    InTree {{ name: {module:?}, kind: ConnectorKind::{kind}, feature: {feature:?} }},"
        )
        .unwrap();
    }
    for feature in &features {
        for (backend, enabling) in backends.iter_mut() {
            // The feature spells the folder's `_` as `-` (`object-store-source`).
            if feature
                .strip_prefix(backend.replace('_', "-").as_str())
                .is_some_and(|rest| rest.starts_with('-'))
            {
                enabling.push(feature);
            }
        }
    }

    let mut out = String::from("// Written by build.rs from Cargo.toml's features.\n\n");
    for (backend, enabling) in &backends {
        let cfg: Vec<String> = enabling
            .iter()
            .map(|feature| format!("feature = {feature:?}"))
            .collect();
        let path = connectors_dir.join(backend).join("mod.rs");
        writeln!(
            out,
            "#[cfg(any({}))]\n#[path = {:?}]\npub mod {backend};",
            cfg.join(", "),
            path.display().to_string(),
        )
        .unwrap();
    }
    writeln!(
        out,
        "\n/// Every connector of this source tree, compiled in or not.\n\
         pub(crate) const IN_TREE: &[InTree] = &[\n{in_tree}];"
    )
    .unwrap();
    writeln!(
        out,
        "\n/// Every state store of this source tree (`[state] type`), compiled in or\n\
         /// not, with the feature that compiles it in (`<kind>-state`).\n\
         pub const STATE_KINDS_IN_TREE: &[(&str, &str)] = &[\n{state_kinds}];"
    )
    .unwrap();
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(Path::new(&out_dir).join("connectors.rs"), out).expect("writing connectors.rs");
}

/// The names declared in Cargo.toml's `[features]` table, in order.
fn feature_names(manifest: &str) -> Vec<String> {
    manifest
        .lines()
        .skip_while(|line| line.trim() != "[features]")
        .skip(1)
        .take_while(|line| !line.trim_start().starts_with('['))
        .filter_map(|line| {
            let (name, _) = line.split_once('=')?;
            let name = name.trim();
            (!name.is_empty() && !name.starts_with('#')).then(|| name.to_owned())
        })
        .collect()
}
