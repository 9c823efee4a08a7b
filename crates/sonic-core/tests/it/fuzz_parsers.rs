//! Fuzzing the three YAML readers (DAG files, parameter files, catalogs) and the unit parsers with
//! proptest: arbitrary bytes, YAML-shaped noise, and structured mutations of valid files (and of
//! the bad-DAG corpus). None may panic; what is accepted must hold the checked types' invariants;
//! what is refused must say where.
//!
//! CI runs the default 256 cases per property (a few seconds). For a long run:
//! `PROPTEST_CASES=1000000 cargo test --release -p sonic-core --test it -- fuzz_parsers::`
//! (docs/security.md has the counts measured so far).

use std::sync::OnceLock;

use proptest::prelude::*;
use proptest::sample::Index;
use sonic_core::catalog::Catalog;
use sonic_core::dag::{self, Dag};
use sonic_core::params::Params;
use sonic_core::units::{ByteSize, Seconds};

/// Valid files to mutate, by reader.
fn dag_seeds() -> &'static [String] {
    static SEEDS: OnceLock<Vec<String>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let mut seeds: Vec<String> = [
            include_str!("../../../../dags/ml-pipeline.yaml"),
            include_str!("../../../../dags/mapreduce-sort.yaml"),
            include_str!("../../../../dags/video-analytics.yaml"),
            include_str!("../../../../dags/synthetic-chain.yaml"),
            include_str!("../../../../tests/fixtures/plan/lightgbm.dag.yaml"),
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        // The bad corpus too: mutations of a refused file probe the error paths.
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/bad-dags");
        let mut bad: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
            .unwrap_or_default();
        bad.sort();
        for p in bad {
            if p.extension().is_some_and(|e| e == "yaml")
                && let Ok(bytes) = std::fs::read(&p)
            {
                seeds.push(String::from_utf8_lossy(&bytes).into_owned());
            }
        }
        seeds
    })
}

const PARAMS_SEEDS: &[&str] = &[
    include_str!("../../../../tests/fixtures/plan/lightgbm-k1.params.yaml"),
    include_str!("../../../../tests/fixtures/plan/lightgbm-k3.params.yaml"),
    include_str!("../../../../tests/fixtures/plan/lightgbm-k12.params.yaml"),
];

const CATALOG_SEEDS: &[&str] = &[
    include_str!("../../../../deploy/catalog.yaml"),
    include_str!("../../../../tests/fixtures/plan/catalog-750.yaml"),
    include_str!("../../../../tests/fixtures/plan/catalog-fast.yaml"),
];

/// Pieces of YAML and of hostile input that mutations splice in.
const TOKENS: &[&str] = &[
    "&a ",
    "*a",
    "<<: *a\n",
    "{{ params.trees }}",
    "{{ params.",
    "- ",
    ": ",
    "\n",
    "\n  ",
    "\n    - ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "~",
    "null",
    "true",
    "0",
    "-1",
    "1.5",
    "1e999",
    ".nan",
    "-.inf",
    "0x1F",
    "99999999999999999999",
    "18446744073709551616",
    "\"",
    "'",
    "\\",
    "\t",
    "# ",
    "!!str ",
    "!!binary ",
    "!custom ",
    "!!python/object:os.system ",
    "---\n",
    "...\n",
    "? ",
    "|\n  ",
    ">-\n  ",
    "%YAML 1.2\n---\n",
    "\u{feff}",
    "\u{202e}",
    "\u{200b}",
    "é",
    "\u{0}",
    "\u{1b}[31m",
    "\r\n",
    "../",
    "'; DROP TABLE dags; --",
    "name: x\n",
    "functions: []\n",
    "edges:\n  - { from: a, to: b, kind: one }\n",
    "instances: 3",
    "instances: 0",
    "kind: gather",
    "kind: scatter",
    "kind: shuffle",
    "kind: broadcast",
    "timeout: 1ms",
    "timeout: 25h",
    "params:\n  k: 1\n",
    "image: ",
    "command: [",
    "bytes: 5GB",
    "bytes: 5 parsecs",
    "memory_mb: ",
    "vcpus: ",
    "usd_per_hour: -",
    "reserve_mb: 99999999",
];

/// One edit of a file.
#[derive(Debug, Clone)]
enum Mutation {
    Delete(Index, usize),
    Insert(Index, Index),
    DuplicateLine(Index),
    SwapLines(Index, Index),
    DeleteLine(Index),
    SetByte(Index, u8),
    Indent(Index, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<Index>(), 1usize..16).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, t)| Mutation::Insert(i, t)),
        any::<Index>().prop_map(Mutation::DuplicateLine),
        (any::<Index>(), any::<Index>()).prop_map(|(a, b)| Mutation::SwapLines(a, b)),
        any::<Index>().prop_map(Mutation::DeleteLine),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Mutation::SetByte(i, b)),
        (any::<Index>(), 0usize..6).prop_map(|(i, n)| Mutation::Indent(i, n)),
    ]
}

/// Applies the edits to `seed`'s bytes; the result is read as the API would after a lossy decode.
fn mutate(seed: &str, edits: &[Mutation]) -> String {
    let mut b = seed.as_bytes().to_vec();
    for m in edits {
        match m {
            Mutation::Delete(at, n) if !b.is_empty() => {
                let start = at.index(b.len());
                let end = (start + n).min(b.len());
                b.drain(start..end);
            }
            Mutation::Insert(at, token) => {
                let pos = at.index(b.len() + 1);
                let t = TOKENS[token.index(TOKENS.len())].as_bytes();
                b.splice(pos..pos, t.iter().copied());
            }
            Mutation::DuplicateLine(i)
            | Mutation::DeleteLine(i)
            | Mutation::SwapLines(i, _)
            | Mutation::Indent(i, _) => {
                let mut lines: Vec<Vec<u8>> =
                    b.split(|&c| c == b'\n').map(<[u8]>::to_vec).collect();
                let k = i.index(lines.len());
                match m {
                    Mutation::DuplicateLine(_) => {
                        let line = lines[k].clone();
                        lines.insert(k, line);
                    }
                    Mutation::DeleteLine(_) if lines.len() > 1 => {
                        lines.remove(k);
                    }
                    Mutation::SwapLines(_, j) => {
                        let j = j.index(lines.len());
                        lines.swap(k, j);
                    }
                    Mutation::Indent(_, n) => {
                        let mut line = vec![b' '; *n];
                        line.extend_from_slice(lines[k].trim_ascii_start());
                        lines[k] = line;
                    }
                    _ => {}
                }
                b = lines.join(&b'\n');
            }
            Mutation::SetByte(at, byte) if !b.is_empty() => {
                let k = at.index(b.len());
                b[k] = *byte;
            }
            _ => {}
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// What every accepted DAG holds, and what every refusal says.
fn check_dag(text: &str) -> Result<(), TestCaseError> {
    match Dag::from_yaml("fuzz.yaml", text) {
        Ok(d) => {
            prop_assert!(dag::valid_dag_name(&d.name), "name {:?}", d.name);
            prop_assert!(!d.functions.is_empty() && d.functions.len() <= dag::MAX_FUNCTIONS);
            let mut names = std::collections::BTreeSet::new();
            for f in &d.functions {
                prop_assert!(dag::valid_function_name(&f.name), "function {:?}", f.name);
                prop_assert!(!dag::RESERVED_NAMES.contains(&f.name.as_str()));
                prop_assert!(names.insert(f.name.clone()), "duplicate {:?}", f.name);
                prop_assert!(dag::valid_image(&f.image), "image {:?}", f.image);
                prop_assert!(!f.command.is_empty() && f.command.len() <= dag::MAX_COMMAND_ARGS);
                prop_assert!(f.command.iter().all(|w| !w.contains('\0')));
                prop_assert!(f.timeout_s > 0.0 && f.timeout_s <= 86_400.0);
            }
            for e in &d.edges {
                prop_assert!(e.from < e.to && e.to < d.functions.len(), "edge {:?}", e);
            }
            prop_assert!(d.fanouts(&d.params).is_ok(), "default fanouts refused");
            prop_assert!(d.description.len() <= dag::MAX_TEXT_BYTES);
        }
        Err(e) => {
            prop_assert_eq!(e.file.as_str(), "fuzz.yaml");
            let shown = e.to_string();
            prop_assert!(shown.starts_with("fuzz.yaml"), "{}", shown);
            prop_assert_eq!(e.line.is_some(), e.column.is_some());
            if let Some(line) = e.line {
                // YAML breaks lines at CR too (a lone `\r`, as `\r\n` and `\n`), where
                // `str::lines` does not: count both ways and allow the larger.
                let breaks = text
                    .replace("\r\n", "\n")
                    .chars()
                    .filter(|&c| c == '\n' || c == '\r')
                    .count();
                let lines = text.lines().count().max(breaks) as u32 + 1;
                prop_assert!(line >= 1 && line <= lines, "line {} of {}", line, lines);
            }
            prop_assert!(!e.message.is_empty());
        }
    }
    Ok(())
}

fn check_params(text: &str) -> Result<(), TestCaseError> {
    if let Ok(p) = Params::from_yaml(text) {
        prop_assert!(p.check().is_ok());
        let again = p.to_yaml().map(|y| Params::from_yaml(&y));
        prop_assert!(
            matches!(&again, Ok(Ok(q)) if *q == p),
            "does not round-trip: {:?}",
            again
        );
    }
    Ok(())
}

fn check_catalog(text: &str) -> Result<(), TestCaseError> {
    if let Ok(c) = Catalog::from_yaml(text) {
        prop_assert!(c.check().is_ok());
        let again = c.to_yaml().map(|y| Catalog::from_yaml(&y));
        prop_assert!(
            matches!(&again, Ok(Ok(d)) if *d == c),
            "does not round-trip: {:?}",
            again
        );
    }
    Ok(())
}

/// YAML-shaped noise: the characters that steer the YAML scanner, in any order.
const YAMLISH: &str = "[a-z0-9_: \\-\\[\\]{},#&*!|>'\"\n\t.~%@`?]{0,300}";

/// Found by the fuzzing below in CI (2026-12-02): lone CRs are YAML line breaks, so the
/// parser's error may name line 3 of `"\r\r\0"`.
#[test]
fn dag_parser_counts_lone_carriage_returns_as_lines() {
    check_dag(&String::from_utf8_lossy(&[13, 13, 0])).expect("an error on a line it has");
}

proptest! {
    #[test]
    fn dag_parser_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check_dag(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn dag_parser_on_yaml_noise(text in YAMLISH) {
        check_dag(&text)?;
    }

    #[test]
    fn dag_parser_on_mutated_files(
        seed in any::<Index>(),
        edits in proptest::collection::vec(mutation(), 1..8),
    ) {
        let seeds = dag_seeds();
        check_dag(&mutate(&seeds[seed.index(seeds.len())], &edits))?;
    }

    #[test]
    fn params_parser_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check_params(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn params_parser_on_mutated_files(
        seed in any::<Index>(),
        edits in proptest::collection::vec(mutation(), 1..8),
    ) {
        check_params(&mutate(PARAMS_SEEDS[seed.index(PARAMS_SEEDS.len())], &edits))?;
    }

    #[test]
    fn catalog_parser_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        check_catalog(&String::from_utf8_lossy(&bytes))?;
    }

    #[test]
    fn catalog_parser_on_mutated_files(
        seed in any::<Index>(),
        edits in proptest::collection::vec(mutation(), 1..8),
    ) {
        check_catalog(&mutate(CATALOG_SEEDS[seed.index(CATALOG_SEEDS.len())], &edits))?;
    }

    #[test]
    fn unit_parsers_never_panic(text in "[0-9._ eE+-]{0,12}(B|KB|kB|MB|GB|TB|KiB|MiB|GiB|TiB|ms|s|m|h|x|)?") {
        if let Ok(s) = text.parse::<Seconds>() {
            prop_assert!(s.0.is_finite() && s.0 >= 0.0, "{} -> {}", text, s.0);
        }
        let _ = text.parse::<ByteSize>();
    }
}
