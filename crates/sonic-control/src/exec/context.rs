//! What admission and the executor share: the database, the clock, the metrics, the job
//! runtime and the measured bandwidths. The HTTP layer's state (`crate::http::api::ControlState`)
//! holds one, beside what only the API needs (tokens, limits, the dashboard's sessions).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use sonic_core::catalog::Catalog;
use sonic_core::regression::Convergence;

use crate::clock::Clock;
use crate::exec::Runtime;
use crate::learn::bandwidth::BandwidthBook;
use crate::metrics::Metrics;
use crate::store::Db;
use sonic_api::plan::TypeBandwidth;

/// The domain's shared state.
#[derive(Debug)]
pub struct Context {
    /// The database: DAGs, agents, jobs, models.
    pub db: Db,
    /// Where the time comes from.
    pub clock: Arc<dyn Clock>,
    /// The control plane's Prometheus metrics.
    pub metrics: Metrics,
    /// What running jobs needs (object store, catalog, agent credentials); `None` refuses jobs.
    pub jobs: Option<Arc<Runtime>>,
    /// The bandwidth the agents measure, per VM type, for the planner.
    pub bandwidth: BandwidthBook,
    /// An agent that has not been heard from for this long is not alive.
    pub heartbeat_timeout: Duration,
    /// The DAGs' triggers, per DAG name (`crate::admission::triggers`).
    pub triggers: sonic_daemon::cron::Scheduler<String>,
    /// How many plannings run and wait at once (`crate::learn::PlanningGate`).
    pub planning: crate::learn::PlanningGate,
}

impl Context {
    /// A context over `db` whose jobs (if any) run with `jobs`.
    pub fn new(
        db: Db,
        clock: Arc<dyn Clock>,
        heartbeat_timeout: Duration,
        jobs: Option<Arc<Runtime>>,
    ) -> Context {
        Context {
            db,
            clock,
            metrics: Metrics::default(),
            jobs,
            bandwidth: BandwidthBook::default(),
            heartbeat_timeout,
            triggers: sonic_daemon::cron::Scheduler::new(),
            planning: crate::learn::PlanningGate::default(),
        }
    }

    /// The convergence rule in force (the job runtime's, or the default without one).
    pub fn convergence(&self) -> Convergence {
        self.jobs
            .as_ref()
            .map_or_else(Convergence::default, |rt| rt.config.convergence)
    }

    /// What planning one request may spend (the job runtime's, or the default without one).
    /// Planning runs on the blocking pool and stops inside its searches at this budget.
    pub fn plan_budget(&self) -> sonic_core::planner::Budget {
        self.jobs
            .as_ref()
            .map_or_else(crate::learn::default_budget, |rt| rt.config.planning)
    }

    /// The catalog planning uses, with the measured bandwidths in place of the nominal ones.
    pub fn planning_catalog(&self) -> (Catalog, BTreeMap<String, TypeBandwidth>) {
        let base = self
            .jobs
            .as_ref()
            .and_then(|rt| rt.catalog.clone())
            .unwrap_or_default();
        self.bandwidth.apply(&base)
    }
}
