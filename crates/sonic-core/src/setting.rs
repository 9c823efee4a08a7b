//! A parameter setting: the values of the job parameters that change a DAG's work, under which
//! its models are learned. Jobs of one setting share models, a mode and drift detection; jobs of
//! another setting never count as drift of this one (docs/model.md, "Parameter settings").
//!
//! The setting is encoded once, canonically, as a key: the JSON object of the work parameters'
//! values with names sorted, whole numbers written as integers (`6.0` and `6` are one setting),
//! and no whitespace; the empty setting (no work parameter) is the empty key, which is also what
//! models and samples recorded before settings existed load as.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::dag::Dag;

/// The largest magnitude below which every whole `f64` is exact, so it prints as an integer.
const EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0; // 2^53

/// One parameter setting of a DAG.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Setting {
    key: String,
}

impl Setting {
    /// The empty setting: a DAG without work parameters, and every record from before settings.
    pub fn empty() -> Setting {
        Setting::default()
    }

    /// The setting of a job that runs with `params` (the DAG's defaults with the job's
    /// overrides): the values of the DAG's work parameters (`work_params`, by default every
    /// parameter). A parameter that is not a work parameter (a seed) does not split models.
    pub fn of(dag: &Dag, params: &BTreeMap<String, Value>) -> Setting {
        Setting::of_work(dag.work_params.as_deref(), params)
    }

    /// [`Setting::of`] for work parameters `work` (`None`: every parameter).
    pub fn of_work(work: Option<&[String]>, params: &BTreeMap<String, Value>) -> Setting {
        let values = params
            .iter()
            .filter(|(k, _)| work.is_none_or(|w| w.contains(k)))
            .map(|(k, v)| (k.clone(), v.clone()));
        Setting::from_values(values)
    }

    /// The setting of these parameter values, all of them work parameters.
    pub fn from_values(values: impl IntoIterator<Item = (String, Value)>) -> Setting {
        let map: BTreeMap<String, Value> =
            values.into_iter().map(|(k, v)| (k, canonical(v))).collect();
        if map.is_empty() {
            return Setting::empty();
        }
        // A BTreeMap serializes in key order, whatever order serde_json's own maps keep.
        let key = serde_json::to_string(&map).unwrap_or_default();
        Setting { key }
    }

    /// A stored key back as a setting; `None` when it is not a key this module wrote.
    pub fn from_key(key: &str) -> Option<Setting> {
        if key.is_empty() {
            return Some(Setting::empty());
        }
        let map: BTreeMap<String, Value> = serde_json::from_str(key).ok()?;
        let s = Setting::from_values(map);
        (s.key == key).then_some(s)
    }

    /// The canonical key (stored, compared, shown in the models API).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Whether this is the empty setting.
    pub fn is_empty(&self) -> bool {
        self.key.is_empty()
    }

    /// The work parameters' values.
    pub fn values(&self) -> BTreeMap<String, Value> {
        if self.key.is_empty() {
            return BTreeMap::new();
        }
        serde_json::from_str(&self.key).unwrap_or_default()
    }

    /// For people: `trees=12`, `dataset="iris", trees=6`, or `no parameters`.
    pub fn label(&self) -> String {
        let values = self.values();
        if values.is_empty() {
            return "no parameters".to_owned();
        }
        values
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

impl std::fmt::Display for Setting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.label())
    }
}

/// A whole number as an integer, whichever way it was written.
fn canonical(v: Value) -> Value {
    match &v {
        Value::Number(n) if n.as_i64().is_none() && n.as_u64().is_none() => {
            match n.as_f64() {
                Some(f) if f.fract() == 0.0 && f.abs() < EXACT_INTEGERS => {
                    // Exact: |f| < 2^53.
                    Value::from(f as i64)
                }
                _ => v,
            }
        }
        _ => v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn dag(work: &str) -> Dag {
        Dag::from_yaml(
            "t.yaml",
            &format!(
                "name: t\nparams: {{ trees: 6, seed: 42, dataset: input }}\n{work}functions:\n  - {{ name: a, image: i, command: [x], instances: \"{{{{ params.trees }}}}\" }}\n"
            ),
        )
        .expect("dag")
    }

    fn params(pairs: &[(&str, Value)]) -> BTreeMap<String, Value> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect()
    }

    /// The key of a job of `dag` with these overrides.
    fn check(dag: &Dag, overrides: &[(&str, Value)], expect: &str) {
        let s = Setting::of(dag, &dag.job_params(&params(overrides)));
        assert_eq!(s.key(), expect, "overrides {overrides:?}");
        assert_eq!(Setting::from_key(s.key()).as_ref(), Some(&s));
    }

    #[test]
    fn every_parameter_by_default_sorted_and_canonical() {
        let d = dag("");
        check(&d, &[], r#"{"dataset":"input","seed":42,"trees":6}"#);
        check(
            &d,
            &[("trees", json!(12))],
            r#"{"dataset":"input","seed":42,"trees":12}"#,
        );
        // 12.0 is the same setting as 12, and the override's order does not matter.
        check(
            &d,
            &[("trees", json!(12.0)), ("seed", json!(42))],
            r#"{"dataset":"input","seed":42,"trees":12}"#,
        );
        check(
            &d,
            &[("dataset", json!("a,b=\"c\""))],
            r#"{"dataset":"a,b=\"c\"","seed":42,"trees":6}"#,
        );
        // A fraction stays a fraction; a string "6" is not the number 6.
        check(
            &d,
            &[("trees", json!(0.5))],
            r#"{"dataset":"input","seed":42,"trees":0.5}"#,
        );
        check(
            &d,
            &[("trees", json!("6"))],
            r#"{"dataset":"input","seed":42,"trees":"6"}"#,
        );
    }

    #[test]
    fn work_params_narrow_the_setting() {
        let d = dag("work_params: [trees]\n");
        check(&d, &[], r#"{"trees":6}"#);
        check(&d, &[("seed", json!(7))], r#"{"trees":6}"#);
        check(&d, &[("trees", json!(1))], r#"{"trees":1}"#);
        // No work parameter: one setting for every job, as before settings existed.
        let none = dag("work_params: []\n");
        check(&none, &[("trees", json!(1))], "");
        assert!(Setting::of(&none, &none.params).is_empty());
    }

    #[test]
    fn keys_round_trip_and_foreign_keys_are_refused() {
        assert_eq!(Setting::from_key(""), Some(Setting::empty()));
        assert_eq!(Setting::empty().label(), "no parameters");
        let s = Setting::from_values([
            ("trees".to_owned(), json!(3)),
            ("b".to_owned(), json!(true)),
        ]);
        assert_eq!(s.key(), r#"{"b":true,"trees":3}"#);
        assert_eq!(s.label(), "b=true, trees=3");
        assert_eq!(s.values()["trees"], json!(3));
        // Not canonical (spaces, order, 3.0), or not an object: not a key this module wrote.
        for bad in [
            r#"{"trees": 3}"#,
            r#"{"trees":3,"b":true}"#,
            r#"{"trees":3.0}"#,
            "[1]",
            "x",
        ] {
            assert_eq!(Setting::from_key(bad), None, "{bad}");
        }
    }
}
