//! Run reports the agents push when a run ends: who waits for which run ([`Waiters`], kept in
//! the job runtime); the route that hands a pushed report to its waiter
//! (`POST /v1/agents/{id}/runs/{run_id}/report`) is `crate::http::reports`.
//!
//! The executor registers a waiter under the run's id *before* it sends the run, so a report
//! pushed at once is never early. A report nobody waits for (a stale attempt, an unknown run,
//! a run of an execution given up on) or from an agent the run was not sent to is refused and
//! changes nothing. A push that never comes (lost, refused, the agent gone) costs time, not the
//! job: the executor still reads the report itself, slowly (`JobsConfig::fallback_poll`).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sonic_api::agent::RunReport;
use tokio::sync::mpsc;

/// What a waiter is told.
#[derive(Debug)]
pub enum Push {
    /// The run ended: its report.
    Report(Box<RunReport>),
    /// The agent tried to push and failed (its body was refused): read the report now rather
    /// than at the next slow poll.
    PollNow,
}

/// Why a pushed report was not taken.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Nobody waits for this run (stale attempt, unknown run, already reported).
    NotWaiting,
    /// The run was sent to another agent.
    OtherAgent,
}

#[derive(Debug)]
struct Entry {
    agent: String,
    serial: u64,
    tx: mpsc::Sender<Push>,
}

/// The runs waiting for a pushed report: run id -> the agent it was sent to and the waiter.
#[derive(Debug, Default)]
pub struct Waiters {
    map: Mutex<HashMap<String, Entry>>,
    serial: AtomicU64,
}

/// One waiting run; dropping it (the run reported, failed, timed out, was cancelled) stops
/// waiting, so a later push for it is refused.
#[derive(Debug)]
pub struct Waiter<'a> {
    waiters: &'a Waiters,
    run_id: String,
    serial: u64,
    /// Where the run's pushed report arrives.
    pub rx: mpsc::Receiver<Push>,
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut map = self.waiters.lock();
        // A newer waiter for the same run id (a later execution) is not ours to remove.
        if map
            .get(&self.run_id)
            .is_some_and(|e| e.serial == self.serial)
        {
            map.remove(&self.run_id);
        }
    }
}

impl Waiters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits for the report of `run_id` from `agent` (replacing an older waiter of that id).
    pub fn wait(&self, run_id: &str, agent: &str) -> Waiter<'_> {
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        // A report and a nudge at most: two slots never block a sender.
        let (tx, rx) = mpsc::channel(2);
        self.lock().insert(
            run_id.to_owned(),
            Entry {
                agent: agent.to_owned(),
                serial,
                tx,
            },
        );
        Waiter {
            waiters: self,
            run_id: run_id.to_owned(),
            serial,
            rx,
        }
    }

    /// Hands `report` to whoever waits for `run_id` from `agent`; the run then waits no more.
    pub fn deliver(&self, agent: &str, run_id: &str, report: RunReport) -> Result<(), Refusal> {
        let mut map = self.lock();
        let entry = map.get(run_id).ok_or(Refusal::NotWaiting)?;
        if entry.agent != agent {
            return Err(Refusal::OtherAgent);
        }
        let entry = map.remove(run_id).ok_or(Refusal::NotWaiting)?;
        entry
            .tx
            .try_send(Push::Report(Box::new(report)))
            .map_err(|_| Refusal::NotWaiting)
    }

    /// Tells the waiter of `run_id` from `agent`, if any, to read the report itself now.
    pub fn nudge(&self, agent: &str, run_id: &str) -> bool {
        let map = self.lock();
        match map.get(run_id) {
            Some(e) if e.agent == agent => e.tx.try_send(Push::PollNow).is_ok(),
            _ => false,
        }
    }

    /// Runs waiting now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether no run waits.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonic_api::agent::RunStatus;

    fn report(id: &str) -> RunReport {
        RunReport {
            exit_code: Some(0),
            ..RunReport::new(id.into(), RunStatus::Succeeded)
        }
    }

    #[test]
    fn a_report_reaches_its_waiter_once() {
        let w = Waiters::default();
        let mut waiter = w.wait("j.f.0.1", "a-1");
        assert_eq!(w.deliver("a-1", "j.f.0.1", report("j.f.0.1")), Ok(()));
        assert!(matches!(waiter.rx.try_recv(), Ok(Push::Report(r)) if r.run_id == "j.f.0.1"));
        // Delivered: a second push for it is refused.
        assert_eq!(
            w.deliver("a-1", "j.f.0.1", report("j.f.0.1")),
            Err(Refusal::NotWaiting)
        );
    }

    #[test]
    fn unknown_stale_and_foreign_reports_change_nothing() {
        let w = Waiters::default();
        assert_eq!(
            w.deliver("a-1", "j.f.0.1", report("j.f.0.1")),
            Err(Refusal::NotWaiting)
        );
        let mut waiter = w.wait("j.f.0.2", "a-1");
        // The previous attempt's id, another agent, another job: refused, still waiting.
        assert_eq!(
            w.deliver("a-1", "j.f.0.1", report("j.f.0.1")),
            Err(Refusal::NotWaiting)
        );
        assert_eq!(
            w.deliver("a-2", "j.f.0.2", report("j.f.0.2")),
            Err(Refusal::OtherAgent)
        );
        assert_eq!(
            w.deliver("a-1", "k.f.0.2", report("k.f.0.2")),
            Err(Refusal::NotWaiting)
        );
        assert!(!w.nudge("a-2", "j.f.0.2"));
        assert!(waiter.rx.try_recv().is_err());
        assert_eq!(w.len(), 1);
        assert!(w.nudge("a-1", "j.f.0.2"));
        assert!(matches!(waiter.rx.try_recv(), Ok(Push::PollNow)));
    }

    #[test]
    fn a_dropped_waiter_waits_no_more_but_leaves_its_successor() {
        let w = Waiters::default();
        let old = w.wait("j.f.0.1", "a-1");
        let new = w.wait("j.f.0.1", "a-2");
        drop(old);
        assert_eq!(w.len(), 1, "the newer waiter stays");
        drop(new);
        assert!(w.is_empty());
        assert_eq!(
            w.deliver("a-2", "j.f.0.1", report("j.f.0.1")),
            Err(Refusal::NotWaiting)
        );
    }
}
