//! `sonic-core` does no I/O: nothing it depends on, directly or transitively, is an async runtime,
//! an HTTP stack, a cloud SDK or a container client. Read from `Cargo.lock`, which lists every
//! dependency the workspace can activate (a superset of what sonic-core builds with).

use std::collections::{BTreeMap, BTreeSet};

const FORBIDDEN: &[&str] = &[
    "tokio",
    "axum",
    "hyper",
    "reqwest",
    "bollard",
    "rusqlite",
    "mio",
    "socket2",
    "async-std",
];
const FORBIDDEN_PREFIXES: &[&str] = &["aws-", "tower"];

/// name -> dependency names, from the lock file's `[[package]]` blocks.
fn lock_graph(text: &str) -> BTreeMap<String, Vec<String>> {
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for block in text.split("[[package]]").skip(1) {
        let name = block
            .lines()
            .find_map(|l| l.strip_prefix("name = "))
            .map(|n| n.trim_matches('"').to_owned())
            .expect("package without a name");
        let mut deps = Vec::new();
        if let Some(start) = block.find("dependencies = [") {
            let rest = &block[start + "dependencies = [".len()..];
            let end = rest.find(']').expect("unterminated dependency list");
            for item in rest[..end].split(',') {
                let item = item.trim().trim_matches('"');
                if let Some(dep) = item.split_whitespace().next() {
                    deps.push(dep.to_owned());
                }
            }
        }
        graph.entry(name).or_default().extend(deps);
    }
    graph
}

fn closure(graph: &BTreeMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.to_owned()];
    while let Some(n) = stack.pop() {
        if seen.insert(n.clone()) {
            stack.extend(graph.get(&n).into_iter().flatten().cloned());
        }
    }
    seen
}

#[test]
fn sonic_core_depends_on_no_io_crate() {
    let lock = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.lock");
    let text = std::fs::read_to_string(&lock).expect("read Cargo.lock");
    let graph = lock_graph(&text);
    let deps = closure(&graph, "sonic-core");
    assert!(
        deps.contains("serde"),
        "the lock graph was not read: {deps:?}"
    );
    let bad: Vec<&String> = deps
        .iter()
        .filter(|d| {
            FORBIDDEN.contains(&d.as_str()) || FORBIDDEN_PREFIXES.iter().any(|p| d.starts_with(p))
        })
        .collect();
    assert!(bad.is_empty(), "sonic-core pulls in I/O crates: {bad:?}");
    // And the check itself can fail: the agent does depend on them.
    let agent = closure(&graph, "sonic-agent");
    assert!(agent.contains("tokio") && agent.contains("bollard"));
}
