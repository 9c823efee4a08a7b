//! A stage's inputs fetched onto each of its agents when the stage starts, as the model prices
//! them (docs/model.md, "Cost of a job"): a receiving VM fetches what its instances read once,
//! before its first batch, so a `direct` sender's VM is held until then and no longer. Without
//! it each instance fetches its own inputs when it starts, and a later batch holds the sender
//! until it starts.
//!
//! One [`StageFetch`] per stage and agent: the stage's first attempt there asks the agent
//! (`POST /v1/fetches`), the others wait for it. A fetch that fails changes nothing: each run then
//! fetches its own inputs as it would without one, and fails or succeeds by them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use sonic_api::agent::{FetchReport, FetchRequest, FileSource, RunRequest};
use sonic_core::dag::Dag;

use crate::exec::Runtime;
use crate::store::AgentSlot;

/// The inputs one agent fetches for one stage.
#[derive(Debug)]
pub(crate) struct StageFetch {
    agent: AgentSlot,
    request: FetchRequest,
    /// Per file of the request: what it is.
    files: Vec<FileOf>,
    done: tokio::sync::OnceCell<Option<Fetched>>,
    /// Whether an instance has recorded the fetch's edges and holds (once per fetch).
    recorded: AtomicBool,
}

/// One file of a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FileOf {
    /// The DAG edge it travels on.
    pub edge: usize,
    /// For a `direct` file, the sending instance (function, instance) whose VM serves it.
    pub sender: Option<(usize, u32)>,
    /// It comes from the object store (a fetch of it is a GET the job pays for).
    pub from_store: bool,
}

/// A fetch that succeeded.
#[derive(Debug)]
pub(crate) struct Fetched {
    pub started: Instant,
    pub ended: Instant,
    pub report: FetchReport,
}

impl StageFetch {
    /// Stage `i`'s fetches, one per agent that runs some of `runs` (its instances' requests with
    /// the agent each runs on), with every `direct` and `remote` input of the instances there,
    /// each once. Agents whose instances read nothing over those methods get none.
    pub(crate) fn for_stage<'a>(
        job: &str,
        dag: &Dag,
        i: usize,
        agents: &[AgentSlot],
        runs: impl IntoIterator<Item = (usize, &'a RunRequest)>,
    ) -> HashMap<usize, Arc<StageFetch>> {
        let mut per_agent: BTreeMap<usize, Vec<(FileSource, FileOf)>> = BTreeMap::new();
        // Each file once per agent (a broadcast's file is every instance's input there).
        let mut seen: HashSet<(usize, String)> = HashSet::new();
        for (agent, req) in runs {
            for input in &req.inputs {
                let key = match &input.source {
                    FileSource::VmStorage { .. } => continue,
                    FileSource::Direct {
                        peer_url,
                        file_path,
                        ..
                    } => format!("direct {peer_url} {file_path}"),
                    FileSource::Remote { key } => format!("remote {key}"),
                    FileSource::Memory { key } => format!("memory {key}"),
                };
                let Some(of) = file_of(dag, i, &input.dest, &input.source) else {
                    continue;
                };
                if seen.insert((agent, key)) {
                    per_agent
                        .entry(agent)
                        .or_default()
                        .push((input.source.clone(), of));
                }
            }
        }
        per_agent
            .into_iter()
            .filter_map(|(agent, files)| {
                let slot = agents.get(agent)?.clone();
                let (sources, of): (Vec<FileSource>, Vec<FileOf>) = files.into_iter().unzip();
                Some((agent, slot, sources, of))
            })
            .map(|(agent, slot, sources, of)| {
                (
                    agent,
                    Arc::new(StageFetch {
                        agent: slot,
                        request: FetchRequest {
                            job_id: job.to_owned(),
                            files: sources,
                        },
                        files: of,
                        done: tokio::sync::OnceCell::new(),
                        recorded: AtomicBool::new(false),
                    }),
                )
            })
            .collect()
    }

    /// Fetches once: the first caller asks the agent, the others wait for its answer. `None`
    /// when the fetch failed (the runs then fetch their own inputs).
    pub(crate) async fn once(&self, rt: &Runtime) -> Option<&Fetched> {
        self.done
            .get_or_init(|| async {
                let started = Instant::now();
                match rt.agents.fetch(&self.agent, &self.request).await {
                    Ok(report) if report.files.len() == self.files.len() => Some(Fetched {
                        started,
                        ended: Instant::now(),
                        report,
                    }),
                    Ok(report) => {
                        tracing::warn!(agent = %self.agent.id, asked = self.files.len(), answered = report.files.len(), "the agent's fetch answered for other files: its runs fetch their own");
                        None
                    }
                    Err(e) => {
                        tracing::warn!(agent = %self.agent.id, error = %e, "fetching the stage's inputs failed: its runs fetch their own");
                        None
                    }
                }
            })
            .await
            .as_ref()
    }

    /// A fetch of `files` on `agent` that is over (for tests of what is recorded of it).
    #[cfg(test)]
    pub(crate) fn over(agent: AgentSlot, files: Vec<FileOf>, fetched: Fetched) -> StageFetch {
        StageFetch {
            agent,
            request: FetchRequest {
                job_id: "j".into(),
                files: Vec::new(),
            },
            files,
            done: tokio::sync::OnceCell::new_with(Some(Some(fetched))),
            recorded: AtomicBool::new(false),
        }
    }

    /// The fetch, if it is over and succeeded.
    pub(crate) fn fetched(&self) -> Option<&Fetched> {
        self.done.get().and_then(Option::as_ref)
    }

    /// The fetch and its files, for the first caller only (its edges and holds are recorded
    /// once).
    pub(crate) fn record_once(&self) -> Option<(&Fetched, &[FileOf])> {
        let fetched = self.fetched()?;
        (!self.recorded.swap(true, Ordering::SeqCst)).then_some((fetched, &self.files[..]))
    }
}

/// The edge an input of stage `i` travels on (its destination `<from>/<i>/<name>` names the
/// sender), and for a `direct` file its sending instance (its path `<from>/<i>/...` in the
/// sender's namespace).
fn file_of(dag: &Dag, i: usize, dest: &str, source: &FileSource) -> Option<FileOf> {
    let from = dest.split('/').next()?;
    let edge = dag
        .edges
        .iter()
        .position(|e| e.to == i && dag.functions[e.from].name == from)?;
    let sender = match source {
        FileSource::Direct { file_path, .. } => {
            let mut parts = file_path.split('/');
            let (name, instance) = (parts.next()?, parts.next()?.parse::<u32>().ok()?);
            let function = dag.functions.iter().position(|f| f.name == name)?;
            Some((function, instance))
        }
        _ => None,
    };
    Some(FileOf {
        edge,
        sender,
        from_store: matches!(source, FileSource::Remote { .. }),
    })
}
