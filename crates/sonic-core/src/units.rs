//! Sizes and durations as users write them in YAML: `800MB`, `1.5GiB`, `300s`, `250ms`, `2m`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A number of bytes. Parses `B`, `KB`, `MB`, `GB`, `TB` (powers of 1000) and `KiB`, `MiB`, `GiB`,
/// `TiB` (powers of 1024); a bare number is bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// A span of time. Parses `ms`, `s`, `m`, `h`; a bare number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Default)]
pub struct Seconds(pub f64);

/// Why a size or a duration did not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UnitError {
    #[error("{0:?} is not a size (use a number with B, KB, MB, GB, KiB, MiB or GiB)")]
    BadSize(String),
    #[error("{0:?} is not a duration (use a number with ms, s, m or h)")]
    BadDuration(String),
}

const SIZE_UNITS: &[(&str, f64)] = &[
    ("TiB", 1024.0 * 1024.0 * 1024.0 * 1024.0),
    ("GiB", 1024.0 * 1024.0 * 1024.0),
    ("MiB", 1024.0 * 1024.0),
    ("KiB", 1024.0),
    ("TB", 1e12),
    ("GB", 1e9),
    ("MB", 1e6),
    ("KB", 1e3),
    ("kB", 1e3),
    ("B", 1.0),
];

const TIME_UNITS: &[(&str, f64)] = &[("ms", 1e-3), ("s", 1.0), ("m", 60.0), ("h", 3600.0)];

/// Splits `"12.5 MB"` into `(12.5, "MB")`, refusing negative, non-finite and empty numbers.
fn split_number(s: &str) -> Option<(f64, &str)> {
    let s = s.trim();
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    if num.is_empty() || num.starts_with('.') && num.len() == 1 {
        return None;
    }
    let value: f64 = num.replace('_', "").parse().ok()?;
    value.is_finite().then_some((value, unit.trim()))
}

impl FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnitError::BadSize(s.to_owned());
        let (value, unit) = split_number(s).ok_or_else(bad)?;
        let factor = if unit.is_empty() {
            1.0
        } else {
            SIZE_UNITS
                .iter()
                .find(|(u, _)| *u == unit)
                .map(|(_, f)| *f)
                .ok_or_else(bad)?
        };
        let bytes = (value * factor).round();
        if bytes > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl FromStr for Seconds {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || UnitError::BadDuration(s.to_owned());
        let (value, unit) = split_number(s).ok_or_else(bad)?;
        let factor = if unit.is_empty() {
            1.0
        } else {
            TIME_UNITS
                .iter()
                .find(|(u, _)| *u == unit)
                .map(|(_, f)| *f)
                .ok_or_else(bad)?
        };
        Ok(Seconds(value * factor))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0 as f64;
        match self.0 {
            n if n >= 1_000_000_000 => write!(f, "{:.2}GB", b / 1e9),
            n if n >= 1_000_000 => write!(f, "{:.2}MB", b / 1e6),
            n if n >= 1_000 => write!(f, "{:.2}KB", b / 1e3),
            n => write!(f, "{n}B"),
        }
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 < 1.0 {
            write!(f, "{:.0}ms", self.0 * 1e3)
        } else {
            write!(f, "{}s", self.0)
        }
    }
}

/// Either a YAML number or a string with a unit.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumOrStr {
    U(u64),
    F(f64),
    S(String),
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::U(n) => Ok(ByteSize(n)),
            NumOrStr::F(x) if x.is_finite() && x >= 0.0 => Ok(ByteSize(x.round() as u64)),
            NumOrStr::F(x) => Err(serde::de::Error::custom(UnitError::BadSize(x.to_string()))),
            NumOrStr::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match NumOrStr::deserialize(d)? {
            NumOrStr::U(n) => Ok(Seconds(n as f64)),
            NumOrStr::F(x) if x.is_finite() && x >= 0.0 => Ok(Seconds(x)),
            NumOrStr::F(x) => Err(serde::de::Error::custom(UnitError::BadDuration(
                x.to_string(),
            ))),
            NumOrStr::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl Serialize for Seconds {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_size(input: &str, expect: Option<u64>) {
        assert_eq!(
            input.parse::<ByteSize>().ok().map(|b| b.0),
            expect,
            "{input}"
        );
    }

    fn check_time(input: &str, expect: Option<f64>) {
        assert_eq!(
            input.parse::<Seconds>().ok().map(|s| s.0),
            expect,
            "{input}"
        );
    }

    #[test]
    fn sizes() {
        check_size("800MB", Some(800_000_000));
        check_size("1.5GiB", Some(1_610_612_736));
        check_size("12 KiB", Some(12_288));
        check_size("30B", Some(30));
        check_size("42", Some(42));
        check_size("1_000KB", Some(1_000_000));
        check_size("-5MB", None);
        check_size("MB", None);
        check_size("5 parsecs", None);
        check_size("", None);
        check_size("1e999GB", None);
    }

    #[test]
    fn durations() {
        check_time("300s", Some(300.0));
        check_time("250ms", Some(0.25));
        check_time("2m", Some(120.0));
        check_time("1h", Some(3600.0));
        check_time("7", Some(7.0));
        check_time("fast", None);
        check_time("-1s", None);
        check_time("3 weeks", None);
    }
}
