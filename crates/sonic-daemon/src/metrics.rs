//! A small metrics registry rendered in the Prometheus text format (0.0.4): counters, gauges and
//! histograms with fixed label names, one registry per daemon.
//!
//! Hand-rolled rather than the `metrics` crates: those record into one global recorder, and
//! `ofctl up` runs a control plane and several agents in one process, each of which must expose
//! only its own series. Label values must come from bounded sets (route templates, statuses,
//! policies, methods, VM types, DAG and function names); never a job id or a raw path.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What kind of series a family holds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    /// A histogram with these upper bounds (ascending; `+Inf` is implied).
    Histogram(&'static [f64]),
}

/// One metric family: its name, help line, kind and label names.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Desc {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
}

impl Desc {
    pub const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Desc {
        Desc {
            name,
            help,
            kind: Kind::Counter,
            labels,
        }
    }

    pub const fn gauge(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Desc {
        Desc {
            name,
            help,
            kind: Kind::Gauge,
            labels,
        }
    }

    pub const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Desc {
        Desc {
            name,
            help,
            kind: Kind::Histogram(buckets),
            labels,
        }
    }
}

/// Bucket bounds for durations from milliseconds to minutes, in seconds.
pub const SECONDS_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Bucket bounds for relative errors (0.1 = 10%).
pub const RATIO_BUCKETS: &[f64] = &[0.01, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0];

#[derive(Debug, Clone)]
enum Value {
    Scalar(f64),
    Histogram {
        counts: Vec<u64>,
        sum: f64,
        count: u64,
    },
}

#[derive(Debug)]
struct Family {
    desc: Desc,
    series: BTreeMap<Vec<String>, Value>,
}

/// A set of metric families, rendered in the order they were declared.
#[derive(Debug, Default)]
pub struct Registry {
    families: Mutex<Vec<Family>>,
}

impl Registry {
    /// A registry with these families (each rendered with its help and type even before it has
    /// a series).
    pub fn new(descs: &[Desc]) -> Registry {
        let r = Registry::default();
        for d in descs {
            r.with(d, |_| {});
        }
        r
    }

    fn with<T>(&self, desc: &Desc, f: impl FnOnce(&mut Family) -> T) -> T {
        let mut families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let i = match families.iter().position(|fam| fam.desc.name == desc.name) {
            Some(i) => i,
            None => {
                families.push(Family {
                    desc: *desc,
                    series: BTreeMap::new(),
                });
                families.len() - 1
            }
        };
        f(&mut families[i])
    }

    fn key(desc: &Desc, values: &[&str]) -> Vec<String> {
        debug_assert_eq!(
            desc.labels.len(),
            values.len(),
            "{}: label values do not match the label names",
            desc.name
        );
        values.iter().map(|v| (*v).to_owned()).collect()
    }

    /// Adds `v` to a counter (or a gauge).
    pub fn add(&self, desc: &Desc, values: &[&str], v: f64) {
        let key = Self::key(desc, values);
        self.with(desc, |f| {
            if let Value::Scalar(x) = f.series.entry(key).or_insert(Value::Scalar(0.0)) {
                *x += v;
            }
        });
    }

    /// Adds one to a counter.
    pub fn inc(&self, desc: &Desc, values: &[&str]) {
        self.add(desc, values, 1.0);
    }

    /// Sets a gauge.
    pub fn set(&self, desc: &Desc, values: &[&str], v: f64) {
        let key = Self::key(desc, values);
        self.with(desc, |f| {
            f.series.insert(key, Value::Scalar(v));
        });
    }

    /// Makes a series exist (at zero) without changing it: known label values show from the
    /// first scrape.
    pub fn touch(&self, desc: &Desc, values: &[&str]) {
        let key = Self::key(desc, values);
        let buckets = match desc.kind {
            Kind::Histogram(b) => Some(b.len()),
            _ => None,
        };
        self.with(desc, |f| {
            f.series.entry(key).or_insert_with(|| match buckets {
                Some(n) => Value::Histogram {
                    counts: vec![0; n],
                    sum: 0.0,
                    count: 0,
                },
                None => Value::Scalar(0.0),
            });
        });
    }

    /// Drops every series of a family (gauges recomputed at each scrape).
    pub fn clear(&self, desc: &Desc) {
        self.with(desc, |f| f.series.clear());
    }

    /// Records one observation in a histogram.
    pub fn observe(&self, desc: &Desc, values: &[&str], v: f64) {
        let Kind::Histogram(bounds) = desc.kind else {
            return;
        };
        if !v.is_finite() {
            return;
        }
        let key = Self::key(desc, values);
        self.with(desc, |f| {
            let entry = f.series.entry(key).or_insert_with(|| Value::Histogram {
                counts: vec![0; bounds.len()],
                sum: 0.0,
                count: 0,
            });
            if let Value::Histogram { counts, sum, count } = entry {
                for (c, b) in counts.iter_mut().zip(bounds) {
                    if v <= *b {
                        *c += 1;
                    }
                }
                *sum += v;
                *count += 1;
            }
        });
    }

    /// The value of a counter or gauge series (0 when it does not exist); a histogram's count.
    pub fn value(&self, desc: &Desc, values: &[&str]) -> f64 {
        let key = Self::key(desc, values);
        self.with(desc, |f| match f.series.get(&key) {
            Some(Value::Scalar(x)) => *x,
            Some(Value::Histogram { count, .. }) => *count as f64,
            None => 0.0,
        })
    }

    /// The whole exposition.
    pub fn render(&self) -> String {
        let families = self.families.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = String::new();
        for f in families.iter() {
            let d = &f.desc;
            let kind = match d.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram(_) => "histogram",
            };
            let _ = writeln!(out, "# HELP {} {}", d.name, d.help);
            let _ = writeln!(out, "# TYPE {} {kind}", d.name);
            if f.series.is_empty() && d.labels.is_empty() && !matches!(d.kind, Kind::Histogram(_)) {
                let _ = writeln!(out, "{} 0", d.name);
            }
            for (values, value) in &f.series {
                let labels = labels(d.labels, values, None);
                match value {
                    Value::Scalar(x) => {
                        let _ = writeln!(out, "{}{labels} {}", d.name, number(*x));
                    }
                    Value::Histogram { counts, sum, count } => {
                        let Kind::Histogram(bounds) = d.kind else {
                            continue;
                        };
                        for (b, c) in bounds.iter().zip(counts) {
                            let l = labels_with_le(d.labels, values, &number(*b));
                            let _ = writeln!(out, "{}_bucket{l} {c}", d.name);
                        }
                        let l = labels_with_le(d.labels, values, "+Inf");
                        let _ = writeln!(out, "{}_bucket{l} {count}", d.name);
                        let _ = writeln!(out, "{}_sum{labels} {}", d.name, number(*sum));
                        let _ = writeln!(out, "{}_count{labels} {count}", d.name);
                    }
                }
            }
        }
        out
    }
}

fn labels_with_le(names: &[&str], values: &[String], le: &str) -> String {
    labels(names, values, Some(le))
}

fn labels(names: &[&str], values: &[String], le: Option<&str>) -> String {
    let mut parts: Vec<String> = names
        .iter()
        .zip(values)
        .map(|(n, v)| format!("{n}=\"{}\"", escape(v)))
        .collect();
    if let Some(le) = le {
        parts.push(format!("le=\"{le}\""));
    }
    if parts.is_empty() {
        String::new()
    } else {
        format!("{{{}}}", parts.join(","))
    }
}

/// A sample value as the text format writes it.
pub fn number(x: f64) -> String {
    if x.is_nan() {
        "NaN".into()
    } else if x.is_infinite() {
        if x > 0.0 { "+Inf" } else { "-Inf" }.into()
    } else {
        format!("{x}")
    }
}

/// Escapes a label value as the text format requires.
pub fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// The value of the first sample of `name` whose labels include every `labels` pair, read back
/// from an exposition (for tests and for the dashboard reading an agent's own report).
pub fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (n, rest) = match series.split_once('{') {
                Some((n, rest)) => (n, rest.strip_suffix('}')?),
                None => (series, ""),
            };
            if n != name {
                return None;
            }
            let all = labels
                .iter()
                .all(|(k, v)| rest.contains(&format!("{k}=\"{}\"", escape(v))));
            if !all {
                return None;
            }
            match value {
                "+Inf" => Some(f64::INFINITY),
                "-Inf" => Some(f64::NEG_INFINITY),
                v => v.parse().ok(),
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    const REQ: Desc = Desc::counter("t_requests_total", "Requests.", &["route", "status"]);
    const UP: Desc = Desc::gauge("t_up", "Up.", &[]);
    const LAT: Desc = Desc::histogram("t_latency_seconds", "Latency.", &["kind"], &[0.1, 1.0]);

    #[test]
    fn renders_every_kind() {
        let r = Registry::new(&[REQ, UP, LAT]);
        let empty = r.render();
        assert!(empty.contains("# TYPE t_requests_total counter\n"));
        assert!(empty.contains("t_up 0\n"), "{empty}");
        r.inc(&REQ, &["/v1/dags", "200"]);
        r.add(&REQ, &["/v1/dags", "200"], 2.0);
        r.inc(&REQ, &["a\"b\\c\nd", "404"]);
        r.set(&UP, &[], 1.0);
        r.observe(&LAT, &["x"], 0.0625);
        r.observe(&LAT, &["x"], 0.5);
        r.observe(&LAT, &["x"], 4.0);
        r.observe(&LAT, &["x"], f64::NAN);
        let text = r.render();
        for line in [
            "t_requests_total{route=\"/v1/dags\",status=\"200\"} 3",
            "t_requests_total{route=\"a\\\"b\\\\c\\nd\",status=\"404\"} 1",
            "t_up 1",
            "t_latency_seconds_bucket{kind=\"x\",le=\"0.1\"} 1",
            "t_latency_seconds_bucket{kind=\"x\",le=\"1\"} 2",
            "t_latency_seconds_bucket{kind=\"x\",le=\"+Inf\"} 3",
            "t_latency_seconds_sum{kind=\"x\"} 4.5625",
            "t_latency_seconds_count{kind=\"x\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?}:\n{text}");
        }
        // Every sample line is `name{labels} value` with a number as the value.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(
                value.parse::<f64>().is_ok() || value == "+Inf",
                "bad sample line {line:?}"
            );
        }
        assert_eq!(r.value(&REQ, &["/v1/dags", "200"]), 3.0);
        assert_eq!(r.value(&LAT, &["x"]), 3.0);
        assert_eq!(
            sample(&text, "t_requests_total", &[("status", "200")]),
            Some(3.0)
        );
        assert_eq!(sample(&text, "t_latency_seconds_count", &[]), Some(3.0));
        assert_eq!(sample(&text, "t_missing", &[]), None);
        r.clear(&UP);
        r.touch(&LAT, &["y"]);
        let text = r.render();
        assert!(!text.contains("t_up 1"));
        assert!(
            text.contains("t_latency_seconds_count{kind=\"y\"} 0\n"),
            "{text}"
        );
    }
}
