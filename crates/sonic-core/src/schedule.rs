//! Schedules: when a cron trigger fires (a lambda's `ol.yaml` `triggers.cron`, a DAG's
//! `triggers: - schedule:`), in UTC.
//!
//! A schedule is a cron pattern of five fields (minute, hour, day of month, month, day of week)
//! or six with seconds first, a nickname (`@hourly`, `@daily`, `@weekly`, `@monthly`,
//! `@yearly`), or `@every <duration>` (`@every 90s`, `@every 1h30m`), as OpenLambda's cron
//! library reads them. Patterns are parsed by `croner`. Pure: the daemons' scheduler
//! (`sonic_daemon::cron`) waits for the times.

use std::fmt;
use std::str::FromStr;
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

impl serde::Serialize for Schedule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> serde::Deserialize<'de> for Schedule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Schedule, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The first time after `after` that any of `schedules` names.
pub fn next_of(schedules: &[Schedule], after: SystemTime) -> Option<SystemTime> {
    schedules.iter().filter_map(|s| s.next_after(after)).min()
}

#[cfg(test)]
mod tests {
    use super::*;

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
        assert_eq!(
            next_of(&[every.clone(), every_5m.clone()], t),
            Some(at(1_700_000_100))
        );
        assert_eq!(
            serde_json::to_string(&every).expect("encodes"),
            "\"@every 1h30m\""
        );
        let back: Schedule = serde_json::from_str("\"*/5 * * * *\"").expect("decodes");
        assert_eq!(back, every_5m);
        assert!(serde_json::from_str::<Schedule>("\"soon\"").is_err());
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
}
