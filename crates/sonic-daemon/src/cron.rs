//! Schedules (cron patterns, in UTC) and one scheduler that fires what each key was given at
//! the times its schedules name: the OpenLambda listener's `ol.yaml` cron triggers run on it.
//!
//! A schedule is a cron pattern of five fields (minute, hour, day of month, month, day of week)
//! or six with seconds first, a nickname (`@hourly`, `@daily`, `@weekly`, `@monthly`,
//! `@yearly`), or `@every <duration>` (`@every 90s`, `@every 1h30m`), as OpenLambda's cron
//! library reads them. Patterns are parsed by `croner`.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::hash::Hash;
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A parsed schedule.
#[derive(Clone)]
pub struct Schedule {
    text: String,
    kind: Kind,
}

#[derive(Clone)]
enum Kind {
    Pattern(Box<croner::Cron>),
    Every(Duration),
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Schedule").field(&self.text).finish()
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl PartialEq for Schedule {
    fn eq(&self, other: &Schedule) -> bool {
        self.text == other.text
    }
}

impl FromStr for Schedule {
    type Err = String;

    fn from_str(text: &str) -> Result<Schedule, String> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err("a cron schedule cannot be empty".into());
        }
        let kind = match trimmed.strip_prefix("@every") {
            Some(rest) => {
                let every = every(rest.trim()).ok_or_else(|| {
                    format!("`{trimmed}`: @every takes a duration such as 90s, 5m or 1h30m")
                })?;
                if every < Duration::from_secs(1) {
                    return Err(format!("`{trimmed}`: @every must be at least 1s"));
                }
                Kind::Every(every)
            }
            None => Kind::Pattern(Box::new(
                croner::Cron::from_str(trimmed)
                    .map_err(|e| format!("`{trimmed}` is not a cron schedule: {e}"))?,
            )),
        };
        Ok(Schedule {
            text: trimmed.to_owned(),
            kind,
        })
    }
}

/// Go's duration syntax as `@every` takes it: numbers with `h`, `m`, `s` or `ms`, one after
/// the other (`1h30m`, `90s`, `500ms`).
fn every(text: &str) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut rest = text;
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit() && c != '.')?;
        let (number, after) = rest.split_at(digits);
        let value: f64 = number.parse().ok()?;
        let unit_len = after
            .find(|c: char| c.is_ascii_digit())
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let secs = match unit {
            "h" => value * 3600.0,
            "m" => value * 60.0,
            "s" => value,
            "ms" => value / 1000.0,
            _ => return None,
        };
        total += Duration::try_from_secs_f64(secs).ok()?;
        rest = next;
    }
    Some(total)
}

impl Schedule {
    /// The first time after `after` it names (`None`: never again).
    pub fn next_after(&self, after: SystemTime) -> Option<SystemTime> {
        match &self.kind {
            Kind::Every(d) => after.checked_add(*d),
            Kind::Pattern(cron) => {
                let since = after.duration_since(UNIX_EPOCH).ok()?;
                let secs = i64::try_from(since.as_secs()).ok()?;
                let at = chrono::DateTime::from_timestamp(secs, since.subsec_nanos())?;
                let next = cron.find_next_occurrence(&at, false).ok()?;
                let secs = u64::try_from(next.timestamp()).ok()?;
                UNIX_EPOCH.checked_add(Duration::new(secs, next.timestamp_subsec_nanos()))
            }
        }
    }
}

/// Fires, per key, what it was given at the times of its schedules, until the key is set again
/// or removed, or the scheduler is dropped. Each firing runs as a task of its own, so a slow one
/// does not hold back the next.
pub struct Scheduler<K> {
    entries: Mutex<HashMap<K, tokio::task::AbortHandle>>,
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

    /// Schedules `fire` at the times of `schedules` for `key`, in place of what the key had
    /// (none: removes it). Needs a Tokio runtime.
    pub fn set<F, Fut>(&self, key: K, schedules: Vec<Schedule>, fire: F)
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        if schedules.is_empty() {
            self.remove(&key);
            return;
        }
        let name = key.to_string();
        let task = tokio::spawn(async move {
            // Wall-clock times, reached on Tokio's clock (so that a paused clock in tests moves
            // them too).
            let (start, start_at) = (SystemTime::now(), tokio::time::Instant::now());
            let mut after = start;
            loop {
                let Some(next) = schedules.iter().filter_map(|s| s.next_after(after)).min() else {
                    tracing::info!(key = %name, "its schedules name no time after this one");
                    return;
                };
                let offset = next.duration_since(start).unwrap_or(Duration::ZERO);
                tokio::time::sleep_until(start_at + offset).await;
                tokio::spawn(fire());
                after = next;
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

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn patterns_nicknames_and_every() {
        // 2023-11-14 22:13:20 UTC.
        let t = at(1_700_000_000);
        let every_5m: Schedule = "*/5 * * * *".parse().expect("parses");
        assert_eq!(every_5m.next_after(t), Some(at(1_700_000_100)), "22:15:00");
        let seconds: Schedule = "*/10 * * * * *".parse().expect("parses");
        assert_eq!(seconds.next_after(t), Some(at(1_700_000_010)));
        let hourly: Schedule = "@hourly".parse().expect("parses");
        assert_eq!(hourly.next_after(t), Some(at(1_700_002_800)), "23:00:00");
        let every: Schedule = "@every 1h30m".parse().expect("parses");
        assert_eq!(every.next_after(t), Some(at(1_700_005_400)));
        assert_eq!(every.to_string(), "@every 1h30m");
        for bad in [
            "",
            "  ",
            "* * *",
            "61 * * * *",
            "@every",
            "@every 5x",
            "@every 0s",
            "@sometimes",
        ] {
            assert!(bad.parse::<Schedule>().is_err(), "{bad:?} accepted");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_key_fires_on_its_schedule_until_removed_or_set_again() {
        let scheduler = Scheduler::new();
        let fired = Arc::new(AtomicUsize::new(0));
        let count = {
            let fired = fired.clone();
            move || {
                let fired = fired.clone();
                async move {
                    fired.fetch_add(1, Ordering::SeqCst);
                }
            }
        };
        let every: Schedule = "@every 10s".parse().expect("parses");
        scheduler.set("a".to_owned(), vec![every.clone()], count.clone());
        assert_eq!(scheduler.keys(), ["a"]);
        // The clock is paused: sleeping advances it, and each firing runs once due.
        tokio::time::sleep(Duration::from_secs(35)).await;
        tokio::task::yield_now().await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
        // Set again with no schedule: removed.
        scheduler.set("a".to_owned(), Vec::new(), count.clone());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
        assert!(scheduler.keys().is_empty());
        scheduler.set("b".to_owned(), vec![every], count);
        scheduler.remove(&"b".to_owned());
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(fired.load(Ordering::SeqCst), 3);
    }
}
