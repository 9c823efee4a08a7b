//! The layering test: every module of the control plane imports only the layers below its own
//! (lib.rs lists them), so the executor never reaches up into the HTTP API and the domain never
//! returns an HTTP type.

use std::path::{Path, PathBuf};

/// The layers, highest first; a module may use the ones after its own.
const LAYERS: &[&str] = &["http", "admission", "exec", "resources", "learn", "store"];

/// What every layer may use.
const SHARED: &[&str] = &["clock", "metrics"];

/// What puts the layers together and may use any of them.
const ROOT: &[&str] = &["lib", "main", "server", "config"];

/// The top-level module a file of `src/` belongs to (`exec/threads.rs` → `exec`).
fn module_of(rel: &Path) -> String {
    let first = rel.components().next().expect("a path under src");
    let name = first.as_os_str().to_string_lossy();
    name.strip_suffix(".rs").unwrap_or(&name).to_owned()
}

/// The top-level modules `code` names through `crate::`, outside comments.
fn uses(code: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let code_part = line.split("//").next().unwrap_or("");
        let mut rest = code_part;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // `crate::{a, b}` names several: each is checked.
            if name.is_empty() && after.starts_with('{') {
                let list = after[1..].split('}').next().unwrap_or("");
                for item in list.split(',') {
                    let item: String = item
                        .trim()
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    if !item.is_empty() {
                        found.push((n + 1, item));
                    }
                }
            } else if !name.is_empty() {
                found.push((n + 1, name));
            }
            rest = after;
        }
    }
    found
}

/// Why module `from` may not use module `to`, or `None` when it may.
fn violation(from: &str, to: &str) -> Option<String> {
    if from == to || ROOT.contains(&from) || SHARED.contains(&to) {
        return None;
    }
    // Items re-exported at the crate root are the root's: name their module instead.
    if ROOT.contains(&to) && to != "config" {
        return Some(format!(
            "{from} uses the crate root (`crate::{to}`): name the module"
        ));
    }
    if SHARED.contains(&from) {
        return Some(format!("{from} serves every layer and uses none ({to})"));
    }
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    match (rank(from), rank(to)) {
        (Some(f), Some(t)) if t > f => None,
        (Some(_), Some(_)) => Some(format!("{from} is below {to} and must not use it")),
        (Some(_), None) if to == "config" => {
            Some(format!("{from} uses config: pass what it needs down"))
        }
        // Anything else `crate::` names is a type re-exported at the root, e.g.
        // `crate::ApiError`: the same as using its module, which the root hides.
        (Some(_), None) => Some(format!("{from} uses `crate::{to}`: name its module")),
        (None, _) => Some(format!(
            "{from} is in no layer: add it to LAYERS, SHARED or ROOT"
        )),
    }
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_module_uses_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    assert!(files.len() > 20, "the sources were found: {files:?}");
    let mut wrong = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&src).expect("under src").to_path_buf();
        let from = module_of(&rel);
        // The layering test names every layer.
        if from == "layers" {
            continue;
        }
        let code = std::fs::read_to_string(&file).expect("read a source");
        for (line, to) in uses(&code) {
            if let Some(why) = violation(&from, &to) {
                wrong.push(format!("{}:{line}: {why}", rel.display()));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports against the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_check_finds_an_import_against_the_layers() {
    let code = "use crate::http::api::ControlState;\n// crate::http in a comment\nuse crate::{store, http};\n";
    let found = uses(code);
    assert_eq!(
        found,
        vec![(1, "http".into()), (3, "store".into()), (3, "http".into())]
    );
    assert!(violation("exec", "http").is_some(), "exec below http");
    assert!(violation("store", "learn").is_some(), "store is the bottom");
    assert!(violation("learn", "resources").is_some());
    assert!(violation("exec", "ApiError").is_some(), "a root re-export");
    assert!(violation("exec", "config").is_some());
    assert_eq!(violation("http", "exec"), None);
    assert_eq!(violation("admission", "store"), None);
    assert_eq!(violation("exec", "metrics"), None);
    assert_eq!(violation("server", "http"), None);
    assert!(violation("metrics", "exec").is_some());
}
