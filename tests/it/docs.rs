//! The documentation generated from the code against the committed files
//! (`BLESS=1` rewrites them), every connector's `doc.md`, and the relative
//! links of every Markdown file.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use clap::CommandFactory;
use iggy_connect::cli::Cli;
use iggy_connect::connectors::Registry;
use iggy_connect::connectors::describe::pages::{
    self, Catalog, FEATURES_PATH, INDEX_PATH, PAGES_DIR, REGENERATE,
};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn bless() -> bool {
    std::env::var_os("BLESS").is_some()
}

/// Each subcommand with the first line of its help, as `iggy-connect help` lists them.
fn commands() -> Vec<(String, String)> {
    Cli::command()
        .get_subcommands()
        .map(|command| {
            let about = command
                .get_about()
                .map(ToString::to_string)
                .unwrap_or_default();
            (command.get_name().to_owned(), about)
        })
        .collect()
}

#[test]
#[cfg_attr(
    not(all(feature = "full", feature = "faulty-sink")),
    ignore = "the generated docs cover every connector: run with --features full,faulty-sink"
)]
fn generated_docs_match_the_registry_the_features_and_each_doc_md() {
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(repo().join("Cargo.toml")).unwrap()).unwrap();
    let features = manifest["features"].as_table().expect("[features]");
    let connectors = Registry::all();
    let catalog = Catalog::new(&connectors, features);

    let mut problems = Vec::new();
    let mut generated: Vec<(String, String)> = Vec::new();
    for name in catalog.names() {
        let doc_path = pages::doc_path(name);
        match std::fs::read_to_string(repo().join(&doc_path)) {
            Ok(doc) => generated.push((pages::page_path(name), catalog.page(name, &doc))),
            Err(error) => problems.push(format!(
                "{doc_path} is missing ({error}): every connector needs one (see CONTRIBUTING.md)"
            )),
        }
    }
    generated.push((INDEX_PATH.to_owned(), catalog.index()));
    generated.push((FEATURES_PATH.to_owned(), catalog.features_md(&commands())));
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    match catalog.readme(&readme) {
        Some(text) => generated.push(("README.md".to_owned(), text)),
        None => problems.push(format!(
            "README.md lacks the lines `{}` and `{}` around its connector table",
            pages::TABLE_START,
            pages::TABLE_END
        )),
    }

    for (path, text) in &generated {
        let file = repo().join(path);
        if bless() {
            std::fs::create_dir_all(file.parent().unwrap()).unwrap();
            std::fs::write(&file, text).unwrap();
        } else if std::fs::read_to_string(&file).ok().as_deref() != Some(text.as_str()) {
            problems.push(format!("{path} differs from what the code generates"));
        }
    }
    let expected: BTreeSet<PathBuf> = generated
        .iter()
        .map(|(path, _)| repo().join(path))
        .collect();
    for entry in std::fs::read_dir(repo().join(PAGES_DIR)).unwrap() {
        let file = entry.unwrap().path();
        if !expected.contains(&file) {
            if bless() {
                std::fs::remove_file(&file).unwrap();
            } else {
                problems.push(format!(
                    "{} is no connector's page (a connector removed?)",
                    file.strip_prefix(repo()).unwrap().display()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{}\nregenerate with: {REGENERATE}",
        problems.join("\n")
    );
}

#[test]
fn every_connector_of_the_source_tree_has_its_doc_md() {
    let missing: BTreeSet<String> = Registry::in_tree()
        .iter()
        .map(|connector| pages::doc_path(connector.name))
        .filter(|path| !repo().join(path).is_file())
        .collect();
    assert!(
        missing.is_empty(),
        "missing: {missing:?}: the prose of a connector's page (see CONTRIBUTING.md)"
    );
}

#[test]
fn every_relative_link_in_the_markdown_files_resolves() {
    let mut files = Vec::new();
    markdown_files(repo(), &mut files);
    assert!(files.len() > 10, "found only {files:?}");
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for link in pages::relative_links(&text) {
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            let here = file.strip_prefix(repo()).unwrap().display();
            if !target.exists() {
                broken.push(format!("{here}: {link} (no such file)"));
            } else if !anchor.is_empty()
                && target
                    .extension()
                    .is_some_and(|extension| extension == "md")
                && !anchors(&std::fs::read_to_string(&target).unwrap()).contains(anchor)
            {
                broken.push(format!("{here}: {link} (no such heading)"));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// Every `.md` file under `dir`, leaving out build output and Git's files.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if name != "target" && name != ".git" {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The anchors GitHub gives a document's headings: lower case, punctuation
/// dropped, spaces as hyphens, `-1`, `-2`, ... for repeats.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else {
            continue;
        };
        let text = heading.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut candidate = slug.clone();
        let mut repeat = 0;
        while !anchors.insert(candidate.clone()) {
            repeat += 1;
            candidate = format!("{slug}-{repeat}");
        }
    }
    anchors
}
