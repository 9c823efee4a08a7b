//! The table `ofctl plan` explains a decision with: per stage, the best label the search kept
//! for each VM type (latency and cost so far, as in the paper's Viterbi table), and for each
//! incoming edge what the job would predict with each other method (the rest of the plan kept,
//! repaired where vm-storage forces it).

use serde::Serialize;

use crate::model::{Assignment, Infeasible, Method, Placement, PlanProblem, Prediction};
use crate::planner::dp::{Stats, decode};

/// One placement of a stage in the table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OptionRow {
    pub vm_type: String,
    pub vms: Option<u32>,
    pub per_vm: Option<u32>,
    pub concurrent: Option<u32>,
    /// Methods of the stage's incoming edges, in the plan's edge order.
    pub methods_in: Vec<Method>,
    /// Predicted end of this stage (latency so far).
    pub end_s: Option<f64>,
    /// Predicted cost of this stage and the ones placed before it.
    pub cost_so_far_usd: Option<f64>,
    pub chosen: bool,
    pub note: String,
}

/// What the job would predict with another method on one incoming edge.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MethodAlternative {
    pub from: String,
    pub method: Method,
    pub chosen: bool,
    /// The edge's data-passing time.
    pub edge_s: Option<f64>,
    pub latency_s: Option<f64>,
    pub cost_usd: Option<f64>,
    pub perf_per_dollar: Option<f64>,
    pub note: String,
}

/// Why one stage was placed as it was.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StageDecision {
    pub function: String,
    pub chosen: OptionRow,
    /// The best label kept per VM type (the chosen one included), or why there is none.
    pub options: Vec<OptionRow>,
    pub methods: Vec<MethodAlternative>,
    /// (Placement, method) candidates the search scored for this stage: all of them for the
    /// label search; for a chain, per scalar solve of its hull search (0 for baselines).
    pub evaluated: u64,
    pub reason: String,
}

/// A row for a placement of stage `s` ending at `end` with `cost` spent so far.
fn row(
    pb: &PlanProblem,
    s: usize,
    pl: Placement,
    methods_in: Vec<Method>,
    (end, cost): (f64, f64),
    note: &str,
) -> OptionRow {
    OptionRow {
        vm_type: pb.catalog().vm_types[pl.vm].name.clone(),
        vms: Some(pl.vms),
        per_vm: Some(pb.per_vm(s, pl.vms)),
        concurrent: Some(pl.concurrent),
        methods_in,
        end_s: Some(end),
        cost_so_far_usd: Some(cost),
        chosen: false,
        note: note.to_owned(),
    }
}

/// The explanation of `best` (predicted as `pred`); `stats` from the search, if one ran;
/// `cut`: a budget stopped it before it saw every placement.
pub(crate) fn table(
    pb: &PlanProblem,
    best: &Assignment,
    pred: &Prediction,
    stats: Option<&Stats>,
    cut: bool,
) -> Vec<StageDecision> {
    let mut out = Vec::with_capacity(pb.stages().len());
    for (s, st) in pb.stages().iter().enumerate() {
        let pl = best.placements[s];
        let methods_in: Vec<Method> = pb.incoming(s).iter().map(|&e| best.methods[e]).collect();
        let sp = &pred.stages[s];
        let chosen = OptionRow {
            chosen: true,
            ..row(
                pb,
                s,
                pl,
                methods_in.clone(),
                (sp.end_s, sp.cost_so_far_usd),
                "on the best plan",
            )
        };
        let mut options = Vec::new();
        for (vm, v) in pb.catalog().vm_types.iter().enumerate() {
            if vm == pl.vm {
                options.push(chosen.clone());
                continue;
            }
            if pb.max_concurrent(s, vm) == 0 {
                options.push(OptionRow {
                    vm_type: v.name.clone(),
                    vms: None,
                    per_vm: None,
                    concurrent: None,
                    methods_in: Vec::new(),
                    end_s: None,
                    cost_so_far_usd: None,
                    chosen: false,
                    note: format!("{} MB does not fit", st.memory_mb),
                });
                continue;
            }
            match stats.and_then(|x| x.seen[s][vm]) {
                Some(seen) => {
                    let m = (0..pb.incoming(s).len()).map(|k| decode(seen.methods, k)).collect();
                    let note = format!("best of {} labels kept (latency x cost so far), not on the best plan", seen.labels);
                    options.push(row(pb, s, seen.pl, m, (seen.end, seen.cost), &note));
                }
                None => options.push(OptionRow {
                    vm_type: v.name.clone(),
                    vms: None,
                    per_vm: None,
                    concurrent: None,
                    methods_in: Vec::new(),
                    end_s: None,
                    cost_so_far_usd: None,
                    chosen: false,
                    note: if cut {
                        "not reached: the search stopped at its budget".into()
                    } else if stats.is_some() {
                        "every placement was dominated, over a bound, or could not beat the best plan".into()
                    } else {
                        "not considered by this policy".into()
                    },
                }),
            }
        }

        let mut methods = Vec::new();
        for &e in pb.incoming(s) {
            let from = pb.stages()[pb.edges()[e].from].name.clone();
            for m in Method::ALL {
                // Without a memory tier, `memory` is no alternative at all.
                if m == Method::Memory && pb.catalog().memory_tier.is_none() {
                    continue;
                }
                if m == best.methods[e] {
                    methods.push(MethodAlternative {
                        from: from.clone(),
                        method: m,
                        chosen: true,
                        edge_s: Some(pred.edges[e].seconds),
                        latency_s: Some(pred.latency_s),
                        cost_usd: Some(pred.cost_usd),
                        perf_per_dollar: Some(pred.perf_per_dollar),
                        note: "chosen".into(),
                    });
                    continue;
                }
                let alt = match variant(pb, best, e, m) {
                    Ok((_, p)) => MethodAlternative {
                        from: from.clone(),
                        method: m,
                        chosen: false,
                        edge_s: Some(p.edges[e].seconds),
                        latency_s: Some(p.latency_s),
                        cost_usd: Some(p.cost_usd),
                        perf_per_dollar: Some(p.perf_per_dollar),
                        note: if m == Method::VmStorage {
                            format!("{} runs on {}'s VMs", st.name, from)
                        } else {
                            String::new()
                        },
                    },
                    Err(why) => MethodAlternative {
                        from: from.clone(),
                        method: m,
                        chosen: false,
                        edge_s: None,
                        latency_s: None,
                        cost_usd: None,
                        perf_per_dollar: None,
                        note: format!("infeasible: {why}"),
                    },
                };
                methods.push(alt);
            }
        }

        let mut reason = format!(
            "{} x {}, {} per VM, {} at once ({} batch{}, {:.3} s compute)",
            pl.vms,
            pb.catalog().vm_types[pl.vm].name,
            pb.per_vm(s, pl.vms),
            pl.concurrent,
            sp.batches,
            if sp.batches == 1 { "" } else { "es" },
            sp.compute_s
        );
        if sp.overhead_s > 0.0 {
            reason.push_str(&format!(", {:.3} s overhead", sp.overhead_s));
        }
        for &e in pb.incoming(s) {
            let from = &pb.stages()[pb.edges()[e].from].name;
            let others: Vec<String> = methods
                .iter()
                .filter(|a| &a.from == from && !a.chosen)
                .map(|a| match a.perf_per_dollar {
                    Some(p) => format!(
                        "{} would give {:.3} s, ${:.6}, Perf/$ {:.4e}",
                        a.method,
                        a.latency_s.unwrap_or(0.0),
                        a.cost_usd.unwrap_or(0.0),
                        p
                    ),
                    None => format!("{} {}", a.method, a.note),
                })
                .collect();
            reason.push_str(&format!(
                "; from {from} by {} ({:.3} s): {}",
                best.methods[e],
                pred.edges[e].seconds,
                others.join("; ")
            ));
        }
        reason.push_str(&format!(
            "; the job: {:.3} s, ${:.6}, Perf/$ {:.4e}",
            pred.latency_s, pred.cost_usd, pred.perf_per_dollar
        ));
        out.push(StageDecision {
            function: st.name.clone(),
            chosen,
            options,
            methods,
            evaluated: stats.map_or(0, |x| x.evaluated[s]),
            reason,
        });
    }
    out
}

/// `best` with method `m` on edge `e`, repaired: vm-storage moves the receiver onto the sender's
/// VMs; edges that vm-storage then forbids fall back to `direct` (or to `m`), until it runs.
fn variant(
    pb: &PlanProblem,
    best: &Assignment,
    e: usize,
    m: Method,
) -> Result<(Assignment, Prediction), String> {
    let mut a = best.clone();
    let edge = pb.edges()[e];
    let r = edge.to;
    a.methods[e] = m;
    if m == Method::VmStorage {
        let sp = a.placements[edge.from];
        let cmax = pb.max_concurrent(r, sp.vm);
        if cmax == 0 {
            return Err(format!(
                "{} does not fit {}",
                pb.stages()[r].name,
                pb.catalog().vm_types[sp.vm].name
            ));
        }
        if sp.vms > pb.stages()[r].instances {
            return Err(format!(
                "{} VMs for {} instances",
                sp.vms,
                pb.stages()[r].instances
            ));
        }
        a.placements[r] = Placement {
            vm: sp.vm,
            vms: sp.vms,
            // As the searches place it: the least busy concurrency (right-sizing).
            concurrent: pb.best_concurrent(r, sp.vm, sp.vms),
        };
    }
    let fallback = if m == Method::VmStorage {
        Method::Direct
    } else {
        m
    };
    let mut last = String::new();
    for _ in 0..=pb.edges().len() {
        match pb.evaluate(&a) {
            Ok(p) => return Ok((a, p)),
            Err(Infeasible::Edge { from, to, message }) => {
                last = format!("{from} -> {to}: {message}");
                let idx = pb
                    .edges()
                    .iter()
                    .position(|x| pb.stages()[x.from].name == from && pb.stages()[x.to].name == to);
                match idx {
                    // The edge we are asked about stays as asked; others give way.
                    Some(i) if i != e && a.methods[i] == Method::VmStorage => {
                        a.methods[i] = fallback
                    }
                    Some(i)
                        if i != e
                            && m == Method::VmStorage
                            && a.methods[i] != Method::VmStorage =>
                    {
                        a.methods[i] = Method::VmStorage
                    }
                    _ => return Err(last),
                }
            }
            Err(other) => return Err(other.to_string()),
        }
    }
    Err(last)
}
