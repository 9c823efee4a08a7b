//! Fig. 10: the error of each parameter's prediction against the number of profiling jobs its
//! model was fitted on. The samples are the ones the control plane recorded for the profiling
//! jobs (`GET /v1/dags/{name}/models`); each model is refitted here on the first k training
//! samples, with the control plane's own regression (`sonic_core::regression`), and scored on a
//! fixed held-out set, as §5.6.1 of the paper does.

use serde_json::Value;
use sonic_control::learn::{SEED, sample_parts};
use sonic_control::store::SampleRecord;
use sonic_core::regression::{Model, Quantity};

/// One point: a parameter's mean absolute percentage error on the held-out jobs after fitting
/// on `train_jobs` jobs.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorPoint {
    pub app: String,
    pub parameter: String,
    pub train_jobs: usize,
    /// Percent.
    pub mape: f64,
}

/// One sample's measured values: `(parameter, quantity, value)`.
type Values = Vec<(String, Quantity, f64)>;

/// One sample as pairs `(parameter, quantity, value)`.
fn values(s: &SampleRecord) -> Values {
    let (functions, edges) = sample_parts(s);
    let mut out = Vec::new();
    for (name, f) in functions {
        if let Some(v) = f.memory_mb {
            out.push((format!("{name}.memory_mb"), Quantity::Memory, v));
        }
        if let Some(v) = f.cold_s {
            out.push((format!("{name}.cold_s"), Quantity::Time, v));
        }
        if let Some(v) = f.instances {
            out.push((format!("{name}.instances"), Quantity::Fanout, f64::from(v)));
        }
    }
    for e in edges {
        out.push((
            format!("{}->{}.bytes", e.from, e.to),
            Quantity::Memory,
            e.bytes.0 as f64,
        ));
    }
    out
}

/// The samples of `GET /v1/dags/{name}/models` (`samples`: job, input_bytes, measured).
pub fn samples_from_view(dag: &str, samples: &[Value]) -> Vec<SampleRecord> {
    samples
        .iter()
        .filter_map(|s| {
            Some(SampleRecord {
                dag: dag.to_owned(),
                job: s["job"].as_str()?.to_owned(),
                input_bytes: s["input_bytes"].as_u64()?,
                measured: s["measured"].clone(),
                created_ms: s["created_ms"].as_i64().unwrap_or(0),
            })
        })
        .collect()
}

/// The error curve of every parameter: models fitted on the first `k` of `train` (k from 2 to
/// all), scored on `test`. Parameters whose held-out values are all 0 are skipped (no relative
/// error); so is a k where the fit fails.
pub fn error_curves(app: &str, train: &[SampleRecord], test: &[SampleRecord]) -> Vec<ErrorPoint> {
    let train_values: Vec<(f64, Values)> = train
        .iter()
        .map(|s| (s.input_bytes as f64, values(s)))
        .collect();
    let test_values: Vec<(f64, Values)> = test
        .iter()
        .map(|s| (s.input_bytes as f64, values(s)))
        .collect();
    let mut parameters: Vec<(String, Quantity)> = Vec::new();
    for (_, vs) in &train_values {
        for (p, q, _) in vs {
            if !parameters.iter().any(|(n, _)| n == p) {
                parameters.push((p.clone(), *q));
            }
        }
    }
    parameters.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::new();
    for (parameter, quantity) in &parameters {
        let held: Vec<(f64, f64)> = test_values
            .iter()
            .filter_map(|(x, vs)| {
                vs.iter()
                    .find(|(p, _, _)| p == parameter)
                    .map(|(_, _, y)| (*x, *y))
            })
            .filter(|(_, y)| *y != 0.0)
            .collect();
        if held.is_empty() {
            continue;
        }
        for k in 2..=train_values.len() {
            let mut model = Model::new(*quantity, SEED);
            for (x, vs) in &train_values[..k] {
                if let Some((_, _, y)) = vs.iter().find(|(p, _, _)| p == parameter) {
                    let _ = model.add_sample(*x, *y);
                }
            }
            if model.samples.len() < 2 || model.fit().is_err() {
                continue;
            }
            let errors: Vec<f64> = held
                .iter()
                .filter_map(|(x, y)| model.predict(*x).map(|p| ((p - y) / y).abs()))
                .collect();
            if errors.is_empty() {
                continue;
            }
            out.push(ErrorPoint {
                app: app.to_owned(),
                parameter: parameter.clone(),
                train_jobs: k,
                mape: 100.0 * errors.iter().sum::<f64>() / errors.len() as f64,
            });
        }
    }
    out
}

/// The curves as CSV (header first).
pub fn csv(points: &[ErrorPoint]) -> String {
    let mut s = String::from("app,parameter,train_jobs,mape_percent\n");
    for p in points {
        s.push_str(&format!(
            "{},{},{},{:.3}\n",
            p.app, p.parameter, p.train_jobs, p.mape
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sample(x: u64, mem: f64, secs: f64, bytes: u64) -> SampleRecord {
        SampleRecord {
            dag: "d".into(),
            job: format!("j-{x}"),
            input_bytes: x,
            measured: json!({
                "functions": {
                    "a": {"memory_mb": mem, "cold_s": secs, "instances": 1},
                    "b": {"memory_mb": 10.0, "cold_s": 0.0, "instances": 2}
                },
                "edges": [{"from": "a", "to": "b", "bytes": bytes}]
            }),
            created_ms: 0,
        }
    }

    #[test]
    fn a_linear_truth_is_learned_from_a_few_jobs() {
        // memory = 100 + x/1e4, time = 1 + x/1e6 with noise on the first samples only.
        let train: Vec<SampleRecord> = [1_000_000u64, 9_000_000, 5_000_000, 3_000_000, 7_000_000]
            .iter()
            .enumerate()
            .map(|(i, &x)| {
                let noise = if i < 2 { 1.3 } else { 1.0 };
                sample(
                    x,
                    (100.0 + x as f64 / 1e4) * noise,
                    1.0 + x as f64 / 1e6,
                    x / 2,
                )
            })
            .collect();
        let test = vec![
            sample(2_000_000, 300.0, 3.0, 1_000_000),
            sample(6_000_000, 700.0, 7.0, 3_000_000),
        ];
        let curves = error_curves("d", &train, &test);
        let at = |p: &str, k: usize| {
            curves
                .iter()
                .find(|c| c.parameter == p && c.train_jobs == k)
                .map(|c| c.mape)
        };
        // b.cold_s is 0 everywhere: no relative error, skipped.
        assert!(at("b.cold_s", 5).is_none());
        let early = at("a.memory_mb", 2).unwrap();
        let late = at("a.memory_mb", 5).unwrap();
        assert!(late < early, "{early} -> {late}");
        assert!(at("a->b.bytes", 5).unwrap() < 1.0);
        assert!(at("b.instances", 5).unwrap() < 1e-9);
        assert!(csv(&curves).starts_with("app,parameter,train_jobs,mape_percent\n"));
        let view =
            json!([{"job": "j-1", "input_bytes": 5, "measured": {}, "created_ms": 1}, {"job": 1}]);
        let parsed = samples_from_view("d", view.as_array().unwrap());
        assert_eq!(parsed.len(), 1);
    }
}
