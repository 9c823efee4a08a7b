//! DAG functions that run OpenLambda handlers: each one's registered lambda resolved to the
//! digest of its tarball, the tarball put in the object store under that digest (agents on
//! other hosts fetch it from there), and how its return value is written on its edges. The
//! OpenLambda listener's `POST /run/<dag-name>` is `crate::http::openlambda`.

use std::collections::BTreeMap;
use std::sync::Arc;

use sonic_api::agent::{HandlerRun, handler_key};
use sonic_core::dag::Dag;

use crate::exec::Runtime;

/// The code digest of every handler stage of `dag` whose lambda is registered with its tarball
/// (by function index), as [`resolve`] would give it, without storing anything: what planning
/// needs to count the stage's warm containers. A stage whose lambda is not is left out (its
/// job would fail at [`resolve`]).
pub fn digests(rt: &Runtime, dag: &Dag) -> BTreeMap<usize, String> {
    let Some(registry) = rt.handlers() else {
        return BTreeMap::new();
    };
    dag.functions
        .iter()
        .enumerate()
        .filter_map(|(i, f)| {
            let package = registry.package(f.handler.as_deref()?)?;
            Some((i, package.sha256))
        })
        .collect()
}

/// The handler of every function of `dag` that names one (by function index), with its tarball
/// in the store. Fails, naming the function and the lambda, when a lambda is not registered, the
/// control plane has no OpenLambda registry, or the tarball cannot be stored.
pub async fn resolve(rt: &Runtime, dag: &Dag) -> Result<BTreeMap<usize, HandlerRun>, String> {
    let mut out = BTreeMap::new();
    for (i, f) in dag.functions.iter().enumerate() {
        let Some(name) = &f.handler else {
            continue;
        };
        let registry = rt.handlers().ok_or_else(|| {
            format!(
                "function {}: handler `{name}` needs the OpenLambda registry, and this control plane has none (configure openlambda, e.g. --openlambda 127.0.0.1:5000)",
                f.name
            )
        })?;
        let package = registry.package(name).ok_or_else(|| {
            if registry.has(name) {
                format!(
                    "function {}: handler `{name}` was installed by an older version that did not keep its tarball: upload it again (POST /registry/{name})",
                    f.name
                )
            } else {
                format!(
                    "function {}: handler `{name}` is not registered (upload it with POST /registry/{name} on the OpenLambda listener)",
                    f.name
                )
            }
        })?;
        store_package(rt, registry, &package)
            .await
            .map_err(|e| format!("function {}: handler `{name}`: {e}", f.name))?;
        let mut routes = BTreeMap::new();
        for e in dag.outgoing(i) {
            routes.insert(dag.functions[e.to].name.clone(), e.kind.to_string());
        }
        if dag.outgoing(i).next().is_none() {
            routes.insert("result".to_owned(), "result".to_owned());
        }
        out.insert(
            i,
            HandlerRun {
                name: name.clone(),
                key: handler_key(&package.sha256),
                sha256: package.sha256,
                routes,
            },
        );
    }
    Ok(out)
}

/// Puts the tarball in the store under its digest, once per digest and process (the object is
/// immutable: same key, same bytes).
async fn store_package(
    rt: &Runtime,
    _registry: &Arc<sonic_openlambda::Handlers>,
    package: &sonic_openlambda::package::Package,
) -> Result<(), String> {
    if rt.package_stored(&package.sha256) {
        return Ok(());
    }
    let key = handler_key(&package.sha256);
    let bytes = tokio::fs::read(&package.path)
        .await
        .map_err(|e| format!("cannot read its tarball: {e}"))?;
    let got = sonic_openlambda::package::sha256_hex(&bytes);
    if got != package.sha256 {
        return Err("its tarball changed on disk since it was installed: upload it again".into());
    }
    if rt.store.head(&key).await.ok().flatten() != Some(bytes.len() as u64) {
        rt.store
            .put_bytes(&key, bytes::Bytes::from(bytes))
            .await
            .map_err(|e| format!("cannot store its tarball: {e}"))?;
    }
    rt.mark_package_stored(&package.sha256);
    Ok(())
}
