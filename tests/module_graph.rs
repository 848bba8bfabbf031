//! The crate's modules import each other without cycles: between the
//! top-level modules (`sql` → `shuffle`, never back), and between the files
//! of one module (`cache::key` → `cache::exec`, never back). A cycle means
//! two concerns that cannot be read, tested or moved apart.
//!
//! The top-level modules are also layered ([`LAYERS`]): a module imports
//! only from layers below its own, so `session` cannot reach up into
//! `cluster` (it knows the cluster only through its `ScaleOut` seam) and
//! `cluster` cannot reach into `feed`; the operator toolkit `exec` is a
//! leaf that everything may use.
//!
//! The graph is read from the sources: every `crate::<module>[::<file>]`
//! and (inside a module's file) `super::<file>` path in code, comments and
//! `#[cfg(test)]` modules left out; `crate::<Name>` of a re-export in
//! `lib.rs` (`crate::Session`) counts as the module it comes from. `mod.rs`
//! is its module itself (what a file takes from it is the module's shared
//! core, not another concern).
//!
//! Inside `feed`, the user's options ([`FEED_OPTIONS`]) are read only where
//! they are resolved into the feed's plan ([`FEED_OPTIONS_READERS`]): the
//! producer, the sink and provenance read the plan.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules from the bottom up: each imports only from the
/// layers before its own. A new module must be placed here.
const LAYERS: &[&[&str]] = &[
    &["config", "rand", "exec", "test_util"],
    &["device", "datagen", "shuffle"],
    &["cache"],
    &["sql"],
    &["session"],
    &["cluster"],
    &["feed"],
    &["cli"],
];

/// The type of a feed's options as the user gave them.
const FEED_OPTIONS: &str = "FeedBuilder";

/// The files of `src/feed/` that may name [`FEED_OPTIONS`] in code: where
/// the options are defined and resolved into the plan, and the module root
/// that makes them (`Feed::builder`).
const FEED_OPTIONS_READERS: &[&str] = &["feed/builder.rs", "feed/plan.rs", "feed/mod.rs"];

/// The files under `src/feed/` (as `feed/…`) outside [`FEED_OPTIONS_READERS`]
/// whose code names `FeedBuilder`.
fn feed_option_readers(src: &Path) -> Vec<String> {
    let mut files = vec![];
    rust_files(&src.join("feed"), &mut files);
    let mut readers: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let name = file
                .strip_prefix(src)
                .ok()?
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(file).ok()?;
            (!FEED_OPTIONS_READERS.contains(&name.as_str())
                && code_of(&text).contains(FEED_OPTIONS))
            .then_some(name)
        })
        .collect();
    readers.sort();
    readers
}

/// `Name` → `module` for every `pub use module::{Name, …};` of `lib.rs`.
fn root_reexports(src: &Path) -> BTreeMap<String, String> {
    let lib = std::fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let mut names = BTreeMap::new();
    for line in lib.lines() {
        let Some(rest) = line.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, items)) = rest.trim_end_matches(';').split_once("::") else {
            continue;
        };
        for item in items.trim_matches(|c| c == '{' || c == '}').split(',') {
            names.insert(item.trim().to_string(), module.to_string());
        }
    }
    names
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` → `["a", "b"]`; `src/a/mod.rs` → `["a"]`.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let relative = file.strip_prefix(src).unwrap_or(file).with_extension("");
    let mut parts: Vec<String> = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The code of a file: before its tests, without comment lines.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    text.lines()
        .filter(|line| !line.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first two identifiers of a path (`a::b::c` → `[a, b]`).
fn path_head(path: &str) -> Vec<&str> {
    path.split("::")
        .take(2)
        .map(|part| {
            let part = part.trim_start();
            let end = part
                .find(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                })
                .unwrap_or(part.len());
            &part[..end]
        })
        .collect()
}

/// The identifiers after each `prefix` in `code` (`crate::a::b` → `[a, b]`),
/// each path of a group for a group (`super::{a, b::c}` → `[a]`, `[b, c]`).
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut paths = vec![];
    for (at, _) in code.match_indices(prefix) {
        let rest = &code[at + prefix.len()..];
        let Some(group) = rest.strip_prefix('{') else {
            paths.push(path_head(rest));
            continue;
        };
        // The group's items at its own depth, up to its closing brace.
        let (mut depth, mut start) = (0usize, 0usize);
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    paths.push(path_head(&group[start..i]));
                    break;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    paths.push(path_head(&group[start..i]));
                    start = i + 1;
                }
                _ => {}
            }
        }
    }
    paths
}

fn graph(src: &Path) -> Graph {
    let mut files = vec![];
    rust_files(src, &mut files);
    let is_file_of = |module: &str, name: &str| {
        src.join(module).join(format!("{name}.rs")).exists()
            || src.join(module).join(name).is_dir()
    };
    let reexports = root_reexports(src);
    let mut edges = Graph::new();
    for file in &files {
        let module = module_of(src, file);
        let Some(top) = module.first().cloned() else {
            continue;
        };
        if top == "lib" || top == "main" {
            continue;
        }
        let node = match module.get(1) {
            Some(sub) => format!("{top}::{sub}"),
            None => top.clone(),
        };
        let code = code_of(&std::fs::read_to_string(file).unwrap_or_default());
        for (name, module) in &reexports {
            if module != &top && code.contains(&format!("crate::{name}")) {
                edges.entry(top.clone()).or_default().insert(module.clone());
            }
        }
        for path in paths_after(&code, "crate::") {
            match path.as_slice() {
                [other, ..] if !other.is_empty() && *other != top => {
                    edges
                        .entry(top.clone())
                        .or_default()
                        .insert(other.to_string());
                }
                [same, sub]
                    if *same == top && module.len() > 1 && is_file_of(&top, sub) =>
                {
                    let target = format!("{top}::{sub}");
                    if target != node {
                        edges.entry(node.clone()).or_default().insert(target);
                    }
                }
                _ => {}
            }
        }
        if module.len() > 1 {
            for path in paths_after(&code, "super::") {
                if let Some(sub) = path.first().filter(|s| is_file_of(&top, s)) {
                    let target = format!("{top}::{sub}");
                    if target != node {
                        edges.entry(node.clone()).or_default().insert(target);
                    }
                }
            }
        }
    }
    edges
}

/// A cycle of `edges` among nodes for which `keep` holds, as a path.
fn cycle(edges: &Graph, keep: impl Fn(&str) -> bool) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        edges: &Graph,
        keep: &dyn Fn(&str) -> bool,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), true);
        stack.push(node.to_string());
        for next in edges.get(node).into_iter().flatten().filter(|n| keep(n)) {
            match state.get(next.as_str()) {
                Some(true) => {
                    let from = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut path = stack[from..].to_vec();
                    path.push(next.clone());
                    return Some(path);
                }
                Some(false) => {}
                None => {
                    if let Some(path) = visit(next, edges, keep, state, stack) {
                        return Some(path);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), false);
        None
    }
    let mut state = BTreeMap::new();
    for node in edges.keys().filter(|n| keep(n)) {
        if !state.contains_key(node.as_str())
            && let Some(path) = visit(node, edges, &keep, &mut state, &mut vec![])
        {
            return Some(path);
        }
    }
    None
}

#[test]
fn modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    assert!(
        edges.len() > 10,
        "read too little of the sources: {edges:?}"
    );
    // Known edges, so that a broken reader cannot pass by seeing nothing.
    assert!(edges["sql"].contains("shuffle"), "{edges:?}");
    assert!(edges["cache::key"].contains("cache::exec"), "{edges:?}");
    // Only through a group (`use super::{…, mixture, …}`).
    assert!(
        edges["feed::builder"].contains("feed::mixture"),
        "{edges:?}"
    );
    if let Some(path) = cycle(&edges, |n| !n.contains("::")) {
        panic!(
            "top-level modules import each other in a cycle: {}",
            path.join(" → ")
        );
    }
    let tops: BTreeSet<&str> = edges
        .keys()
        .filter_map(|n| n.split_once("::"))
        .map(|(t, _)| t)
        .collect();
    for top in tops {
        let prefix = format!("{top}::");
        if let Some(path) = cycle(&edges, |n| n.starts_with(&prefix)) {
            panic!(
                "files of `{top}` import each other in a cycle: {}",
                path.join(" → ")
            );
        }
    }
}

/// The edges between top-level modules that do not go down [`LAYERS`],
/// and the modules it does not place.
fn upward_arrows(edges: &Graph) -> Vec<String> {
    let layer = |module: &str| LAYERS.iter().position(|layer| layer.contains(&module));
    let mut wrong = vec![];
    for (from, targets) in edges.iter().filter(|(n, _)| !n.contains("::")) {
        for to in targets {
            match (layer(from), layer(to)) {
                (Some(a), Some(b)) if b < a => {}
                (Some(_), Some(_)) => wrong.push(format!("{from} → {to}")),
                (None, _) => wrong.push(format!("{from} is in no layer")),
                (_, None) => wrong.push(format!("{to} is in no layer")),
            }
        }
    }
    wrong.dedup();
    wrong
}

#[test]
fn modules_import_only_from_the_layers_below_theirs() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = graph(&src);
    // Known edges, one through a re-export of lib.rs.
    assert!(edges["cluster"].contains("session"), "{edges:?}");
    assert!(edges["feed"].contains("device"), "{edges:?}");
    let wrong = upward_arrows(&edges);
    assert!(
        wrong.is_empty(),
        "imports that do not go down the layers of LAYERS: {}",
        wrong.join(", ")
    );
}

#[test]
fn an_upward_arrow_is_found() {
    let mut edges = Graph::new();
    for (a, b) in [
        ("feed", "session"),
        ("session", "cluster"),
        ("cli", "novel"),
    ] {
        edges.entry(a.into()).or_default().insert(b.into());
    }
    assert_eq!(
        upward_arrows(&edges),
        ["novel is in no layer", "session → cluster"]
    );
}

#[test]
fn a_cycle_is_found() {
    let mut edges = Graph::new();
    for (a, b) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        edges.entry(a.into()).or_default().insert(b.into());
    }
    assert_eq!(
        cycle(&edges, |_| true),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    assert_eq!(cycle(&edges, |n| n != "c"), None);
}

#[test]
fn only_the_plan_reads_a_feeds_options() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    assert!(src.join("feed/plan.rs").exists(), "the feed's plan moved");
    let readers = feed_option_readers(&src);
    assert!(
        readers.is_empty(),
        "files under src/feed/ that read the user's options ({FEED_OPTIONS}) instead of the \
         resolved FeedPlan: {}",
        readers.join(", ")
    );
}

#[test]
fn a_reader_of_a_feeds_options_is_found() {
    let dir = tempfile::tempdir().expect("tempdir");
    let feed = dir.path().join("feed");
    std::fs::create_dir_all(&feed).expect("feed folder");
    let write =
        |name: &str, text: &str| std::fs::write(feed.join(name), text).expect("write");
    write("plan.rs", "fn resolve(b: FeedBuilder) {}");
    write(
        "sink.rs",
        "// docs may name FeedBuilder\nfn cut(b: &FeedBuilder) {}",
    );
    write(
        "batcher.rs",
        "/// FeedBuilder in a doc comment only\nfn push() {}",
    );
    assert_eq!(feed_option_readers(dir.path()), ["feed/sink.rs"]);
}
