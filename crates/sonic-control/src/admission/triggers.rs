//! A DAG's triggers (interfaces.md §7): its schedules, and new objects under a prefix of the
//! store, start jobs of it, on the daemons' one scheduler (`sonic_daemon::cron`, which the
//! OpenLambda listener's cron triggers use too).
//!
//! Each firing submits a job as `POST /v1/jobs` with the DAG's name alone would (its
//! parameters' defaults, no input, the policy chosen as for any job), under the submission key
//! `schedule:<the firing's Unix ms>`: one job per scheduled time, however often it is fired
//! (two control planes on one database, a restart at that instant). Times missed while the
//! control plane was down are not made up for.
//!
//! An `object_created` trigger lists its prefix every `JobsConfig::trigger_poll`. Its first
//! look records what is there as seen (those objects are not new); from then on each object not
//! seen before starts one job with the object as its input (`input.key`), under the key
//! `object:<SHA-256 of the object's key>`, and is recorded as seen with its job: once across
//! restarts, and objects that arrived while the control plane was down start their jobs when
//! it is back. An object that cannot start a job (its DAG refuses it) is recorded as seen without
//! one and logged; one that could not start one for now (models not ready, the database or the
//! store failing) is tried again at the next look.
//!
//! Applying a DAG schedules its triggers in place of its old ones; deleting it stops them; a
//! control plane schedules every applied DAG's triggers when it starts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

use sonic_core::dag::{Dag, Trigger};

use crate::admission::AdmitError;
use crate::exec::Context;
use crate::store::StoreError;

/// The scheduler's key of DAG `dag`'s watch of `prefix` (a DAG's name has no space).
fn watch_key(dag: &str, prefix: &str) -> String {
    format!("{dag} objects {prefix}")
}

/// Schedules `dag`'s triggers in place of those its name had; a DAG without any has none.
/// Only a control plane that runs jobs schedules anything.
pub fn schedule(ctx: &Arc<Context>, dag: &Dag) {
    forget(ctx, &dag.name);
    let Some(rt) = ctx.jobs.as_ref() else {
        return;
    };
    let mut schedules = Vec::new();
    let mut prefixes = Vec::new();
    for t in &dag.triggers {
        match t {
            Trigger::Schedule(s) => schedules.push(s.clone()),
            Trigger::ObjectCreated { prefix } => prefixes.push(prefix.clone()),
        }
    }
    let me = Arc::downgrade(ctx);
    if !schedules.is_empty() {
        let (me, name) = (me.clone(), dag.name.clone());
        let next = move |after| sonic_core::schedule::next_of(&schedules, after);
        ctx.triggers.set(dag.name.clone(), next, move |at| {
            fire(me.clone(), name.clone(), at)
        });
    }
    let poll = rt.config.trigger_poll;
    for prefix in prefixes {
        let (me, name) = (me.clone(), dag.name.clone());
        // One look at a time: a slow listing is not overlapped by the next.
        let looking = Arc::new(AtomicBool::new(false));
        let every = move |after: SystemTime| after.checked_add(poll);
        ctx.triggers
            .set(watch_key(&dag.name, &prefix), every, move |_at| {
                look(me.clone(), name.clone(), prefix.clone(), looking.clone())
            });
    }
}

/// Stops DAG `name`'s triggers.
pub fn forget(ctx: &Context, name: &str) {
    let watches = format!("{name} objects ");
    for key in ctx.triggers.keys() {
        if key == name || key.starts_with(&watches) {
            ctx.triggers.remove(&key);
        }
    }
}

/// Schedules every applied DAG's triggers (at start); returns how many DAGs have some.
pub async fn schedule_all(ctx: &Arc<Context>) -> Result<usize, StoreError> {
    let dags = ctx.db.run(|db| db.list_dags()).await?;
    let mut scheduled = 0;
    for record in dags {
        match serde_json::from_value::<Dag>(record.parsed) {
            Ok(dag) => {
                if !dag.triggers.is_empty() {
                    scheduled += 1;
                }
                schedule(ctx, &dag);
            }
            Err(e) => {
                tracing::warn!(dag = %record.name, error = %e, "cannot read the stored DAG: its triggers are not scheduled")
            }
        }
    }
    Ok(scheduled)
}

/// The submission key of the firing at `at`.
pub fn key_of(at: SystemTime) -> String {
    let ms = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("schedule:{ms}")
}

/// Submits the job of the firing at `at`, and logs what came of it.
async fn fire(ctx: Weak<Context>, dag: String, at: SystemTime) {
    let Some(ctx) = ctx.upgrade() else { return };
    let req = sonic_api::control::SubmitJob {
        revision: None,
        dag: dag.clone(),
        input: None,
        params: serde_json::Map::new(),
        policy: None,
        planned: false,
        slo: None,
        slo_best_effort: false,
    };
    let key = key_of(at);
    match crate::admission::submit_keyed(&ctx, req, Some(&key)).await {
        Ok(s) if s.existed => {
            tracing::info!(dag = %dag, job = %s.accepted.job_id, %key, "schedule: the job of this time was already submitted")
        }
        Ok(s) => {
            tracing::info!(dag = %dag, job = %s.accepted.job_id, %key, "schedule started a job")
        }
        Err(e) => {
            tracing::warn!(dag = %dag, %key, error = %e, "schedule: the job could not be submitted")
        }
    }
}

/// The submission key of the job object `key` starts.
pub fn object_key(key: &str) -> String {
    format!("object:{}", hex::encode(Sha256::digest(key.as_bytes())))
}

/// An input file name for object `key`: its last segment, with what a file name may not hold
/// made `_`.
fn input_name(key: &str) -> String {
    let last = key.rsplit('/').next().unwrap_or("");
    let name: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() || name.starts_with('.') {
        format!("input{name}")
    } else {
        name
    }
}

/// One look of DAG `dag`'s trigger at `prefix`: the first records what is there; later ones
/// start a job for each object not seen before.
async fn look(ctx: Weak<Context>, dag: String, prefix: String, looking: Arc<AtomicBool>) {
    if looking.swap(true, Ordering::SeqCst) {
        return;
    }
    if let Some(ctx) = ctx.upgrade()
        && let Err(e) = look_once(&ctx, &dag, &prefix).await
    {
        tracing::warn!(dag = %dag, %prefix, error = %e, "object trigger: cannot look at the prefix now");
    }
    looking.store(false, Ordering::SeqCst);
}

async fn look_once(ctx: &Arc<Context>, dag: &str, prefix: &str) -> Result<(), String> {
    let Some(rt) = ctx.jobs.clone() else {
        return Ok(());
    };
    let listed = rt.store.list(prefix).await.map_err(|e| e.to_string())?;
    let mut keys: Vec<String> = listed.into_iter().map(|o| o.key).collect();
    keys.sort();
    let now = ctx.clock.now_ms();
    let (d, p) = (dag.to_owned(), prefix.to_owned());
    let first = !ctx
        .db
        .run(move |db| db.trigger_baseline(&d, &p))
        .await
        .map_err(|e| e.to_string())?;
    if first {
        let (d, p, n) = (dag.to_owned(), prefix.to_owned(), keys.len());
        ctx.db
            .run(move |db| db.set_trigger_baseline(&d, &p, &keys, now))
            .await
            .map_err(|e| e.to_string())?;
        tracing::info!(dag = %dag, %prefix, objects = n, "object trigger: watching; the objects there now are not new");
        return Ok(());
    }
    let (d, p) = (dag.to_owned(), prefix.to_owned());
    let seen = ctx
        .db
        .run(move |db| db.trigger_objects_seen(&d, &p))
        .await
        .map_err(|e| e.to_string())?;
    for key in keys.into_iter().filter(|k| !seen.contains(k)) {
        let req = sonic_api::control::SubmitJob {
            revision: None,
            dag: dag.to_owned(),
            input: Some(sonic_api::control::JobInput {
                name: Some(input_name(&key)),
                base64: None,
                key: Some(key.clone()),
            }),
            params: serde_json::Map::new(),
            policy: None,
            planned: false,
            slo: None,
            slo_best_effort: false,
        };
        let job = match crate::admission::submit_keyed(ctx, req, Some(&object_key(&key))).await {
            Ok(s) => {
                tracing::info!(dag = %dag, object = %key, job = %s.accepted.job_id, "object trigger started a job");
                Some(s.accepted.job_id)
            }
            // The DAG refuses this object: it would refuse it at every look.
            Err(
                e @ (AdmitError::Invalid(_) | AdmitError::NotFound(_) | AdmitError::Infeasible(_)),
            ) => {
                tracing::warn!(dag = %dag, object = %key, error = %e, "object trigger: the object cannot start a job");
                None
            }
            // For now: the next look tries again.
            Err(e) => return Err(format!("object {key}: {e}")),
        };
        let (d, p) = (dag.to_owned(), prefix.to_owned());
        let now = ctx.clock.now_ms();
        ctx.db
            .run(move |db| db.trigger_object_seen(&d, &p, &key, job.as_deref(), now))
            .await
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_keys_and_input_names() {
        assert_eq!(object_key("incoming/a.csv").len(), "object:".len() + 64);
        assert_ne!(object_key("incoming/a.csv"), object_key("incoming/b.csv"));
        assert_eq!(input_name("incoming/a.csv"), "a.csv");
        assert_eq!(input_name("incoming/day 1/é.csv"), "_.csv");
        assert_eq!(input_name("incoming/.hidden"), "input.hidden");
        assert_eq!(input_name("incoming/"), "input");
        assert_eq!(watch_key("d", "in/"), "d objects in/");
    }
}
