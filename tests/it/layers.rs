//! The crate's structure: no import circles between files, and each file
//! imports only from its own layer and the layers below, as the list in
//! `src/lib.rs` states.
//!
//! Imports are read from the source text: every `use crate::…` / `use
//! super::…` tree and every `crate::…` path in the code, each resolved to the
//! file of the deepest module it names. Unit tests (`#[cfg(test)] mod tests`)
//! are left out, and so are a module's imports of its own submodules (the
//! `pub use` facade of a `mod.rs`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use regex::Regex;

/// Every file of the library under `src/`, by module path (`crate::a::b`).
fn modules(src: &Path) -> BTreeMap<String, PathBuf> {
    let mut modules = BTreeMap::new();
    let mut pending = vec![src.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(src).unwrap().with_extension("");
                let mut parts: Vec<String> = relative
                    .components()
                    .map(|part| part.as_os_str().to_string_lossy().into_owned())
                    .collect();
                match parts.last().map(String::as_str) {
                    // The binary's root, and unit tests kept in a file of their own.
                    Some("main" | "tests") => continue,
                    Some("lib") | Some("mod") => {
                        parts.pop();
                    }
                    _ => {}
                }
                let module = std::iter::once("crate".to_owned())
                    .chain(parts)
                    .collect::<Vec<_>>();
                modules.insert(module.join("::"), path);
            }
        }
    }
    modules
}

/// The code of a file without its unit tests and comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &text[..tests],
        None => &text,
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a `use` tree (`a::{b, c::{d, self}}`) into whole paths.
fn expand(prefix: &str, tree: &str, out: &mut Vec<String>) {
    let tree = tree.trim();
    match tree.find('{') {
        Some(open) if tree.ends_with('}') => {
            let head = tree[..open].trim_end_matches("::");
            let base = join(prefix, head);
            let inner = &tree[open + 1..tree.len() - 1];
            let mut depth = 0;
            let mut start = 0;
            for (index, character) in inner.char_indices() {
                match character {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        expand(&base, &inner[start..index], out);
                        start = index + 1;
                    }
                    _ => {}
                }
            }
            expand(&base, &inner[start..], out);
        }
        _ => {
            let tree = tree.split(" as ").next().unwrap_or_default().trim();
            if !tree.is_empty() {
                out.push(join(prefix, tree.trim_end_matches("::self")));
            }
        }
    }
}

fn join(prefix: &str, tail: &str) -> String {
    match (prefix.is_empty(), tail == "self" || tail.is_empty()) {
        (true, _) => tail.to_owned(),
        (false, true) => prefix.to_owned(),
        (false, false) => format!("{prefix}::{tail}"),
    }
}

/// The module paths a file names, made absolute (`super::` resolved).
fn imports(module: &str, code: &str) -> Vec<String> {
    let use_statement = Regex::new(r"(?s)\buse\s+((?:crate|super)\b[^;]*);").unwrap();
    let inline = Regex::new(r"\bcrate(?:::[A-Za-z_][A-Za-z0-9_]*)+").unwrap();
    let parent = |module: &str| {
        module
            .rsplit_once("::")
            .map_or("crate".to_owned(), |(parent, _)| parent.to_owned())
    };
    let mut paths = Vec::new();
    for statement in use_statement.captures_iter(code) {
        let mut expanded = Vec::new();
        expand(
            "",
            &statement[1]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" "),
            &mut expanded,
        );
        for path in expanded {
            let mut current = module.to_owned();
            let mut rest = path.as_str();
            while let Some(tail) = rest
                .strip_prefix("super::")
                .or_else(|| (rest == "super").then_some(""))
            {
                current = parent(&current);
                rest = tail;
            }
            paths.push(if path.starts_with("crate") {
                path.clone()
            } else {
                join(&current, rest)
            });
        }
    }
    paths.extend(
        inline
            .find_iter(code)
            .map(|found| found.as_str().to_owned()),
    );
    paths
}

/// The file of the deepest module `path` names.
fn resolve<'a>(path: &str, modules: &'a BTreeMap<String, PathBuf>) -> Option<&'a String> {
    let mut candidate = path;
    loop {
        if let Some((module, _)) = modules.get_key_value(candidate) {
            return Some(module);
        }
        candidate = candidate.rsplit_once("::")?.0;
    }
}

/// Module -> the modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let modules = modules(src);
    modules
        .iter()
        .map(|(module, path)| {
            let targets = imports(module, &code(path))
                .iter()
                .filter_map(|path| resolve(path, &modules))
                .filter(|target| *target != module && !target.starts_with(&format!("{module}::")))
                .cloned()
                .collect();
            (module.clone(), targets)
        })
        .collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Search<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        found: Vec<Vec<String>>,
    }
    impl<'a> Search<'a> {
        fn visit(&mut self, node: &'a str) {
            let index = self.index.len();
            self.index.insert(node, index);
            self.low.insert(node, index);
            self.stack.push(node);
            self.on_stack.insert(node);
            for next in self.graph.get(node).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node, low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut component = Vec::new();
                while let Some(member) = self.stack.pop() {
                    self.on_stack.remove(member);
                    component.push(member.to_owned());
                    if member == node {
                        break;
                    }
                }
                if component.len() > 1 {
                    component.sort();
                    self.found.push(component);
                }
            }
        }
    }
    let mut search = Search {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !search.index.contains_key(node.as_str()) {
            search.visit(node);
        }
    }
    search.found
}

/// The layers `src/lib.rs` states, bottom first: lines `//! N. `a`, `b::c``.
fn layers(lib: &str) -> Vec<Vec<String>> {
    let line = Regex::new(r"^//! *\d+\. (.*)$").unwrap();
    let name = Regex::new(r"`([a-z0-9_:*]+)`").unwrap();
    lib.lines()
        .filter_map(|text| line.captures(text))
        .map(|captures| {
            name.captures_iter(&captures[1])
                .map(|module| format!("crate::{}", &module[1]))
                .collect()
        })
        .collect()
}

/// The layer of `module`: that of the longest listed name it is or is under
/// (`a::*` stands for what is under `a`: longer than `a`, shorter than `a::x`).
fn layer_of(module: &str, layers: &[Vec<String>]) -> Option<usize> {
    layers
        .iter()
        .enumerate()
        .flat_map(|(layer, names)| names.iter().map(move |name| (layer, name.as_str())))
        .filter(|(_, name)| match name.strip_suffix("*") {
            Some(parent) => module.starts_with(parent),
            None => module == *name || module.starts_with(&format!("{name}::")),
        })
        .max_by_key(|(_, name)| name.trim_end_matches('*').len())
        .map(|(layer, _)| layer)
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let circles = circles(&graph(&src()));
    assert!(
        circles.is_empty(),
        "import circles (move what both sides need into a file of its own):\n{}",
        circles
            .iter()
            .map(|circle| circle.join(" <-> "))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

#[test]
fn each_file_imports_only_from_its_layer_and_below_as_lib_rs_states() {
    let layers = layers(&std::fs::read_to_string(src().join("lib.rs")).unwrap());
    assert!(layers.len() > 3, "src/lib.rs lists no layers: {layers:?}");
    let mut wrong = Vec::new();
    for (module, targets) in graph(&src()) {
        if module == "crate" {
            continue;
        }
        let Some(layer) = layer_of(&module, &layers) else {
            wrong.push(format!("{module} is in no layer of src/lib.rs"));
            continue;
        };
        for target in targets.iter().filter(|target| *target != "crate") {
            match layer_of(target, &layers) {
                Some(target_layer) if target_layer <= layer => {}
                Some(target_layer) => wrong.push(format!(
                    "{module} (layer {}) imports {target} (layer {})",
                    layer + 1,
                    target_layer + 1
                )),
                None => wrong.push(format!("{target} is in no layer of src/lib.rs")),
            }
        }
    }
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn a_circle_and_an_upward_import_are_found() {
    // The checks themselves, on a made-up graph and layer list.
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("crate::a", vec!["crate::b"]),
        ("crate::b", vec!["crate::c"]),
        ("crate::c", vec!["crate::a"]),
        ("crate::d", vec!["crate::a"]),
    ]
    .into_iter()
    .map(|(module, targets)| {
        (
            module.to_owned(),
            targets.into_iter().map(str::to_owned).collect(),
        )
    })
    .collect();
    assert_eq!(
        circles(&graph),
        vec![vec!["crate::a", "crate::b", "crate::c"]]
    );
    let layers = layers("//! 1. `a`, `a::y`\n//! 2. `a::x`, `b`\n//! 3. `a::*`\n");
    assert_eq!(layer_of("crate::a::x::y", &layers), Some(1));
    assert_eq!(layer_of("crate::a", &layers), Some(0));
    assert_eq!(layer_of("crate::a::y", &layers), Some(0));
    assert_eq!(layer_of("crate::a::z", &layers), Some(2));
    let mut paths = Vec::new();
    expand("", "crate::x::{a, b::{c, self}, d as e}", &mut paths);
    assert_eq!(
        paths,
        [
            "crate::x::a",
            "crate::x::b::c",
            "crate::x::b",
            "crate::x::d"
        ]
    );
    assert_eq!(
        imports("crate::p::q", "use super::r::S;\nfn f() { crate::t::u(); }"),
        ["crate::p::r::S", "crate::t::u"]
    );
}
