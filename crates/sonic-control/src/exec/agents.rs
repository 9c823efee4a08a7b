//! How the executor talks to agents: the [`AgentClient`] trait, over HTTP ([`HttpAgents`], what
//! the control plane uses) or in memory ([`MemoryAgents`], for tests of the executor without a
//! network).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sonic_api::agent::{
    FetchReport, FetchRequest, FetchedFile, RunAccepted, RunReport, RunRequest, RunStatus,
    RunnableCheck, RunnableReport,
};

use crate::resources::BoxFuture;
use crate::store::AgentSlot;

/// An agent's answer to a run request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accepted {
    /// The id the agent knows the run by.
    pub run_id: String,
    /// The agent already had this run (the same attempt was sent before): it will not push its
    /// report again, so the report is read at once.
    pub existed: bool,
}

/// Why a call to an agent failed. Every variant names the agent. Whether an agent that did not
/// answer is lost is for the executor to find out (its health check), not for one call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentError {
    /// No answer: the connection failed or timed out.
    #[error("agent {agent}: {message}")]
    Unreachable {
        /// The agent's id.
        agent: String,
        /// What the connection said.
        message: String,
    },
    /// The agent answered `what` with an error status.
    #[error("agent {agent} refused {what} ({status}): {body}")]
    Refused {
        /// The agent's id.
        agent: String,
        /// The call: "the run", "the run report", "clearing the job".
        what: &'static str,
        /// The HTTP status.
        status: u16,
        /// The answer's body (the agent's error).
        body: String,
    },
    /// The agent's answer to `what` could not be read.
    #[error("agent {agent}: bad answer to {what}: {message}")]
    BadAnswer {
        /// The agent's id.
        agent: String,
        /// The call, as in [`AgentError::Refused`].
        what: &'static str,
        /// Why it could not be read.
        message: String,
    },
}

impl AgentError {
    fn unreachable(agent: &AgentSlot, e: impl std::fmt::Display) -> AgentError {
        AgentError::Unreachable {
            agent: agent.id.clone(),
            message: e.to_string(),
        }
    }
}

/// The calls the executor makes to agents.
pub trait AgentClient: Send + Sync + std::fmt::Debug {
    /// Sends a run (`POST /v1/runs`).
    fn start<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<Accepted, AgentError>>;

    /// Lands a stage's input files on the agent before its runs start (`POST /v1/fetches`),
    /// answered when all are there.
    fn fetch<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a FetchRequest,
    ) -> BoxFuture<'a, Result<FetchReport, AgentError>>;

    /// Reads a run's report (`GET /v1/runs/{id}`); `Running` while it runs.
    fn report<'a>(
        &'a self,
        agent: &'a AgentSlot,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunReport, AgentError>>;

    /// Stops a job's runs on the agent and deletes its files there (`DELETE /v1/jobs/{id}`),
    /// or with [`Clearing::RunsOnly`] keeps its files (`?keep=files`: a failed job kept for a
    /// retry), waiting at most `timeout` when given.
    fn clear_job<'a>(
        &'a self,
        agent: &'a AgentSlot,
        job: &'a str,
        timeout: Option<Duration>,
        clearing: Clearing,
    ) -> BoxFuture<'a, Result<(), AgentError>>;

    /// Whether the agent answers `GET /v1/health` within `timeout`.
    fn healthy<'a>(&'a self, agent: &'a AgentSlot, timeout: Duration) -> BoxFuture<'a, bool>;

    /// Which of these executables the agent cannot start (`POST /v1/runnable`), within
    /// `timeout`. Agents that cannot say (in memory) can start everything.
    fn runnable<'a>(
        &'a self,
        agent: &'a AgentSlot,
        check: &'a RunnableCheck,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<RunnableReport, AgentError>> {
        let _ = (agent, check, timeout);
        Box::pin(async { Ok(RunnableReport::default()) })
    }
}

/// What [`AgentApi::clear_job`] removes of a job on an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clearing {
    /// Its runs and its files.
    Everything,
    /// Its runs only: its files stay for a retry to reuse.
    RunsOnly,
}

/// Agents over HTTP, with the agents' bearer token.
#[derive(Debug, Clone)]
pub struct HttpAgents {
    http: reqwest::Client,
    token: String,
}

impl HttpAgents {
    /// Calls agents with `http` (a client that trusts the cluster's CA) and `token`.
    pub fn new(http: reqwest::Client, token: impl Into<String>) -> HttpAgents {
        HttpAgents {
            http,
            token: token.into(),
        }
    }
}

fn base(agent: &AgentSlot) -> &str {
    agent.url.trim_end_matches('/')
}

/// Sends `req` to `agent`: its answer when it succeeded, else why not (`what`: the call).
async fn answered(
    agent: &AgentSlot,
    what: &'static str,
    req: reqwest::RequestBuilder,
) -> Result<reqwest::Response, AgentError> {
    let r = req
        .send()
        .await
        .map_err(|e| AgentError::unreachable(agent, e))?;
    if !r.status().is_success() {
        let status = r.status().as_u16();
        let body = r.text().await.unwrap_or_default();
        return Err(AgentError::Refused {
            agent: agent.id.clone(),
            what,
            status,
            body,
        });
    }
    Ok(r)
}

/// An answer's JSON body, read as `T`.
async fn read<T: serde::de::DeserializeOwned>(
    agent: &AgentSlot,
    what: &'static str,
    r: reqwest::Response,
) -> Result<T, AgentError> {
    r.json().await.map_err(|e| AgentError::BadAnswer {
        agent: agent.id.clone(),
        what,
        message: e.to_string(),
    })
}

impl AgentClient for HttpAgents {
    fn start<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<Accepted, AgentError>> {
        Box::pin(async move {
            let req = self
                .http
                .post(format!("{}/v1/runs", base(agent)))
                .bearer_auth(&self.token)
                .json(req);
            let r = answered(agent, "the run", req).await?;
            // 200, not 202: the agent already had this run (a repeated request).
            let existed = r.status() == reqwest::StatusCode::OK;
            let accepted: RunAccepted = read(agent, "the run", r).await?;
            Ok(Accepted {
                run_id: accepted.run_id,
                existed,
            })
        })
    }

    fn fetch<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a FetchRequest,
    ) -> BoxFuture<'a, Result<FetchReport, AgentError>> {
        Box::pin(async move {
            let req = self
                .http
                .post(format!("{}/v1/fetches", base(agent)))
                .bearer_auth(&self.token)
                .json(req);
            read(agent, "the fetch", answered(agent, "the fetch", req).await?).await
        })
    }

    fn report<'a>(
        &'a self,
        agent: &'a AgentSlot,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunReport, AgentError>> {
        Box::pin(async move {
            let req = self
                .http
                .get(format!("{}/v1/runs/{run_id}", base(agent)))
                .bearer_auth(&self.token);
            let what = "the run report";
            read(agent, what, answered(agent, what, req).await?).await
        })
    }

    fn clear_job<'a>(
        &'a self,
        agent: &'a AgentSlot,
        job: &'a str,
        timeout: Option<Duration>,
        clearing: Clearing,
    ) -> BoxFuture<'a, Result<(), AgentError>> {
        Box::pin(async move {
            let query = match clearing {
                Clearing::Everything => "",
                Clearing::RunsOnly => "?keep=files",
            };
            let mut req = self
                .http
                .delete(format!("{}/v1/jobs/{job}{query}", base(agent)))
                .bearer_auth(&self.token);
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            match req.send().await {
                Ok(r) if r.status().is_success() || r.status() == 404 => Ok(()),
                Ok(r) => {
                    let status = r.status().as_u16();
                    Err(AgentError::Refused {
                        agent: agent.id.clone(),
                        what: "clearing the job",
                        status,
                        body: r.text().await.unwrap_or_default(),
                    })
                }
                Err(e) => Err(AgentError::unreachable(agent, e)),
            }
        })
    }

    fn runnable<'a>(
        &'a self,
        agent: &'a AgentSlot,
        check: &'a RunnableCheck,
        timeout: Duration,
    ) -> BoxFuture<'a, Result<RunnableReport, AgentError>> {
        Box::pin(async move {
            let req = self
                .http
                .post(format!("{}/v1/runnable", base(agent)))
                .bearer_auth(&self.token)
                .timeout(timeout)
                .json(check);
            let what = "the executables check";
            read(agent, what, answered(agent, what, req).await?).await
        })
    }

    fn healthy<'a>(&'a self, agent: &'a AgentSlot, timeout: Duration) -> BoxFuture<'a, bool> {
        Box::pin(async move {
            let req = self
                .http
                .get(format!("{}/v1/health", base(agent)))
                .timeout(timeout)
                .send();
            matches!(req.await, Ok(r) if r.status().is_success())
        })
    }
}

/// How an in-memory agent answers a run: the report it ends with.
pub type Behaviour = dyn Fn(&AgentSlot, &RunRequest) -> RunReport + Send + Sync;

/// Agents in memory: every run ends at once with the report `behaviour` gives it. They record
/// every request, so that a test can check what was sent where. Agents whose id is in `down`
/// refuse everything and are not healthy.
pub struct MemoryAgents {
    behaviour: Arc<Behaviour>,
    state: Mutex<MemoryState>,
}

#[derive(Default)]
struct MemoryState {
    runs: HashMap<String, RunReport>,
    sent: Vec<(String, RunRequest)>,
    fetched: Vec<(String, FetchRequest)>,
    cleared: Vec<(String, String)>,
    down: Vec<String>,
}

impl std::fmt::Debug for MemoryAgents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryAgents").finish_non_exhaustive()
    }
}

impl MemoryAgents {
    /// Agents whose runs end with `behaviour`'s report.
    pub fn new(
        behaviour: impl Fn(&AgentSlot, &RunRequest) -> RunReport + Send + Sync + 'static,
    ) -> MemoryAgents {
        MemoryAgents {
            behaviour: Arc::new(behaviour),
            state: Mutex::new(MemoryState::default()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemoryState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Every request sent, with the agent's id, in order.
    pub fn sent(&self) -> Vec<(String, RunRequest)> {
        self.lock().sent.clone()
    }

    /// Every fetch asked, with the agent's id, in order.
    pub fn fetched(&self) -> Vec<(String, FetchRequest)> {
        self.lock().fetched.clone()
    }

    /// Every (agent, job) cleared, in order.
    pub fn cleared(&self) -> Vec<(String, String)> {
        self.lock().cleared.clone()
    }

    /// Takes an agent down (`true`) or back up.
    pub fn set_down(&self, agent: &str, down: bool) {
        let mut s = self.lock();
        s.down.retain(|a| a != agent);
        if down {
            s.down.push(agent.to_owned());
        }
    }
}

impl AgentClient for MemoryAgents {
    fn start<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a RunRequest,
    ) -> BoxFuture<'a, Result<Accepted, AgentError>> {
        Box::pin(async move {
            let mut s = self.lock();
            if s.down.contains(&agent.id) {
                return Err(AgentError::unreachable(agent, "connection refused"));
            }
            let run_id = req.run_id();
            s.sent.push((agent.id.clone(), req.clone()));
            let existed = s.runs.contains_key(&run_id);
            if !existed {
                let mut report = (self.behaviour)(agent, req);
                report.run_id = run_id.clone();
                s.runs.insert(run_id.clone(), report);
            }
            Ok(Accepted { run_id, existed })
        })
    }

    /// Every file lands at once, reported as fetched with no bytes.
    fn fetch<'a>(
        &'a self,
        agent: &'a AgentSlot,
        req: &'a FetchRequest,
    ) -> BoxFuture<'a, Result<FetchReport, AgentError>> {
        Box::pin(async move {
            let mut s = self.lock();
            if s.down.contains(&agent.id) {
                return Err(AgentError::unreachable(agent, "connection refused"));
            }
            s.fetched.push((agent.id.clone(), req.clone()));
            Ok(FetchReport {
                files: req
                    .files
                    .iter()
                    .map(|_| FetchedFile {
                        bytes: 0,
                        done_s: 0.0,
                        fetched: true,
                    })
                    .collect(),
                seconds: 0.0,
            })
        })
    }

    fn report<'a>(
        &'a self,
        agent: &'a AgentSlot,
        run_id: &'a str,
    ) -> BoxFuture<'a, Result<RunReport, AgentError>> {
        Box::pin(async move {
            let s = self.lock();
            if s.down.contains(&agent.id) {
                return Err(AgentError::unreachable(agent, "connection refused"));
            }
            s.runs
                .get(run_id)
                .cloned()
                .ok_or_else(|| AgentError::Refused {
                    agent: agent.id.clone(),
                    what: "the run report",
                    status: 404,
                    body: format!("no run {run_id}"),
                })
        })
    }

    fn clear_job<'a>(
        &'a self,
        agent: &'a AgentSlot,
        job: &'a str,
        _timeout: Option<Duration>,
        clearing: Clearing,
    ) -> BoxFuture<'a, Result<(), AgentError>> {
        Box::pin(async move {
            let mut s = self.lock();
            if s.down.contains(&agent.id) {
                return Err(AgentError::unreachable(agent, "connection refused"));
            }
            if clearing == Clearing::Everything {
                s.cleared.push((agent.id.clone(), job.to_owned()));
            }
            s.runs.retain(|id, _| !id.starts_with(&format!("{job}.")));
            Ok(())
        })
    }

    fn healthy<'a>(&'a self, agent: &'a AgentSlot, _timeout: Duration) -> BoxFuture<'a, bool> {
        Box::pin(async move { !self.lock().down.contains(&agent.id) })
    }
}

/// A report of a run that succeeded having written nothing, for in-memory agents.
pub fn succeeded(req: &RunRequest) -> RunReport {
    RunReport {
        cold: Some(true),
        seconds: Some(0.0),
        start_latency_s: Some(0.0),
        exit_code: Some(0),
        ..RunReport::new(req.run_id(), RunStatus::Succeeded)
    }
}
