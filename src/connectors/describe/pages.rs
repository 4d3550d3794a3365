//! The documentation generated from the code: one page per connector
//! (`docs/connectors/<name>.md`: its `doc.md` prose, then per kind the fields
//! and an example file), the connector index, `features.md` and the README's
//! connector table. Pure functions of the registry, Cargo.toml's `[features]`
//! and the `doc.md` texts; `tests/docs.rs` writes them (`BLESS=1`) or checks
//! the committed files against them.

use std::path::{Component, Path, PathBuf};

use crate::config::connector::{DEFAULT_MAX_IN_FLIGHT, MAX_IN_FLIGHT};
use crate::connectors::ConnectorKind;
use crate::connectors::describe::{example_file, fields};
use crate::connectors::registry::ConnectorInfo;
use crate::transforms;

/// The command that rewrites every generated file.
pub const REGENERATE: &str =
    "BLESS=1 cargo nextest run --features full,faulty-sink --test it -E 'test(/^docs::/)'";

/// The connector index, relative to the repository.
pub const INDEX_PATH: &str = "docs/connectors/README.md";

/// The features matrix, relative to the repository.
pub const FEATURES_PATH: &str = "features.md";

/// The folder of the generated connector pages, relative to the repository.
pub const PAGES_DIR: &str = "docs/connectors";

/// The README lines between these two markers are the generated connector table.
pub const TABLE_START: &str =
    "<!-- connectors: generated from the registry, see CONTRIBUTING.md -->";
pub const TABLE_END: &str = "<!-- end of connectors -->";

/// The hand-written prose of a connector, relative to the repository.
pub fn doc_path(name: &str) -> String {
    format!("src/connectors/{name}/doc.md")
}

/// The generated page of a connector, relative to the repository.
pub fn page_path(name: &str) -> String {
    format!("{PAGES_DIR}/{name}.md")
}

/// The registered connectors with the Cargo features that bring them in.
pub struct Catalog<'a> {
    connectors: &'a [ConnectorInfo],
    /// Cargo.toml's `[features]` table.
    features: &'a toml::Table,
}

impl<'a> Catalog<'a> {
    pub fn new(connectors: &'a [ConnectorInfo], features: &'a toml::Table) -> Self {
        Self {
            connectors,
            features,
        }
    }

    /// Every connector name once, in registration order.
    pub fn names(&self) -> Vec<&'static str> {
        let mut names: Vec<&'static str> = Vec::new();
        for info in self.connectors {
            if !names.contains(&info.name) {
                names.push(info.name);
            }
        }
        names
    }

    /// `docs/connectors/<name>.md`: what the connector is (its table and its
    /// `doc.md`), then per kind its fields and an example connector file.
    pub fn page(&self, name: &str, doc: &str) -> String {
        let doc = rebase_links(doc.trim(), &doc_path(name), &page_path(name));
        let mut out = format!(
            "{}\n# {name}\n\n| kind | feature | bundles | what it does |\n| --- | --- | --- | --- |\n",
            generated_note(&format!("`{}` and the config types", doc_path(name)))
        );
        for info in self.of(name) {
            out.push_str(&format!(
                "| {} | `{}` | {} | {} |\n",
                info.kind,
                info.feature,
                self.bundle_list(info.feature),
                cell(info.description)
            ));
        }
        out.push_str(&format!("\n{doc}\n"));
        for info in self.of(name) {
            out.push_str(&configuration_section(info));
        }
        out
    }

    /// `docs/connectors/README.md`: every connector with its source and sink.
    pub fn index(&self) -> String {
        let mut out = format!(
            "{}\n# Connectors\n\nOne page per connector: what it does and guarantees, how it is tested, where it \
             differs from upstream, its fields and an example file that `iggy-connect validate` accepts. \
             Which cargo feature and bundle brings each in: [features.md](../../features.md).\n\n\
             | connector | source | sink |\n| --- | --- | --- |\n",
            generated_note("the registry")
        );
        for name in self.names() {
            let of_kind = |kind| {
                self.of(name)
                    .find(|info| info.kind == kind)
                    .map_or_else(|| "-".to_owned(), |info| cell(info.description))
            };
            out.push_str(&format!(
                "| [{name}]({name}.md) | {} | {} |\n",
                of_kind(ConnectorKind::Source),
                of_kind(ConnectorKind::Sink)
            ));
        }
        out
    }

    /// `features.md`: every connector feature with its bundles, the bundles,
    /// the transforms with the feature each needs, the other features, and
    /// the commands (`commands`: each subcommand and the first line of its
    /// help, as clap has them).
    pub fn features_md(&self, commands: &[(String, String)]) -> String {
        let mut out = format!(
            "{}\n# Cargo features\n\nEvery connector is an in-tree module behind its own cargo feature: a binary \
             contains exactly the connectors it was built with, and asking it for another one fails naming the \
             feature to enable. A connector in no bundle is test-only and never shipped.\n\n\
             | connector | kind | feature | bundles | what it does |\n| --- | --- | --- | --- | --- |\n",
            generated_note("the registry and Cargo.toml")
        );
        for info in self.connectors {
            out.push_str(&format!(
                "| [{name}](docs/connectors/{name}.md) | {} | `{}` | {} | {} |\n",
                info.kind,
                info.feature,
                self.bundle_list(info.feature),
                cell(info.description),
                name = info.name,
            ));
        }
        out.push_str("\n## Bundles\n\n| bundle | features |\n| --- | --- |\n");
        for bundle in self.bundles() {
            let members: Vec<String> = self
                .members(bundle)
                .iter()
                .map(|member| format!("`{member}`"))
                .collect();
            out.push_str(&format!("| `{bundle}` | {} |\n", members.join(", ")));
        }
        out.push_str(
            "\n## Transforms\n\nIn every build unless a feature is named; see \
             [docs/schemas-and-transforms.md](docs/schemas-and-transforms.md).\n\n\
             | transform | feature | what it does |\n| --- | --- | --- |\n",
        );
        for transform in transforms::CATALOG {
            out.push_str(&format!(
                "| `{}` | {} | {} |\n",
                transform.name,
                transform
                    .feature
                    .map_or_else(|| "-".to_owned(), |feature| format!("`{feature}`")),
                cell(transform.description),
            ));
        }
        let others: Vec<String> = self
            .features
            .keys()
            .filter(|feature| !self.is_connector_feature(feature) && !self.is_bundle(feature))
            .map(|feature| format!("`{feature}`"))
            .collect();
        out.push_str(&format!(
            "\n## Other features\n\n{}: what each adds is in [docs/building.md](docs/building.md#cargo-features).\n",
            others.join(", ")
        ));
        out.push_str(
            "\n## Commands\n\nIn every build; `iggy-connect help COMMAND` has the options.\n\n\
             | command | what it does |\n| --- | --- |\n",
        );
        for (name, about) in commands {
            out.push_str(&format!("| `{name}` | {} |\n", cell(about)));
        }
        out
    }

    /// The README's connector table (the lines between [`TABLE_START`] and
    /// [`TABLE_END`]).
    pub fn readme_table(&self) -> String {
        let mut out = String::from("| connector | source | sink |\n| --- | --- | --- |\n");
        for name in self.names() {
            let of_kind = |kind| {
                self.of(name)
                    .find(|info| info.kind == kind)
                    .map_or_else(|| "-".to_owned(), |info| format!("`{}`", info.feature))
            };
            out.push_str(&format!(
                "| [{name}](docs/connectors/{name}.md) | {} | {} |\n",
                of_kind(ConnectorKind::Source),
                of_kind(ConnectorKind::Sink)
            ));
        }
        out
    }

    /// The README with its connector table replaced by the generated one;
    /// `None` when the markers are missing.
    pub fn readme(&self, readme: &str) -> Option<String> {
        let start = readme.find(TABLE_START)? + TABLE_START.len();
        let end = start + readme[start..].find(TABLE_END)?;
        Some(format!(
            "{}\n{}{}",
            &readme[..start],
            self.readme_table(),
            &readme[end..]
        ))
    }

    fn of<'s>(&'s self, name: &'s str) -> impl Iterator<Item = &'a ConnectorInfo> + 's {
        self.connectors.iter().filter(move |info| info.name == name)
    }

    fn is_connector_feature(&self, feature: &str) -> bool {
        self.connectors.iter().any(|info| info.feature == feature)
    }

    /// The features a feature turns on by name (not `dep:` or `crate/feature`).
    fn members(&self, feature: &str) -> Vec<&'a str> {
        self.features
            .get(feature)
            .and_then(toml::Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(toml::Value::as_str)
            .filter(|member| self.features.contains_key(*member))
            .collect()
    }

    /// A bundle groups two or more features.
    fn is_bundle(&self, feature: &str) -> bool {
        self.members(feature).len() >= 2
    }

    fn bundles(&self) -> Vec<&'a str> {
        self.features
            .keys()
            .map(String::as_str)
            .filter(|feature| self.is_bundle(feature))
            .collect()
    }

    fn contains(&self, bundle: &str, feature: &str) -> bool {
        self.members(bundle)
            .iter()
            .any(|member| *member == feature || self.contains(member, feature))
    }

    fn bundle_list(&self, feature: &str) -> String {
        let bundles: Vec<String> = self
            .bundles()
            .into_iter()
            .filter(|bundle| self.contains(bundle, feature))
            .map(|bundle| format!("`{bundle}`"))
            .collect();
        if bundles.is_empty() {
            "none (test-only)".to_owned()
        } else {
            bundles.join(", ")
        }
    }
}

/// The relative link targets of a Markdown text (`[text](target)`), outside
/// code blocks and code spans: no URL with a scheme, no `/`-rooted path.
/// A target may end in `#anchor`; a bare `#anchor` is a link into the text.
pub fn relative_links(markdown: &str) -> Vec<String> {
    let mut links = Vec::new();
    map_links(markdown, |target| {
        if is_relative(target) {
            links.push(target.to_owned());
        }
        target.to_owned()
    });
    links
}

fn generated_note(sources: &str) -> String {
    format!("<!-- Generated from {sources} by `{REGENERATE}`: edit those, not this file. -->\n")
}

/// Text for one table cell.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

fn configuration_section(info: &ConnectorInfo) -> String {
    let title = match info.kind {
        ConnectorKind::Source => "Source",
        ConnectorKind::Sink => "Sink",
    };
    let mut out = format!(
        "\n## {title} configuration\n\nThe `[plugin_config]` fields (`iggy-connect describe {kind} {name}` prints \
         the same). The rest of the connector file is described in \
         [docs/configuration.md](../configuration.md#connector-files).\n\n\
         | field | type | default | required | description |\n| --- | --- | --- | --- | --- |\n",
        kind = info.kind,
        name = info.name,
    );
    for field in fields(info) {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            field.name,
            cell(&field.kind),
            field
                .default
                .map_or_else(|| "-".to_owned(), |default| format!("`{default}`")),
            if field.required { "yes" } else { "no" },
            cell(&field.description),
        ));
    }
    if info.kind == ConnectorKind::Source {
        out.push_str(&format!(
            "\nAt the top level of the file, `max_in_flight` (1-{MAX_IN_FLIGHT}, default {DEFAULT_MAX_IN_FLIGHT}) \
             bounds the batches polled and not yet committed, capped by what this source supports, \
             and `max_in_flight_bytes` (default 16MiB) the payload they hold.\n"
        ));
    }
    out.push_str(&format!(
        "\nAn example that `iggy-connect validate` accepts (`iggy-connect describe {} {} --example`):\n\n```toml\n{}```\n",
        info.kind,
        info.name,
        example_file(info)
    ));
    out
}

/// Rewrites the relative links of `markdown`, written to be read at `from`,
/// so that they point to the same files when it is read at `to` (both paths
/// relative to the repository).
fn rebase_links(markdown: &str, from: &str, to: &str) -> String {
    let from_dir = Path::new(from).parent().unwrap_or(Path::new(""));
    let to_dir = Path::new(to).parent().unwrap_or(Path::new(""));
    map_links(markdown, |target| {
        let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
        if !is_relative(target) || path.is_empty() {
            return target.to_owned();
        }
        let moved = relative_to(&normalize(&from_dir.join(path)), to_dir);
        match anchor {
            "" => moved.to_string_lossy().into_owned(),
            anchor => format!("{}#{anchor}", moved.to_string_lossy()),
        }
    })
}

/// The text with the target of every inline link (`[text](target)`) outside
/// fenced code blocks and code spans replaced by what `map` makes of it.
fn map_links(markdown: &str, mut map: impl FnMut(&str) -> String) -> String {
    let mut out = String::with_capacity(markdown.len());
    let mut fenced = false;
    for line in markdown.split_inclusive('\n') {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || line.trim_start().starts_with("```") {
            out.push_str(line);
            continue;
        }
        // Odd pieces between backticks are code spans.
        for (index, piece) in line.split('`').enumerate() {
            if index > 0 {
                out.push('`');
            }
            if index % 2 == 1 {
                out.push_str(piece);
                continue;
            }
            let mut rest = piece;
            while let Some(open) = rest.find("](") {
                let after = &rest[open + 2..];
                let Some(close) = after.find(')') else {
                    break;
                };
                out.push_str(&rest[..open + 2]);
                out.push_str(&map(&after[..close]));
                rest = &after[close..];
            }
            out.push_str(rest);
        }
    }
    out
}

fn is_relative(target: &str) -> bool {
    !(target.is_empty()
        || target.contains("://")
        || target.starts_with("mailto:")
        || target.starts_with('/'))
}

fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// `path` seen from the folder `base` (both relative to the same root).
fn relative_to(path: &Path, base: &Path) -> PathBuf {
    let path: Vec<Component> = path.components().collect();
    let base: Vec<Component> = base.components().collect();
    let common = path
        .iter()
        .zip(&base)
        .take_while(|(left, right)| left == right)
        .count();
    let mut out = PathBuf::new();
    for _ in common..base.len() {
        out.push("..");
    }
    for component in &path[common..] {
        out.push(component);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn given_a_doc_link_when_rebased_to_the_page_should_point_to_the_same_file() {
        let doc = "See [the contract](../../../docs/ARCHITECTURE.md#delivery-contract), \
                   [tests](../../../tests/x.rs), [here](#guarantees), [web](https://iggy.apache.org) \
                   and `[code](../not/a/link)`.\n```\n[fenced](../../x.md)\n```\n";
        let rebased = rebase_links(
            doc,
            "src/connectors/postgres/doc.md",
            "docs/connectors/postgres.md",
        );
        assert!(
            rebased.contains("[the contract](../ARCHITECTURE.md#delivery-contract)"),
            "{rebased}"
        );
        assert!(rebased.contains("[tests](../../tests/x.rs)"), "{rebased}");
        assert!(rebased.contains("[here](#guarantees)"), "{rebased}");
        assert!(
            rebased.contains("[web](https://iggy.apache.org)"),
            "{rebased}"
        );
        assert!(rebased.contains("`[code](../not/a/link)`"), "{rebased}");
        assert!(rebased.contains("[fenced](../../x.md)"), "{rebased}");
    }

    #[test]
    fn given_markdown_when_scanned_should_list_relative_links_outside_code_only() {
        let text = "[a](x.md) [b](https://x.org) [c](#top) `[d](y.md)`\n```toml\n[e](z.md)\n```\n[f](../g.md#h)";
        assert_eq!(relative_links(text), vec!["x.md", "#top", "../g.md#h"]);
    }

    #[test]
    fn given_nested_bundles_when_listed_should_name_every_bundle_holding_the_feature() {
        let features: toml::Table = toml::from_str(
            "default = [\"a-source\", \"b-sink\"]\nall-sources = [\"a-source\", \"c-source\"]\n\
             full = [\"all-sources\", \"b-sink\"]\na-source = []\nb-sink = []\nc-source = [\"dep:x\"]\n\
             d-sink = []\nsolo = [\"c-source\"]\n",
        )
        .unwrap();
        let catalog = Catalog::new(&[], &features);
        assert_eq!(catalog.bundles(), vec!["default", "all-sources", "full"]);
        assert_eq!(
            catalog.bundle_list("a-source"),
            "`default`, `all-sources`, `full`"
        );
        assert_eq!(catalog.bundle_list("c-source"), "`all-sources`, `full`");
        assert_eq!(catalog.bundle_list("d-sink"), "none (test-only)");
    }
}
