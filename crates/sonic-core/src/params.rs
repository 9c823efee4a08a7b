//! DAG parameters at one input size (interfaces.md §3, `--params`): what each function needs and
//! how many bytes each edge carries. Written by people for `ofctl plan`, or produced by the
//! regression models ([`crate::regression::DagModels::params_for`]).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::catalog::first_line;
use crate::units::ByteSize;

/// What one function needs, per instance.
///
/// `cold_s` and `hot_s` may be given as distributions (interfaces.md §6): `{ samples: [...] }`
/// or `{ quantiles: { p50: 1.3, p95: 3.8 } }`; the field then holds the distribution's mean and
/// [`FunctionParams::cold_dist`] / [`FunctionParams::hot_dist`] the distribution as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "RawFunction", into = "RawFunction")]
pub struct FunctionParams {
    /// Peak memory of one instance.
    pub memory_mb: f64,
    /// Compute time of an instance in a new container (the mean, when a distribution is given).
    pub cold_s: f64,
    /// Compute time of an instance in a warm container that already ran this function.
    pub hot_s: f64,
    /// The stage's fanout.
    pub instances: u32,
    /// Time a batch of instances takes beyond the mean compute and the data passing the model
    /// counts on its edges (its slowest instance's): sending it, loading the job's input (first
    /// stages), registering its outputs and uploading its results (last stages), its report,
    /// the instances' spread. Paid once per batch (docs/model.md, "Per-instance overhead");
    /// 0 when not given.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub overhead_s: f64,
    /// The same of a batch that runs hot (in warm containers: a VM's later batches, or every
    /// batch of a stage that starts warm), where it differs from `overhead_s` (which is then
    /// the cold batch's): a hot batch pays no spread of cold starts, and what its instances
    /// move may share the VM with each other. `None`: `overhead_s` for every batch.
    pub overhead_hot_s: Option<f64>,
    /// Of `cold_s`, the cold start: creating the instance's container (process environment)
    /// before its lambda runs. A stage whose containers are started while its senders run
    /// (prewarming) pays `cold_s - start_s` for its first batch; 0 when not given.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub start_s: f64,
    /// The share of its compute that spreads over the cores an instance is given (Amdahl's
    /// law, right-sizing): 0 a single-threaded function (a bigger VM does not run it faster),
    /// 1 one that uses every core. `cold_s` and `hot_s` are then times on one core: on `k`
    /// cores, `(1 - parallel + parallel / k)` of them (the cold start excepted). 0 when not
    /// given.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub parallel: f64,
    /// The distribution of `cold_s`, when the file gave one.
    pub cold_dist: Option<TimeValue>,
    /// The distribution of `hot_s`, when the file gave one.
    pub hot_dist: Option<TimeValue>,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// A time as a parameters file may give it: seconds, or a distribution (interfaces.md §6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TimeValue {
    /// Seconds.
    Seconds(f64),
    /// Measured times.
    Samples(SampleTimes),
    /// Quantiles by name (`p50`, `p95`, `p99.9`, ...).
    Quantiles(QuantileTimes),
}

/// `{ samples: [...] }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleTimes {
    pub samples: Vec<f64>,
}

/// `{ quantiles: { p50: ..., p95: ... } }`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuantileTimes {
    pub quantiles: BTreeMap<String, f64>,
}

impl TimeValue {
    /// The distribution it gives.
    pub fn dist(&self) -> Result<crate::dist::Dist, String> {
        use crate::dist::Dist;
        match self {
            TimeValue::Seconds(v) => Dist::point(*v).map_err(|e| e.to_string()),
            TimeValue::Samples(s) => Dist::from_samples(&s.samples).map_err(|e| e.to_string()),
            TimeValue::Quantiles(q) => {
                let mut points = Vec::with_capacity(q.quantiles.len());
                for (name, &v) in &q.quantiles {
                    let p = name
                        .strip_prefix('p')
                        .and_then(|x| x.parse::<f64>().ok())
                        .filter(|p| *p > 0.0 && *p < 100.0)
                        .ok_or_else(|| {
                            format!("quantile {name:?}: a name like p50, p95 or p99.9 is needed")
                        })?;
                    points.push((p / 100.0, v));
                }
                Dist::from_quantiles(&points).map_err(|e| e.to_string())
            }
        }
    }
}

/// [`FunctionParams`] as a file writes it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFunction {
    memory_mb: f64,
    cold_s: TimeValue,
    hot_s: TimeValue,
    instances: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    overhead_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    overhead_hot_s: Option<f64>,
    #[serde(default, skip_serializing_if = "is_zero")]
    start_s: f64,
    #[serde(default, skip_serializing_if = "is_zero")]
    parallel: f64,
}

impl TryFrom<RawFunction> for FunctionParams {
    type Error = String;
    fn try_from(r: RawFunction) -> Result<FunctionParams, String> {
        let time = |field: &str, v: TimeValue| -> Result<(f64, Option<TimeValue>), String> {
            match v {
                TimeValue::Seconds(s) => Ok((s, None)),
                other => {
                    let d = other.dist().map_err(|e| format!("{field}: {e}"))?;
                    Ok((d.mean(), Some(other)))
                }
            }
        };
        let (cold_s, cold_dist) = time("cold_s", r.cold_s)?;
        let (hot_s, hot_dist) = time("hot_s", r.hot_s)?;
        Ok(FunctionParams {
            memory_mb: r.memory_mb,
            cold_s,
            hot_s,
            instances: r.instances,
            overhead_s: r.overhead_s,
            overhead_hot_s: r.overhead_hot_s,
            start_s: r.start_s,
            parallel: r.parallel,
            cold_dist,
            hot_dist,
        })
    }
}

impl From<FunctionParams> for RawFunction {
    fn from(f: FunctionParams) -> RawFunction {
        RawFunction {
            memory_mb: f.memory_mb,
            cold_s: f.cold_dist.unwrap_or(TimeValue::Seconds(f.cold_s)),
            hot_s: f.hot_dist.unwrap_or(TimeValue::Seconds(f.hot_s)),
            instances: f.instances,
            overhead_s: f.overhead_s,
            overhead_hot_s: f.overhead_hot_s,
            start_s: f.start_s,
            parallel: f.parallel,
        }
    }
}

impl FunctionParams {
    /// The distribution of a cold instance's time: the one given, or its mean as a point.
    pub fn cold_times(&self) -> Result<crate::dist::Dist, String> {
        match &self.cold_dist {
            Some(d) => d.dist(),
            None => TimeValue::Seconds(self.cold_s).dist(),
        }
    }

    /// The distribution of a hot instance's time.
    pub fn hot_times(&self) -> Result<crate::dist::Dist, String> {
        match &self.hot_dist {
            Some(d) => d.dist(),
            None => TimeValue::Seconds(self.hot_s).dist(),
        }
    }

    /// Whether either time was given as a distribution.
    pub fn has_distribution(&self) -> bool {
        self.cold_dist.is_some() || self.hot_dist.is_some()
    }
}

/// Bytes on one edge: the total the sending stage writes for the receiving stage.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeParams {
    pub from: String,
    pub to: String,
    pub bytes: ByteSize,
}

/// A checked parameters file.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    pub functions: BTreeMap<String, FunctionParams>,
    #[serde(default)]
    pub edges: Vec<EdgeParams>,
}

/// A refused parameters file.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ParamsError {
    #[error("invalid parameters: {0}")]
    Yaml(String),
    #[error("invalid parameters: {field}: {message}")]
    Invalid { field: String, message: String },
}

impl Params {
    /// Parses and checks a parameters file's text.
    pub fn from_yaml(text: &str) -> Result<Params, ParamsError> {
        if text.len() > crate::yaml::MAX_YAML_BYTES {
            return Err(ParamsError::Yaml(format!(
                "the file has {} bytes; at most {}",
                text.len(),
                crate::yaml::MAX_YAML_BYTES
            )));
        }
        let p: Params = serde_saphyr::from_str_with_options(text, crate::yaml::options())
            .map_err(|e| ParamsError::Yaml(first_line(&e)))?;
        p.check()?;
        Ok(p)
    }

    pub fn to_yaml(&self) -> Result<String, ParamsError> {
        serde_saphyr::to_string(self).map_err(|e| ParamsError::Yaml(e.to_string()))
    }

    /// Memory positive, times at least zero (hot may exceed cold: measurements are noisy),
    /// at least one instance, edges between listed functions, no duplicate edge.
    pub fn check(&self) -> Result<(), ParamsError> {
        let bad = |field: String, message: String| ParamsError::Invalid { field, message };
        if self.functions.is_empty() {
            return Err(bad(
                "functions".into(),
                "at least one function is needed".into(),
            ));
        }
        for (name, f) in &self.functions {
            let at = |x: &str| format!("functions.{name}.{x}");
            if !(f.memory_mb.is_finite() && f.memory_mb > 0.0) {
                return Err(bad(
                    at("memory_mb"),
                    format!("{} is not a positive number", f.memory_mb),
                ));
            }
            for (field, v) in [
                ("cold_s", f.cold_s),
                ("hot_s", f.hot_s),
                ("overhead_s", f.overhead_s),
                ("start_s", f.start_s),
            ] {
                if !(v.is_finite() && v >= 0.0) {
                    return Err(bad(at(field), format!("{v} is not a number >= 0")));
                }
            }
            if f.start_s > f.cold_s {
                return Err(bad(
                    at("start_s"),
                    format!(
                        "the cold start {} is part of the cold time {}: it cannot be longer",
                        f.start_s, f.cold_s
                    ),
                ));
            }
            if f.instances == 0 {
                return Err(bad(at("instances"), "must be at least 1".into()));
            }
            if !(f.parallel.is_finite() && (0.0..=1.0).contains(&f.parallel)) {
                return Err(bad(
                    at("parallel"),
                    format!(
                        "{} is not a share from 0 (single-threaded) to 1 (every core)",
                        f.parallel
                    ),
                ));
            }
        }
        let mut seen = BTreeSet::new();
        for (i, e) in self.edges.iter().enumerate() {
            for (field, name) in [("from", &e.from), ("to", &e.to)] {
                if !self.functions.contains_key(name) {
                    return Err(bad(
                        format!("edges[{i}].{field}"),
                        format!("unknown function {name:?}"),
                    ));
                }
            }
            if e.from == e.to {
                return Err(bad(
                    format!("edges[{i}]"),
                    format!("function {:?} sends to itself", e.from),
                ));
            }
            if !seen.insert((e.from.as_str(), e.to.as_str())) {
                return Err(bad(
                    format!("edges[{i}]"),
                    format!("duplicate edge {} -> {}", e.from, e.to),
                ));
            }
        }
        Ok(())
    }

    /// The bytes on edge `from -> to`, if listed.
    pub fn edge_bytes(&self, from: &str, to: &str) -> Option<ByteSize> {
        self.edges
            .iter()
            .find(|e| e.from == from && e.to == to)
            .map(|e| e.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"
functions:
  pca:     { memory_mb: 3000, cold_s: 10.0, hot_s: 9.4, instances: 1 }
  train:   { memory_mb: 2500, cold_s: 14.0, hot_s: 12.0, instances: 6 }
  combine: { memory_mb: 900,  cold_s: 2.0,  hot_s: 1.8,  instances: 1 }
edges:
  - { from: pca, to: train, bytes: 800MB }    # total bytes the sending stage writes on this edge
  - { from: train, to: combine, bytes: 30MB }
"#;

    #[test]
    fn interfaces_example() {
        let p = Params::from_yaml(EXAMPLE).unwrap();
        assert_eq!(p.functions["train"].instances, 6);
        assert_eq!(p.functions["pca"].memory_mb, 3000.0);
        assert_eq!(p.edge_bytes("pca", "train"), Some(ByteSize(800_000_000)));
        let again = Params::from_yaml(&p.to_yaml().unwrap()).unwrap();
        assert_eq!(again, p);
    }

    /// interfaces.md §6: a time as samples or quantiles; the field holds the mean, the file
    /// writes back what it read; a distribution that is none is refused naming the field.
    #[test]
    fn times_may_be_distributions() {
        let text = r#"
functions:
  a: { memory_mb: 100, cold_s: { samples: [1.0, 2.0, 3.0] }, hot_s: 0.5, instances: 1 }
  b: { memory_mb: 100, cold_s: 2.0, hot_s: { quantiles: { p50: 1.3, p95: 3.8 } }, instances: 2 }
"#;
        let p = Params::from_yaml(text).unwrap();
        let a = &p.functions["a"];
        assert!((a.cold_s - 2.0).abs() < 1e-9 && a.has_distribution());
        assert!((a.cold_times().unwrap().quantile(0.99) - 3.0).abs() < 0.1);
        let b = &p.functions["b"];
        assert!((b.hot_times().unwrap().quantile(0.95) - 3.8).abs() < 0.05);
        assert_eq!(b.cold_dist, None);
        let again = Params::from_yaml(&p.to_yaml().unwrap()).unwrap();
        assert_eq!(again, p);
        check(
            "functions:\n  a: { memory_mb: 1, cold_s: { samples: [] }, hot_s: 1, instances: 1 }\n",
            &["cold_s", "at least one sample"],
        );
        check(
            "functions:\n  a: { memory_mb: 1, cold_s: 1, hot_s: { quantiles: { median: 1 } }, instances: 1 }\n",
            &["hot_s", "p50"],
        );
        check(
            "functions:\n  a: { memory_mb: 1, cold_s: 1, hot_s: 1, instances: 1, speed: 2 }\n",
            &["speed"],
        );
    }

    fn check(text: &str, expect: &[&str]) {
        let err = Params::from_yaml(text).unwrap_err().to_string();
        for e in expect {
            assert!(err.contains(e), "{err:?} should contain {e:?}");
        }
    }

    #[test]
    fn refusals() {
        check("functions: {}\n", &["at least one"]);
        check(
            "functions:\n  a: { memory_mb: 0, cold_s: 1, hot_s: 1, instances: 1 }\n",
            &["functions.a.memory_mb"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: -1, hot_s: 1, instances: 1 }\n",
            &["functions.a.cold_s"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 1, parallel: 1.5 }\n",
            &["functions.a.parallel", "single-threaded"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 0 }\n",
            &["instances"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 1, start_s: 2 }\n",
            &["functions.a.start_s", "cannot be longer"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 1, gpu: 2 }\n",
            &["gpu", "line 2"],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 1 }\nedges:\n  - { from: a, to: b, bytes: 1MB }\n",
            &["edges[0].to", "\"b\""],
        );
        check(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 1, instances: 1 }\nedges:\n  - { from: a, to: a, bytes: 5 parsecs }\n",
            &["line 4"],
        );
    }

    #[test]
    fn hot_may_exceed_cold() {
        let p = Params::from_yaml(
            "functions:\n  a: { memory_mb: 10, cold_s: 1, hot_s: 2, instances: 3 }\n",
        )
        .unwrap();
        assert_eq!(p.functions["a"].hot_s, 2.0);
    }
}
