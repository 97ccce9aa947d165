//! ARCHITECTURE.md's layering invariant, checked against the source.
//!
//! Why a test: the modules form layers, each using only those before it, and an import that
//! runs back up (a backend reaching into the engine, the service into a door above it) compiles
//! without complaint and is found only by a reader. The layers are read from ARCHITECTURE.md's
//! invariant itself (`a` <- `b`, `c` <- ...: commas join modules of one layer), so the map and the
//! check are one text; every `crate::` path outside comments in `agent/src` is held to it.

use std::collections::BTreeMap;
use std::path::Path;

/// The layer of each module named in ARCHITECTURE.md's invariant (0: `laya-topics`).
fn layers(architecture: &str) -> BTreeMap<String, usize> {
    let start = architecture.find("**Invariant:** the modules form layers").expect("the layering invariant");
    let text = &architecture[start..];
    let text = &text[text.find(':').map_or(0, |i| i + 1)..text.find("\n\n").unwrap_or(text.len())];
    let text = &text[text.find('`').unwrap_or(0)..];
    let mut out = BTreeMap::new();
    for (rank, layer) in text.split("<-").enumerate() {
        for name in layer.split(',') {
            let name = name.trim().trim_end_matches('.').trim_matches('`');
            out.insert(name.replace('-', "_"), rank);
        }
    }
    out
}

/// The top-level module a source file belongs to (`engine/probe.rs`: `engine`).
fn module_of(relative: &Path) -> String {
    let first = relative.components().next().map(|c| c.as_os_str().to_string_lossy().into_owned()).unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The top-level modules a line of code names through `crate::` (`crate::a::b`, `crate::{a, b::c}`).
fn named(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let inside = &group[..group.find('}').unwrap_or(group.len())];
            out.extend(inside.split(',').map(|p| p.trim().split("::").next().unwrap_or("").trim().to_owned()));
        } else {
            out.push(rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect());
        }
    }
    out.retain(|n| !n.is_empty() && n != "self");
    out
}

/// Every `crate::` use in `src` that names a module of a later layer than its own, or a module of
/// the same layer other than its own: `file:line: from -> to`.
fn violations(src: &Path, layers: &BTreeMap<String, usize>) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("readable source").flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let from = module_of(relative);
            // The crate root and the binary wire everything; this file names modules as data.
            let Some(&rank) = layers.get(&from) else { continue };
            let text = std::fs::read_to_string(&path).expect("readable source");
            for (n, line) in text.lines().enumerate() {
                if line.trim_start().starts_with("//") {
                    continue;
                }
                for to in named(line) {
                    let Some(&theirs) = layers.get(&to) else { continue };
                    if to != from && theirs >= rank {
                        out.push(format!("{}:{}: {from} -> {to}", relative.display(), n + 1));
                    }
                }
            }
        }
    }
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR"))
    }

    fn architecture() -> String {
        std::fs::read_to_string(manifest().join("../ARCHITECTURE.md")).expect("ARCHITECTURE.md")
    }

    #[test]
    fn every_module_uses_only_the_layers_before_its_own() {
        let layers = layers(&architecture());
        // Every top-level module of the crate is in the map (else its imports go unchecked).
        let lib = std::fs::read_to_string(manifest().join("src/lib.rs")).expect("lib.rs");
        for line in lib.lines().map(str::trim).filter(|l| l.starts_with("pub mod ")) {
            let name = line.trim_start_matches("pub mod ").trim_end_matches(';');
            assert!(layers.contains_key(name), "ARCHITECTURE.md's layering invariant does not name `{name}`");
        }
        let found = violations(&manifest().join("src"), &layers);
        assert!(found.is_empty(), "imports that run against ARCHITECTURE.md's layers:\n{}", found.join("\n"));
    }

    #[test]
    fn the_check_reads_grouped_paths_and_finds_an_import_running_back_up() {
        assert_eq!(named("use crate::{backend::RowResult, bundle, self};"), ["backend", "bundle"]);
        assert_eq!(named("let x = crate::engine::probe::Thresholds::default(); crate::a"), ["engine", "a"]);
        let layers = layers("**Invariant:** the modules form layers, each\nusing: `a` <- `b`, `c` <-\n`d`.\n\nmore");
        assert_eq!(
            layers.iter().map(|(k, v)| (k.as_str(), *v)).collect::<Vec<_>>(),
            [("a", 0), ("b", 1), ("c", 1), ("d", 2)]
        );
        let dir = std::env::temp_dir().join(format!("laya-layers-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("b")).expect("dir");
        std::fs::write(dir.join("b/x.rs"), "// crate::d in a comment\nuse crate::a;\nuse crate::{d::Y, c};\n")
            .expect("write");
        let found = violations(&dir, &layers);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, ["b/x.rs:3: b -> c", "b/x.rs:3: b -> d"]);
    }
}
