//! DAG functions that run OpenLambda handlers: each one's registered lambda resolved to the
//! digest of its tarball, the tarball put in the object store under that digest (agents on
//! other hosts fetch it from there), and how its return value is written on its edges.

use std::collections::BTreeMap;
use std::sync::Arc;

use sonic_api::agent::{HandlerRun, handler_key};
use sonic_core::dag::Dag;

use crate::scheduler::Runtime;

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

/// `POST /run/<dag-name>` on the OpenLambda listener: a job of the DAG (its policy chosen as
/// for `POST /v1/jobs` without one) with the request's JSON as its input (`input/event.json`),
/// answered with the final function's result once the job ended.
pub struct DagCalls {
    state: std::sync::Weak<crate::ControlState>,
}

impl DagCalls {
    /// Runs jobs on `state` (held weakly: the listener does not keep the control plane alive).
    pub fn new(state: &Arc<crate::ControlState>) -> DagCalls {
        DagCalls {
            state: Arc::downgrade(state),
        }
    }
}

/// The largest result `POST /run/<dag-name>` answers with inline.
pub const MAX_INLINE_RESULT: u64 = 16 << 20;

impl sonic_openlambda::DagRunner for DagCalls {
    fn has_dag<'a>(&'a self, name: &'a str) -> sonic_openlambda::DagFuture<'a, bool> {
        Box::pin(async move {
            let Some(state) = self.state.upgrade() else {
                return false;
            };
            matches!(state.db.parsed_dag(name).await, Ok(Some(_)))
        })
    }

    fn run_dag<'a>(
        &'a self,
        name: &'a str,
        event: serde_json::Value,
    ) -> sonic_openlambda::DagFuture<'a, Result<serde_json::Value, String>> {
        Box::pin(async move {
            let state = self
                .state
                .upgrade()
                .ok_or_else(|| "the control plane is stopping".to_owned())?;
            let body = serde_json::to_vec(&event).map_err(|e| e.to_string())?;
            let req = sonic_api::control::SubmitJob {
                dag: name.to_owned(),
                input: Some(sonic_api::control::JobInput {
                    name: Some("event.json".into()),
                    base64: Some(crate::jobs::encode_base64(&body)),
                    key: None,
                }),
                params: serde_json::Map::new(),
                policy: None,
                planned: false,
            };
            let accepted = crate::api::submit(&state, req)
                .await
                .map_err(|e| format!("the job could not start: {}", api_message(e)))?;
            let id = accepted.job_id;
            let job = wait_ended(&state, &id).await?;
            if job.status != sonic_api::control::JobStatus::Succeeded {
                return Err(format!(
                    "job {id} {}: {}",
                    job.status,
                    job.error.unwrap_or_else(|| "no error recorded".into())
                ));
            }
            result_value(&state, &id).await
        })
    }
}

fn api_message(e: crate::ApiError) -> String {
    use crate::ApiError as E;
    match e {
        E::BadRequest(m)
        | E::Forbidden(m)
        | E::NotFound(m)
        | E::Conflict(m)
        | E::Unprocessable(m)
        | E::UnsupportedMediaType(m)
        | E::Unavailable(m) => m,
        E::InvalidDag(d) => d.to_string(),
        // Internal details stay in the log.
        other => {
            tracing::warn!(status = %other.status(), "a DAG call could not start");
            format!("{}", other.status())
        }
    }
}

/// Waits until job `id` ended (woken by its progress events, read from the database).
async fn wait_ended(
    state: &crate::ControlState,
    id: &str,
) -> Result<crate::store::JobRecord, String> {
    let rx = state.jobs.as_ref().and_then(|rt| rt.subscribe(id));
    let mut rx = rx;
    loop {
        let lookup = id.to_owned();
        let job = state
            .db
            .run(move |db| db.get_job(&lookup))
            .await
            .map_err(|e| format!("database: {e}"))?
            .ok_or_else(|| format!("job {id} vanished"))?;
        if job.status.is_terminal() {
            return Ok(job);
        }
        match rx.as_mut() {
            Some(r) => {
                let changed =
                    tokio::time::timeout(std::time::Duration::from_millis(500), r.changed()).await;
                if matches!(changed, Ok(Err(_))) {
                    // The job's events ended: read its record from now on.
                    rx = None;
                }
            }
            None => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
    }
}

/// The job's result: its one result object as JSON, or, when there are several or one that is
/// not JSON, `{"job_id", "results": {<key under result/>: <JSON value, or {"bytes": n}>}}`.
async fn result_value(state: &crate::ControlState, id: &str) -> Result<serde_json::Value, String> {
    let rt = state
        .jobs
        .as_ref()
        .ok_or_else(|| "this control plane runs no jobs".to_owned())?;
    let prefix = format!("{}result/", crate::jobs::job_prefix(id));
    let objects = rt
        .store
        .list(&prefix)
        .await
        .map_err(|e| format!("cannot list the job's results: {e}"))?;
    let mut values = serde_json::Map::new();
    for o in &objects {
        let rel = o.key.strip_prefix(&prefix).unwrap_or(&o.key).to_owned();
        let value = if o.size <= MAX_INLINE_RESULT {
            let bytes = rt
                .store
                .get_bytes(&o.key)
                .await
                .map_err(|e| format!("cannot read the result {rel}: {e}"))?;
            serde_json::from_slice(&bytes).ok()
        } else {
            None
        };
        if objects.len() == 1
            && let Some(v) = value
        {
            return Ok(v);
        }
        values.insert(
            rel,
            value.unwrap_or_else(|| serde_json::json!({ "bytes": o.size })),
        );
    }
    Ok(serde_json::json!({ "job_id": id, "results": values }))
}
