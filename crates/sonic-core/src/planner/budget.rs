//! Planning under a budget: a limit on wall time, on the memory a search's labels take and on
//! the candidates it evaluates (a deterministic limit, for tests and reproducible runs).
//!
//! The searches meter themselves: every candidate they evaluate and every label they keep (with
//! its size in bytes) goes through a [`Meter`], which compares the counts with the limits at
//! once and reads the clock every [`CLOCK_EVERY`] candidates. Past a limit the meter stays stopped, every search still to
//! run returns at its first step, and the planner answers with the best complete plan it knows
//! (marked not exact) or [`crate::planner::PlanError::Budget`]. Nothing is abandoned running.

use std::cell::Cell;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The memory a search's labels may take by default (1 GiB). A label takes 60 to 450 bytes
/// (the open stages' times, a back pointer), so this is millions of labels.
pub const DEFAULT_MAX_MEMORY: u64 = 1 << 30;

/// The clock is read once per this many candidates (a candidate costs well under a
/// microsecond, so the time limit is overshot by a fraction of a millisecond).
pub const CLOCK_EVERY: u64 = 256;

/// What one planning run may spend. `None`: no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Budget {
    /// Wall time of the whole run (every search it makes), as the [`Stopwatch`] passed with the
    /// budget reads it.
    pub time: Option<Duration>,
    /// Bytes the labels of one search take (its memory; every label it ever kept is counted,
    /// with the states' keys).
    pub max_memory_bytes: Option<u64>,
    /// Candidates (placement, methods, label) evaluated over the whole run.
    pub max_expansions: Option<u64>,
}

impl Default for Budget {
    /// Generous and deterministic: no time limit (the caller that has one passes it),
    /// [`DEFAULT_MAX_MEMORY`] against running out of memory, no candidate limit.
    fn default() -> Self {
        Budget {
            time: None,
            max_memory_bytes: Some(DEFAULT_MAX_MEMORY),
            max_expansions: None,
        }
    }
}

impl Budget {
    /// No limit at all.
    pub const UNLIMITED: Budget = Budget {
        time: None,
        max_memory_bytes: None,
        max_expansions: None,
    };
}

/// How long planning has been running. The control plane passes the [`std::time::Instant`] it
/// started at; tests pass a closure that advances as they like.
pub trait Stopwatch {
    fn elapsed(&self) -> Duration;
}

impl Stopwatch for std::time::Instant {
    fn elapsed(&self) -> Duration {
        std::time::Instant::elapsed(self)
    }
}

impl<F: Fn() -> Duration> Stopwatch for F {
    fn elapsed(&self) -> Duration {
        self()
    }
}

/// A stopwatch that never advances, for budgets without a time limit.
pub(crate) struct Frozen;

impl Stopwatch for Frozen {
    fn elapsed(&self) -> Duration {
        Duration::ZERO
    }
}

/// The limit that stopped a search.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "limit", rename_all = "snake_case")]
pub enum Limit {
    /// The time limit, in milliseconds.
    Time { ms: u64 },
    /// The cap on the memory of one search's labels.
    Memory { bytes: u64 },
    /// The cap on candidates evaluated.
    Expansions { max: u64 },
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Limit::Time { ms } => write!(f, "the time limit of {ms} ms"),
            Limit::Memory { bytes } => {
                write!(f, "the memory limit of {} MiB", bytes.div_ceil(1 << 20))
            }
            Limit::Expansions { max } => write!(f, "the limit of {max} candidates evaluated"),
        }
    }
}

/// Which search a limit stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StoppedSearch {
    /// The search for the best plan: `best` is the best plan found, not proven optimal.
    Best,
    /// The search for the second-best plan: `best` is exact, `second_best` is not.
    SecondBest,
}

/// A limit cut a search short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stopped {
    #[serde(flatten)]
    pub limit: Limit,
    pub search: StoppedSearch,
}

impl fmt::Display for Stopped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.search {
            StoppedSearch::Best => write!(
                f,
                "not proven optimal: the search stopped at {}; this is the best plan found within it",
                self.limit
            ),
            StoppedSearch::SecondBest => write!(
                f,
                "the best plan is exact; the search for the second-best one stopped at {}",
                self.limit
            ),
        }
    }
}

/// What one planning run has spent, shared by its searches (which take `&self`).
pub(crate) struct Meter<'a> {
    budget: Budget,
    clock: &'a dyn Stopwatch,
    expansions: Cell<u64>,
    bytes: Cell<u64>,
    stopped: Cell<Option<Limit>>,
}

impl<'a> Meter<'a> {
    pub fn new(budget: Budget, clock: &'a dyn Stopwatch) -> Meter<'a> {
        Meter {
            budget,
            clock,
            expansions: Cell::new(0),
            bytes: Cell::new(0),
            stopped: Cell::new(None),
        }
    }

    /// A meter with no limit (for tests of the searches themselves).
    #[cfg(test)]
    pub fn unlimited() -> Meter<'static> {
        Meter::new(Budget::UNLIMITED, &Frozen)
    }

    /// The limit a search passed, if one did: it stays passed.
    pub fn stopped(&self) -> Option<Limit> {
        self.stopped.get()
    }

    fn stop(&self, limit: Limit) -> Result<(), Limit> {
        self.stopped.set(Some(limit));
        Err(limit)
    }

    /// Whether a search may go on; reads the clock.
    pub fn check(&self) -> Result<(), Limit> {
        if let Some(l) = self.stopped.get() {
            return Err(l);
        }
        if let Some(t) = self.budget.time
            && self.clock.elapsed() >= t
        {
            let ms = u64::try_from(t.as_millis()).unwrap_or(u64::MAX);
            return self.stop(Limit::Time { ms });
        }
        Ok(())
    }

    /// `n` more candidates evaluated.
    #[inline]
    pub fn expand(&self, n: u64) -> Result<(), Limit> {
        if let Some(l) = self.stopped.get() {
            return Err(l);
        }
        let before = self.expansions.get();
        let after = before.saturating_add(n);
        self.expansions.set(after);
        if let Some(max) = self.budget.max_expansions
            && after > max
        {
            return self.stop(Limit::Expansions { max });
        }
        if before / CLOCK_EVERY != after / CLOCK_EVERY {
            return self.check();
        }
        Ok(())
    }

    /// A new search starts: it holds no label yet.
    pub fn new_search(&self) {
        self.bytes.set(0);
    }

    /// The current search keeps `bytes` more (a label, a state).
    #[inline]
    pub fn keep(&self, bytes: u64) -> Result<(), Limit> {
        let n = self.bytes.get().saturating_add(bytes);
        self.bytes.set(n);
        match self.budget.max_memory_bytes {
            Some(max) if n > max => self.stop(Limit::Memory { bytes: max }),
            _ => Ok(()),
        }
    }

    /// Candidates evaluated so far.
    pub fn expansions(&self) -> u64 {
        self.expansions.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_stop_and_stay_stopped() {
        let m = Meter::new(
            Budget {
                max_expansions: Some(3),
                ..Budget::UNLIMITED
            },
            &Frozen,
        );
        assert!(m.expand(3).is_ok());
        assert_eq!(m.expand(1), Err(Limit::Expansions { max: 3 }));
        assert_eq!(m.check(), Err(Limit::Expansions { max: 3 }));
        assert_eq!(m.keep(100), Ok(()));

        let m = Meter::new(
            Budget {
                max_memory_bytes: Some(200),
                ..Budget::UNLIMITED
            },
            &Frozen,
        );
        m.keep(100).unwrap();
        m.keep(100).unwrap();
        m.new_search();
        m.keep(100).unwrap();
        m.keep(100).unwrap();
        assert_eq!(m.keep(1), Err(Limit::Memory { bytes: 200 }));
        assert_eq!(m.expand(1), Err(Limit::Memory { bytes: 200 }));
        assert_eq!(
            Limit::Memory { bytes: 256 << 20 }.to_string(),
            "the memory limit of 256 MiB"
        );
    }

    #[test]
    fn the_clock_is_read_every_so_many_candidates() {
        let reads = Cell::new(0u64);
        let clock = || {
            reads.set(reads.get() + 1);
            Duration::from_millis(reads.get())
        };
        let m = Meter::new(
            Budget {
                time: Some(Duration::from_millis(3)),
                ..Budget::UNLIMITED
            },
            &clock,
        );
        for _ in 0..CLOCK_EVERY - 1 {
            m.expand(1).unwrap();
        }
        assert_eq!(reads.get(), 0, "no read before the cadence");
        m.expand(1).unwrap();
        m.expand(CLOCK_EVERY).unwrap();
        assert_eq!(reads.get(), 2);
        assert_eq!(m.expand(CLOCK_EVERY), Err(Limit::Time { ms: 3 }));
        assert_eq!(m.check(), Err(Limit::Time { ms: 3 }));
        assert_eq!(reads.get(), 3, "a stopped meter no longer reads the clock");
    }

    #[test]
    fn stopped_serializes_flat() {
        let s = Stopped {
            limit: Limit::Time { ms: 2000 },
            search: StoppedSearch::Best,
        };
        let v = serde_json::to_value(s).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"limit": "time", "ms": 2000, "search": "best"})
        );
        assert_eq!(serde_json::from_value::<Stopped>(v).unwrap(), s);
    }
}
