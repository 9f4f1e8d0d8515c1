//! The layer map of `ARCHITECTURE.md`, checked: every `crate::…` path in the non-test code of
//! every file under `src/` names a layer its own layer may import. A file's layer is its
//! top folder or file under `src/` (`src/engine/alloc/rules.rs` is `engine`). From the bottom:
//!
//! - `wire` (data formats both sides read: the Protobuf wire format) imports nothing;
//! - `engine` (pure) imports only `wire`, `kube` (the client) `wire` and `sync`: neither
//!   imports the other; `error`, `clock` and `sync` (the poison-tolerant lock) import
//!   nothing;
//! - `store` is over them; `controller` over `store`; `cli` over `controller`; `commands`
//!   and the binary's `logging` on top.
//!
//! Test code is left out as `purity.rs` leaves it out (everything from a file's first
//! `#[cfg(test)]` line, and files named `tests.rs` or `testutil.rs`): a test may build its
//! inputs with any layer. Comments are left out too; `crate::{a, b::c}` groups are read.

use std::path::Path;

/// Each layer and the layers it stands on directly; it may import those and, through them,
/// everything below them (`sim` is the simulator crate's re-export).
const LAYERS: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("engine", &["wire"]),
    ("kube", &["wire", "sync"]),
    ("error", &[]),
    ("sync", &[]),
    ("clock", &[]),
    ("sim", &[]),
    ("store", &["engine", "kube", "error", "clock"]),
    ("controller", &["store"]),
    ("cli", &["controller", "sim"]),
    ("commands", &["cli"]),
    ("logging", &["cli"]),
];

/// Whether `layer` may import `other`: it is `other`, or stands on it, directly or not.
/// `None` when `layer` is not in the map.
fn may_import(layer: &str, other: &str) -> Option<bool> {
    let (_, on) = LAYERS.iter().find(|(l, _)| *l == layer)?;
    Some(layer == other || on.iter().any(|l| may_import(l, other) == Some(true)))
}

/// The non-test text of a source file: everything before its first `#[cfg(test)]` line.
fn non_test_part(text: &str) -> &str {
    text.find("#[cfg(test)]").map_or(text, |i| &text[..i])
}

/// The top-level modules a line of code names through `crate::`.
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "crate::".len()..];
        // `podalloc_crate::` or `$crate::` are not this crate's paths.
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for part in group[..end].split(',') {
                let name: String = (part.trim().chars())
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push(name);
                }
            }
            continue;
        }
        let name: String = (rest.chars())
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.push(name);
        }
    }
    out
}

/// The imports of `text` (a file of `layer`) against the layers, one line each.
fn violations(layer: &str, file: &str, text: &str) -> Vec<String> {
    if may_import(layer, layer).is_none() {
        return vec![format!("{file}: layer {layer:?} is not in the layer map")];
    }
    let mut found = Vec::new();
    for (n, line) in non_test_part(text).lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        for m in crate_paths(code) {
            if may_import(layer, &m) != Some(true) {
                found.push(format!("{file}:{}: {layer} imports {m}", n + 1));
            }
        }
    }
    found
}

fn visit(dir: &Path, layer: Option<&str>, found: &mut Vec<String>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let path = e.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let stem = name.trim_end_matches(".rs");
        if path.is_dir() {
            visit(&path, Some(layer.unwrap_or(stem)), found);
            continue;
        }
        let top = layer.unwrap_or(stem);
        let test_file = matches!(name.as_str(), "tests.rs" | "testutil.rs");
        if !name.ends_with(".rs") || test_file || matches!(top, "lib" | "main" | "layers") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        found.extend(violations(top, &path.display().to_string(), &text));
    }
}

#[test]
fn every_import_follows_the_layer_map() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut found = Vec::new();
    visit(&dir, None, &mut found);
    assert!(
        found.is_empty(),
        "imports against the layers (see ARCHITECTURE.md):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_check_finds_what_it_looks_for() {
    let text = "use crate::kube::Client;\nuse crate::{wire::protobuf, store::x};\n\
                // crate::cli in a comment\nfn f() { $crate::cli::g(); crate::engine::h(); }\n\
                #[cfg(test)]\nuse crate::controller;";
    assert_eq!(
        violations("engine", "f.rs", text),
        [
            "f.rs:1: engine imports kube",
            "f.rs:2: engine imports store"
        ]
    );
    assert_eq!(violations("commands", "f.rs", text), Vec::<String>::new());
    assert_eq!(violations("wire", "f.rs", "use crate::engine;").len(), 1);
    assert_eq!(violations("multi", "f.rs", "").len(), 1);
    assert_eq!(may_import("commands", "wire"), Some(true));
    assert_eq!(may_import("kube", "engine"), Some(false));
    assert_eq!(may_import("store", "cli"), Some(false));
}
