//! The corpus of invalid DAG files (`tests/fixtures/bad-dags/`): every file is refused, never
//! accepted and never a panic, with an error that names the file, the place and the field listed
//! for it in `expect.txt`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use sonic_core::dag::Dag;

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/bad-dags")
}

/// One line of `expect.txt`.
#[derive(Debug)]
struct Expect {
    /// The error's field; empty for none.
    field: String,
    /// Line and column, when the error must have them.
    place: Option<(u32, u32)>,
    fragment: String,
}

fn read_index() -> BTreeMap<String, Expect> {
    let text = std::fs::read_to_string(corpus_dir().join("expect.txt")).expect("read expect.txt");
    let mut out = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let cols: Vec<&str> = line.splitn(4, '|').map(str::trim).collect();
        assert_eq!(cols.len(), 4, "expect.txt line {}: {line:?}", n + 1);
        let field = if cols[1] == "-" { "" } else { cols[1] };
        let place = match cols[2] {
            "-" => None,
            lc => {
                let (l, c) = lc.split_once(':').expect("line:column");
                Some((
                    l.parse().expect("line number"),
                    c.parse().expect("column number"),
                ))
            }
        };
        let previous = out.insert(
            cols[0].to_owned(),
            Expect {
                field: field.to_owned(),
                place,
                fragment: cols[3].to_owned(),
            },
        );
        assert!(previous.is_none(), "{} is listed twice", cols[0]);
    }
    out
}

fn corpus_files() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(corpus_dir())
        .expect("read the corpus folder")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    names
}

/// The text the API would hand the parser. The control plane refuses a body that is not UTF-8
/// before parsing; here such a file is read lossily, so its bad bytes must be refused as text too.
fn text_of(name: &str) -> String {
    let bytes = std::fs::read(corpus_dir().join(name)).expect("read a corpus file");
    match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }
}

/// Why `name` fails its expectation, or `None` when it passes.
fn check(name: &str, expect: &Expect) -> Option<String> {
    let text = text_of(name);
    let result = std::panic::catch_unwind(|| Dag::from_yaml(name, &text));
    let err = match result {
        Err(_) => return Some("the parser panicked".to_owned()),
        Ok(Ok(dag)) => return Some(format!("accepted as DAG {:?}", dag.name)),
        Ok(Err(e)) => e,
    };
    let shown = err.to_string();
    let mut problems = Vec::new();
    if err.file != name || !shown.starts_with(name) {
        problems.push(format!("does not name the file: {shown:?}"));
    }
    if err.field != expect.field {
        problems.push(format!(
            "field {:?}, expected {:?}",
            err.field, expect.field
        ));
    }
    if !expect.field.is_empty() && !shown.contains(&expect.field) {
        problems.push(format!("the message does not show the field: {shown:?}"));
    }
    let place = err.line.zip(err.column);
    if place != expect.place {
        problems.push(format!("place {place:?}, expected {:?}", expect.place));
    }
    if let Some((line, column)) = expect.place
        && !shown.starts_with(&format!("{name}:{line}:{column}: "))
    {
        problems.push(format!("the message does not show the place: {shown:?}"));
    }
    if !shown.contains(&expect.fragment) {
        problems.push(format!("{:?} is not in {shown:?}", expect.fragment));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

#[test]
fn the_corpus_and_its_index_agree() {
    let files = corpus_files();
    let index = read_index();
    assert!(files.len() >= 50, "only {} files", files.len());
    let unlisted: Vec<&String> = files.iter().filter(|f| !index.contains_key(*f)).collect();
    let missing: Vec<&String> = index.keys().filter(|f| !files.contains(f)).collect();
    assert!(unlisted.is_empty(), "not in expect.txt: {unlisted:?}");
    assert!(
        missing.is_empty(),
        "in expect.txt, no such file: {missing:?}"
    );
}

#[test]
fn every_bad_file_is_refused_with_file_place_and_field() {
    let index = read_index();
    let failures: Vec<String> = corpus_files()
        .iter()
        .filter_map(|name| {
            let expect = index.get(name)?;
            check(name, expect).map(|why| format!("{name}: {why}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} of the bad files are not refused as expected:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_corpus_covers_non_utf8_and_control_bytes() {
    // The corpus must keep its raw-byte cases: a lossy conversion or an editor must not clean them.
    let raw = |name: &str| std::fs::read(corpus_dir().join(name)).expect("read");
    assert!(String::from_utf8(raw("function-name-non-utf8.yaml")).is_err());
    assert!(raw("raw-nul-byte.yaml").contains(&0));
    assert!(raw("raw-escape-byte.yaml").contains(&0x1b));
    assert!(raw("tab-indentation.yaml").contains(&b'\t'));
}

#[test]
fn files_over_the_size_limit_are_refused_before_parsing() {
    let big = format!(
        "name: t\nfunctions:\n  - {{ name: a, image: img, command: [run] }}\n# {}\n",
        "x".repeat(sonic_core::dag::MAX_FILE_BYTES)
    );
    let err = Dag::from_yaml("big.yaml", &big).expect_err("too big");
    assert_eq!((err.line, err.field.as_str()), (None, ""));
    assert!(
        err.to_string().starts_with("big.yaml: the file has "),
        "{err}"
    );
}
