//! Secrets a DAG's functions name (`env: { VAR: { secret: NAME } }`, docs/dag-format.md): the
//! control plane's secret store (the `secrets` table, `ofctl create secret`) and, beside it, a
//! folder of files (`secrets_dir`: a mounted Kubernetes Secret, Docker's `/run/secrets`); the
//! store wins for a name both hold. A value goes to the runs of the functions that name it
//! ([`sonic_api::agent::SecretEnv`], which the agent redacts from their logs) and nowhere else:
//! not the DAG, the API, the logs or the dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read;
use std::path::Path;

use sonic_api::agent::SecretEnv;
use sonic_api::control::SecretView;
use sonic_core::dag::{Dag, Function, valid_secret_name};

use crate::store::{Db, StoreError};

/// The largest value a secret may hold.
pub const MAX_SECRET_BYTES: usize = 64 * 1024;

/// Whether `value` can be a secret: text (it becomes an environment variable's value), no NUL,
/// at most [`MAX_SECRET_BYTES`], not empty.
pub fn check_value(value: &[u8]) -> Result<&str, String> {
    if value.is_empty() {
        return Err("a secret's value is not empty".into());
    }
    if value.len() > MAX_SECRET_BYTES {
        return Err(format!(
            "a secret's value is at most {MAX_SECRET_BYTES} bytes, not {}",
            value.len()
        ));
    }
    let text = std::str::from_utf8(value)
        .map_err(|_| "a secret's value is UTF-8 text (it becomes an environment variable)")?;
    if text.contains('\0') {
        return Err("a secret's value cannot hold NUL".into());
    }
    Ok(text)
}

/// The secrets `dag`'s functions name, its `on_failure` function's too.
pub fn needed(dag: &Dag) -> BTreeSet<String> {
    dag.functions
        .iter()
        .chain(dag.on_failure.as_ref())
        .flat_map(|f| f.secrets.values().cloned())
        .collect()
}

/// The variables of `f`'s runs that hold secrets, with their values from `values`.
pub fn env_of(f: &Function, values: &BTreeMap<String, String>) -> SecretEnv {
    SecretEnv(
        f.secrets
            .iter()
            .filter_map(|(var, name)| Some((var.clone(), values.get(name)?.clone())))
            .collect(),
    )
}

/// A secret of the folder: its value when there is a readable file of that name.
fn from_dir(dir: &Path, name: &str) -> Result<Option<String>, String> {
    if !valid_secret_name(name) {
        return Ok(None);
    }
    let path = dir.join(name);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(format!(
                "secret {name}: cannot read {}: {e}",
                path.display()
            ));
        }
    };
    if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Ok(None);
    }
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("secret {name}: cannot read {}: {e}", path.display()))?;
    check_value(&bytes)
        .map(|v| Some(v.to_owned()))
        .map_err(|e| format!("secret {name} ({}): {e}", path.display()))
}

/// The values of `names`, or why not: the names neither the store nor the folder holds, with
/// how to add them. Blocking (the database and the folder): call it through `Db::run`.
pub fn resolve(
    db: &Db,
    dir: Option<&Path>,
    names: &BTreeSet<String>,
) -> Result<BTreeMap<String, String>, String> {
    let mut values = BTreeMap::new();
    let mut missing = Vec::new();
    for name in names {
        let stored = db
            .secret_value(name)
            .map_err(|e: StoreError| format!("database: {e}"))?;
        let value = match (stored, dir) {
            (Some(v), _) => Some(v),
            (None, Some(dir)) => from_dir(dir, name)?,
            (None, None) => None,
        };
        match value {
            Some(v) => {
                values.insert(name.clone(), v);
            }
            None => missing.push(name.as_str()),
        }
    }
    if missing.is_empty() {
        return Ok(values);
    }
    let them = if missing.len() == 1 { "it" } else { "them" };
    Err(format!(
        "no secret {} in the control plane's secret store{}: add {them} with `ofctl create secret NAME --from-file FILE`",
        missing.join(", "),
        if dir.is_some() {
            " or its secrets folder"
        } else {
            ""
        }
    ))
}

/// Every secret there is, by name, without values: the store's, then the folder's that the
/// store does not shadow.
pub fn list(db: &Db, dir: Option<&Path>) -> Result<Vec<SecretView>, StoreError> {
    let mut out: BTreeMap<String, SecretView> = db
        .secrets()?
        .into_iter()
        .map(|s| {
            let view = SecretView {
                name: s.name.clone(),
                bytes: s.bytes,
                updated_ms: Some(s.updated_ms),
                source: "store".into(),
            };
            (s.name, view)
        })
        .collect();
    if let Some(dir) = dir
        && let Ok(entries) = std::fs::read_dir(dir)
    {
        for e in entries.flatten() {
            let Some(name) = e.file_name().to_str().map(str::to_owned) else {
                continue;
            };
            if out.contains_key(&name) || !valid_secret_name(&name) {
                continue;
            }
            // Followed (a mounted Secret's files are links), and only files.
            let Ok(meta) = std::fs::metadata(e.path()) else {
                continue;
            };
            if !meta.is_file() {
                continue;
            }
            let updated_ms = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64);
            out.insert(
                name.clone(),
                SecretView {
                    name,
                    bytes: meta.len(),
                    updated_ms,
                    source: "file".into(),
                },
            );
        }
    }
    Ok(out.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The store wins over the folder; the folder's bad names, dotted files and folders are no
    /// secrets; a missing name is said with how to add it; values are checked.
    #[test]
    fn secrets_come_from_the_store_then_the_folder() {
        let db = Db::open_in_memory().expect("db");
        db.write(|w| w.put_secret("both", "from-store", 1))
            .expect("put");
        db.write(|w| w.put_secret("db-pass", "s3cret!", 2))
            .expect("put");
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("both"), "from-file").expect("write");
        std::fs::write(dir.path().join("api.key"), "k-123\n").expect("write");
        std::fs::write(dir.path().join(".hidden"), "x").expect("write");
        std::fs::create_dir(dir.path().join("sub")).expect("dir");
        std::fs::write(dir.path().join("binary"), [0xff, 0xfe]).expect("write");

        let names = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
        let got = resolve(
            &db,
            Some(dir.path()),
            &names(&["both", "db-pass", "api.key"]),
        )
        .expect("all there");
        assert_eq!(got["both"], "from-store");
        assert_eq!(got["db-pass"], "s3cret!");
        assert_eq!(got["api.key"], "k-123\n", "a file's bytes as they are");
        let err = resolve(
            &db,
            Some(dir.path()),
            &names(&["nope", ".hidden", "db-pass"]),
        )
        .expect_err("missing");
        assert!(
            err.contains("no secret .hidden, nope") && err.contains("ofctl create secret"),
            "{err}"
        );
        let err = resolve(&db, Some(dir.path()), &names(&["binary"])).expect_err("binary");
        assert!(err.contains("UTF-8"), "{err}");
        assert!(
            resolve(&db, None, &names(&["api.key"])).is_err(),
            "no folder, no file"
        );

        let listed = list(&db, Some(dir.path())).expect("list");
        let shown: Vec<(&str, &str)> = listed
            .iter()
            .map(|s| (s.name.as_str(), s.source.as_str()))
            .collect();
        assert_eq!(
            shown,
            [
                ("api.key", "file"),
                ("binary", "file"),
                ("both", "store"),
                ("db-pass", "store")
            ]
        );
        assert_eq!(listed[3].bytes, 7);

        assert!(check_value(b"").is_err());
        assert!(check_value(b"a\0b").is_err());
        assert!(check_value(&vec![b'a'; MAX_SECRET_BYTES + 1]).is_err());
        assert_eq!(check_value(b"ok").expect("ok"), "ok");
    }
}
