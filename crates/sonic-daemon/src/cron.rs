//! One scheduler for what fires on a schedule: per key, a task that waits on Tokio's clock for
//! the next time the key's schedule names and then fires what it was given. The OpenLambda
//! listener's `ol.yaml` cron triggers and the control plane's DAG triggers run on it; the times
//! come from `sonic_core::schedule`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

/// Fires, per key, what it was given at the times of its schedules, until the key is set again
/// or removed, or the scheduler is dropped. Each firing runs as a task of its own, so a slow one
/// does not hold back the next.
pub struct Scheduler<K> {
    entries: Mutex<HashMap<K, tokio::task::AbortHandle>>,
}

impl<K: fmt::Debug> fmt::Debug for Scheduler<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_set().entries(entries.keys()).finish()
    }
}

impl<K> Default for Scheduler<K> {
    fn default() -> Self {
        Scheduler {
            entries: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash + Clone + fmt::Display + Send + 'static> Scheduler<K> {
    /// A scheduler with nothing scheduled.
    pub fn new() -> Scheduler<K> {
        Scheduler::default()
    }

    /// Schedules `fire` for `key` at each time `next` names (given the time before it: the
    /// first after now, then the one after that, until `None`), in place of what the key had;
    /// `fire` gets the time it fires for. Needs a Tokio runtime.
    pub fn set<N, F, Fut>(&self, key: K, next: N, fire: F)
    where
        N: Fn(SystemTime) -> Option<SystemTime> + Send + 'static,
        F: Fn(SystemTime) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let name = key.to_string();
        let task = tokio::spawn(async move {
            // Wall-clock times, reached on Tokio's clock (so that a paused clock in tests moves
            // them too).
            let (start, start_at) = (SystemTime::now(), tokio::time::Instant::now());
            let mut after = start;
            loop {
                let Some(at) = next(after) else {
                    tracing::info!(key = %name, "its schedule names no time after this one");
                    return;
                };
                let offset = at.duration_since(start).unwrap_or(Duration::ZERO);
                tokio::time::sleep_until(start_at + offset).await;
                tokio::spawn(fire(at));
                after = at;
            }
        });
        let old = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, task.abort_handle());
        if let Some(old) = old {
            old.abort();
        }
    }

    /// Stops what `key` had scheduled.
    pub fn remove(&self, key: &K) {
        let old = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(key);
        if let Some(old) = old {
            old.abort();
        }
    }

    /// The keys with something scheduled.
    pub fn keys(&self) -> Vec<K> {
        self.entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Stops everything.
    pub fn clear(&self) {
        let all: Vec<_> = self
            .entries
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .map(|(_, t)| t)
            .collect();
        for t in all {
            t.abort();
        }
    }
}

impl<K> Drop for Scheduler<K> {
    fn drop(&mut self) {
        let entries = self.entries.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, t) in entries.drain() {
            t.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// Every ten seconds.
    fn every_10s(after: SystemTime) -> Option<SystemTime> {
        after.checked_add(Duration::from_secs(10))
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_fires_on_its_schedule_until_removed_or_set_again() {
        let scheduler = Scheduler::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let count = {
            let fired = fired.clone();
            move |_at: SystemTime| {
                let fired = fired.clone();
                async move {
                    fired.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        scheduler.set("a".to_owned(), every_10s, count.clone());
        assert_eq!(scheduler.keys(), ["a"]);
        // The clock is paused: sleeping advances it, and each firing runs once due.
        tokio::time::sleep(Duration::from_secs(35)).await;
        tokio::task::yield_now().await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
        // Set again: the old schedule stops, the new one counts from now.
        scheduler.set("a".to_owned(), |_| None, count.clone());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
        scheduler.set("b".to_owned(), every_10s, count);
        scheduler.remove(&"b".to_owned());
        assert!(!scheduler.keys().contains(&"b".to_owned()));
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
    }
}
