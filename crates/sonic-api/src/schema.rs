//! OpenAPI schemas of the `sonic-core` types on the wire, which derive none: the data-passing
//! method and the policy (their values from the types' own lists) and the planner's plan
//! document. The wire types that hold them name these with `#[schema(schema_with = ...)]`;
//! every other schema is derived from its type.

use sonic_core::model::Method;
use sonic_core::planner::Policy;
use utoipa::openapi::schema::{
    ArrayBuilder, KnownFormat, Object, ObjectBuilder, SchemaFormat, SchemaType, Type,
};

/// How an edge's data moves: `vm-storage`, `direct` or `remote`.
pub fn method() -> Object {
    names(
        "how the data moves: vm-storage, direct or remote",
        Method::ALL.map(Method::as_str),
    )
}

/// A policy: `sonic`, `remote`, `local`, `direct` or `oracle`.
pub fn policy() -> Object {
    names("a policy", Policy::ALL.map(Policy::as_str))
}

/// A percentile objective on job latency (interfaces.md §6).
pub fn slo() -> Object {
    ObjectBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .description(Some(
            "a percentile objective on job latency: percentile (50 to 99.9), latency_s \
             (seconds) and best_effort (run the plan with the lowest percentile latency where \
             none meets it, instead of refusing the job)",
        ))
        .property("percentile", typed(Type::Number, None))
        .property("latency_s", typed(Type::Number, None))
        .property("best_effort", typed(Type::Boolean, None))
        .required("percentile")
        .required("latency_s")
        .build()
}

/// What kind of run failure failed a job.
pub fn failure() -> Object {
    names(
        "the kind of the run failure that failed the job",
        sonic_core::machine::Failure::ALL.map(sonic_core::machine::Failure::as_str),
    )
}

fn names<const N: usize>(description: &str, values: [&str; N]) -> Object {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values))
        .description(Some(description))
        .build()
}

fn typed(t: Type, description: Option<&str>) -> Object {
    ObjectBuilder::new()
        .schema_type(t)
        .description(description)
        .build()
}

fn objects(description: &str) -> ArrayBuilder {
    ArrayBuilder::new()
        .items(typed(Type::Object, None))
        .description(Some(description))
}

/// The model's prediction for a plan.
fn predicted() -> Object {
    let number = || typed(Type::Number, None);
    ObjectBuilder::new()
        .schema_type(Type::Object)
        .description(Some("the model's prediction for the plan"))
        .property("latency_s", number())
        .property("cost_usd", number())
        .property("perf_per_dollar", number())
        .property(
            "requests_usd",
            typed(
                Type::Number,
                Some("the part of cost_usd charged per store request"),
            ),
        )
        .property(
            "latency_quantiles_s",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(
                    "the predicted latency distribution (p50, p90, p95, p99, seconds), where the \
                     parameters give the functions' times as distributions",
                ))
                .property("p50", number())
                .property("p90", number())
                .property("p95", number())
                .property("p99", number()),
        )
        .required("latency_s")
        .required("cost_usd")
        .required("perf_per_dollar")
        .build()
}

/// The properties a plan and the plan document share.
fn plan_properties(builder: ObjectBuilder) -> ObjectBuilder {
    builder
        .property(
            "stages",
            objects("where each stage runs: function, vm_type, vms, per_vm, concurrent, cores (the CPUs each instance is given), warm, prewarmed"),
        )
        .property(
            "edges",
            objects("how each edge's data moves: from, to, method, predicted_s"),
        )
        .property("predicted", predicted())
        .property(
            "timing",
            objects(
                "per stage, the predicted timing: function, ready_s (its last sender ended), \
                 start_s, upload_s, wait_s, overhead_s, fetch_s, compute_s, end_s = ready_s + \
                 upload_s + wait_s + fetch_s + compute_s, batches",
            ),
        )
        .required("stages")
        .required("edges")
        .required("predicted")
}

/// A plan: placements, methods, prediction (`sonic_core::planner::Plan`), or `null`.
pub fn plan() -> Object {
    plan_properties(ObjectBuilder::new())
        .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
        .build()
}

/// The planner's plan document, what `ofctl plan -o json` prints
/// (`sonic_core::planner::PlanReport`).
pub fn planner_report() -> Object {
    plan_properties(ObjectBuilder::new().schema_type(Type::Object))
        .property("dag", typed(Type::String, None))
        .property("policy", policy())
        .property("second_best", plan())
        .property(
            "planning_time_us",
            ObjectBuilder::new()
                .schema_type(Type::Integer)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
                .minimum(Some(0)),
        )
        .property(
            "exact",
            typed(
                Type::Boolean,
                Some(
                    "whether the plan is proven optimal; false: a limit of the planning budget \
                     stopped the search and this is the best plan found within it",
                ),
            ),
        )
        .property(
            "stopped",
            ObjectBuilder::new()
                .schema_type(SchemaType::from_iter([Type::Object, Type::Null]))
                .description(Some(
                    "the limit that stopped a search: limit (time with ms, memory with bytes, \
                     expansions with max) and search (best, second_best)",
                )),
        )
        .property(
            "slo",
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(
                    "the percentile objective the plan was made for (absent when none was): \
                     percentile, latency_s, predicted_s (the plan's predicted latency at the \
                     percentile) and met",
                ))
                .property("percentile", typed(Type::Number, None))
                .property("latency_s", typed(Type::Number, None))
                .property("predicted_s", typed(Type::Number, None))
                .property("met", typed(Type::Boolean, None)),
        )
        .required("dag")
        .required("policy")
        .required("planning_time_us")
        .build()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use sonic_core::planner::{Plan, PlanEdge, PlanReport, PlanStage, Predicted, StageTiming};

    use super::*;

    fn keys(v: &serde_json::Value) -> BTreeSet<String> {
        v.as_object()
            .map(|m| m.keys().cloned().collect())
            .unwrap_or_default()
    }

    fn properties(o: Object) -> BTreeSet<String> {
        o.properties.keys().cloned().collect()
    }

    /// These schemas are written here, not derived: they must name every field sonic-core
    /// writes, so a field added there fails this test until it is described.
    #[test]
    fn the_plan_schemas_name_every_field_the_planner_writes() {
        let predicted = Predicted {
            latency_s: 1.0,
            cost_usd: 1.0,
            perf_per_dollar: 1.0,
            requests_usd: 0.0,
            latency_quantiles_s: Some(sonic_core::planner::Quantiles {
                p50: 1.0,
                p90: 1.0,
                p95: 1.0,
                p99: 1.0,
            }),
        };
        let plan = Plan {
            stages: vec![PlanStage {
                cores: 1.0,
                function: "f".into(),
                vm_type: "m5.large".into(),
                vms: 1,
                per_vm: 1,
                concurrent: 1,
                warm: true,
                prewarmed: true,
            }],
            edges: vec![PlanEdge {
                from: "f".into(),
                to: "g".into(),
                method: Method::Direct,
                predicted_s: 1.0,
            }],
            predicted,
            timing: vec![StageTiming {
                function: "f".into(),
                ready_s: 0.0,
                start_s: 0.0,
                upload_s: 0.0,
                wait_s: 0.0,
                overhead_s: 0.0,
                fetch_s: 0.0,
                compute_s: 1.0,
                end_s: 1.0,
                batches: 1,
            }],
        };
        let report = PlanReport {
            dag: "d".into(),
            policy: Policy::Sonic,
            stages: plan.stages.clone(),
            edges: plan.edges.clone(),
            predicted,
            timing: plan.timing.clone(),
            second_best: Some(plan.clone()),
            planning_time_us: 1,
            exact: true,
            stopped: None,
            slo: Some(sonic_core::planner::SloVerdict {
                percentile: 95.0,
                latency_s: 2.0,
                predicted_s: 1.5,
                met: true,
            }),
        };
        let report = serde_json::to_value(&report).expect("json");
        assert_eq!(properties(planner_report()), keys(&report));
        let plan = serde_json::to_value(&plan).expect("json");
        assert_eq!(properties(super::plan()), keys(&plan));
        assert_eq!(properties(super::predicted()), keys(&plan["predicted"]));
        // The lists' items are described in words: each names every field of an item.
        let described = serde_json::to_value(super::plan()).expect("schema");
        for list in ["stages", "edges", "timing"] {
            let text = described["properties"][list]["description"]
                .as_str()
                .expect("description");
            for key in keys(&plan[list][0]) {
                assert!(text.contains(key.as_str()), "{list} do not name {key}");
            }
        }
    }

    #[test]
    fn the_names_are_the_types_own() {
        let v = serde_json::to_value(policy()).expect("json");
        assert_eq!(
            v["enum"],
            serde_json::json!([
                "sonic",
                "sonic-mean",
                "remote",
                "local",
                "direct",
                "memory",
                "oracle"
            ])
        );
        let v = serde_json::to_value(method()).expect("json");
        assert_eq!(
            v["enum"],
            serde_json::json!(["vm-storage", "direct", "remote", "memory"])
        );
    }
}
