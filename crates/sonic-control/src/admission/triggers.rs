//! A DAG's triggers (interfaces.md §7): its schedules start jobs of it, on the daemons' one
//! scheduler (`sonic_daemon::cron`, which the OpenLambda listener's cron triggers use too).
//!
//! Each firing submits a job as `POST /v1/jobs` with the DAG's name alone would (its
//! parameters' defaults, no input, the policy chosen as for any job), under the submission key
//! `schedule:<the firing's Unix ms>`: one job per scheduled time, however often it is fired
//! (two control planes on one database, a restart at that instant). Times missed while the
//! control plane was down are not made up for. Applying a DAG schedules its triggers in place
//! of its old ones; deleting it stops them; a control plane schedules every applied DAG's
//! triggers when it starts.

use std::sync::{Arc, Weak};
use std::time::{SystemTime, UNIX_EPOCH};

use sonic_core::dag::{Dag, Trigger};

use crate::exec::Context;
use crate::store::StoreError;

/// Schedules `dag`'s triggers in place of those its name had; a DAG without any has none.
/// Only a control plane that runs jobs schedules anything.
pub fn schedule(ctx: &Arc<Context>, dag: &Dag) {
    let schedules: Vec<_> = dag
        .triggers
        .iter()
        .map(|t| match t {
            Trigger::Schedule(s) => s.clone(),
        })
        .collect();
    if schedules.is_empty() || ctx.jobs.is_none() {
        ctx.triggers.remove(&dag.name);
        return;
    }
    let me = Arc::downgrade(ctx);
    let name = dag.name.clone();
    let next = move |after| sonic_core::schedule::next_of(&schedules, after);
    ctx.triggers.set(dag.name.clone(), next, move |at| {
        fire(me.clone(), name.clone(), at)
    });
}

/// Stops DAG `name`'s triggers.
pub fn forget(ctx: &Context, name: &str) {
    ctx.triggers.remove(&name.to_owned());
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
