//! A plan's latency distribution (ORION's CONV and MAX, seed thesis ch. 6.4.1, over the model's
//! own timeline): where [`PlanProblem::evaluate`] adds means, this adds distributions.
//!
//! The timeline is the model's (docs/model.md): a stage starts when its inputs are durable (each
//! sender's end plus its upload) and its VMs are free (a stage continuing a `vm-storage` group
//! after the group's previous stage); it then fetches, computes and pays its per-batch overhead,
//! all as the model predicts them, except the compute, which is drawn from the stage's instance
//! times ([`StageTimes`]). On its fullest VMs a stage runs `batches` batches of `concurrent`
//! instances each; a batch ends with its slowest instance (the first cold, or prewarmed, or hot
//! where the pool keeps warm containers, the others hot); the stage ends with its slowest VM;
//! the job with its slowest last stage.
//!
//! Parts are combined as independent, except a stage's own instances when [`StageTimes::together`]
//! says they move together (one input makes them all slow: the slowest of `n` is then one of
//! them). Branches that share an ancestor are combined as independent too, which counts the
//! ancestor's spread twice at the join: the tail this predicts is then a little heavier than the
//! truth, never lighter. With every time a point, the result is [`PlanProblem::evaluate`]'s
//! latency exactly (a test holds it).

use crate::dist::Dist;
use crate::model::{Assignment, Infeasible, Method, PlanProblem};

/// What one instance of a stage takes to compute.
#[derive(Debug, Clone, PartialEq)]
pub struct StageTimes {
    /// In a new container.
    pub cold: Dist,
    /// In a warm container that already ran the function.
    pub hot: Dist,
    /// Whether the stage's instances move together (their times are correlated, e.g. by the
    /// job's input): the slowest of them is then any one of them.
    pub together: bool,
}

impl StageTimes {
    /// The stage's mean times as points (what the model alone knows).
    pub fn points(pb: &PlanProblem, s: usize) -> Result<StageTimes, crate::dist::DistError> {
        let st = &pb.stages()[s];
        Ok(StageTimes {
            cold: Dist::point(st.cold_s)?,
            hot: Dist::point(st.hot_s)?,
            together: false,
        })
    }
}

/// A plan's predicted latency distribution.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyDist {
    /// The job's end to end.
    pub job: Dist,
    /// Per stage, when it ends (since the job started).
    pub stage_ends: Vec<Dist>,
}

/// The latency distribution of `a` with each stage's instance times `times` (one per stage).
pub fn latency(
    pb: &PlanProblem,
    a: &Assignment,
    times: &[StageTimes],
) -> Result<LatencyDist, Infeasible> {
    let n = pb.stages().len();
    if times.len() != n {
        return Err(Infeasible::Shape {
            what: "stage times",
            got: times.len(),
            want: n,
        });
    }
    let pred = pb.evaluate(a)?;
    let mut walk = DistWalk::new(pb);
    for (r, t) in times.iter().enumerate() {
        let run = compute(pb, r, a.placements[r], t);
        walk.push(pb, a, r, &pred.stages[r], &pred.edges, run);
    }
    Ok(LatencyDist {
        job: walk.job(pb),
        stage_ends: walk.ends,
    })
}

/// The distributions of stage ends built one stage at a time, in topological order, beside the
/// model's own [`crate::model::Walk`] (what [`latency`] runs, and the percentile search that
/// prices a plan's first stages: a stage's end never comes sooner for the stages after it, so
/// a prefix's quantiles bound the whole plan's).
#[derive(Debug, Clone)]
pub(crate) struct DistWalk {
    /// Per stage: its VM group (a vm-storage receiver continues its sender's).
    group_of: Vec<usize>,
    /// Per group: the stage that ran on it last.
    last_on: Vec<usize>,
    /// Per stage pushed: when it ends.
    pub ends: Vec<Dist>,
}

impl DistWalk {
    pub(crate) fn new(pb: &PlanProblem) -> DistWalk {
        let n = pb.stages().len();
        DistWalk {
            group_of: vec![0; n],
            last_on: Vec::new(),
            ends: Vec::with_capacity(n),
        }
    }

    /// When stage `r` starts, as a distribution (`None`: at 0, it has no input and new VMs):
    /// its inputs durable (each sender's end plus its upload, `edges`) and its VMs free.
    pub(crate) fn start(
        &self,
        pb: &PlanProblem,
        a: &Assignment,
        r: usize,
        edges: &[crate::model::EdgePrediction],
    ) -> Option<Dist> {
        let mut start: Option<Dist> = None;
        let mut join = |d: Dist| {
            start = Some(match start.take() {
                None => d,
                Some(s) => s.max(&d),
            });
        };
        for &e in pb.incoming(r) {
            let s = pb.edges()[e].from;
            join(self.ends[s].shifted(edges[e].upload_s));
        }
        if let Some(g) = self.continues(pb, a, r) {
            // The group's VMs are free once its previous stage ended (when that stage is not a
            // sender, its end is not counted yet).
            let prev = self.last_on[g];
            if !pb.incoming(r).iter().any(|&e| pb.edges()[e].from == prev) {
                join(self.ends[prev].clone());
            }
        }
        start
    }

    fn continues(&self, pb: &PlanProblem, a: &Assignment, r: usize) -> Option<usize> {
        pb.incoming(r)
            .iter()
            .find(|&&e| a.methods[e] == Method::VmStorage)
            .map(|&e| self.group_of[pb.edges()[e].from])
    }

    /// Stage `r` with `run`, its compute time ([`compute`]); `stage` and `edges` are the
    /// model's prediction of it and of the edges into it.
    pub(crate) fn push(
        &mut self,
        pb: &PlanProblem,
        a: &Assignment,
        r: usize,
        stage: &crate::model::StagePrediction,
        edges: &[crate::model::EdgePrediction],
        run: Dist,
    ) {
        let start = self.start(pb, a, r, edges);
        self.push_start(pb, a, r, stage, start, run);
    }

    /// [`DistWalk::push`] with the start already computed ([`DistWalk::start`]).
    pub(crate) fn push_start(
        &mut self,
        pb: &PlanProblem,
        a: &Assignment,
        r: usize,
        stage: &crate::model::StagePrediction,
        start: Option<Dist>,
        run: Dist,
    ) {
        debug_assert_eq!(self.ends.len(), r, "stages are pushed in order");
        match self.continues(pb, a, r) {
            Some(g) => {
                self.group_of[r] = g;
                self.last_on[g] = r;
            }
            None => {
                self.group_of[r] = self.last_on.len();
                self.last_on.push(r);
            }
        }
        let run = run.shifted(stage.fetch_s + stage.overhead_s);
        self.ends.push(match start {
            None => run,
            Some(s) => s.then(&run),
        });
    }

    /// The job's end: its slowest last stage (every stage pushed).
    pub(crate) fn job(&self, pb: &PlanProblem) -> Dist {
        let mut job: Option<Dist> = None;
        for (r, end) in self.ends.iter().enumerate() {
            if pb.outgoing(r).is_empty() {
                job = Some(match job {
                    None => end.clone(),
                    Some(j) => j.max(end),
                });
            }
        }
        job.unwrap_or_else(Dist::zero)
    }
}

/// The latency quantiles of `plan` where `params` (the file `pb` was built from) gives some
/// function's times as a distribution; `None` when every time is a mean only (the quantiles
/// would all be the mean: nothing to say). A function `params` does not name keeps its means.
pub fn quantiles_for(
    pb: &PlanProblem,
    plan: &crate::planner::Plan,
    params: &crate::params::Params,
) -> Result<Option<crate::planner::Quantiles>, String> {
    if !params.functions.values().any(|f| f.has_distribution()) {
        return Ok(None);
    }
    let a = plan.assignment(pb).map_err(|e| e.to_string())?;
    let times = stage_times(pb, params)?;
    let d = latency(pb, &a, &times).map_err(|e| e.to_string())?;
    Ok(Some(crate::planner::Quantiles::of(&d.job)))
}

/// Each stage's instance times as `params` (the file `pb` was built from) gives them: a
/// distribution where it has one, else the mean as a point; a function `params` does not name
/// keeps `pb`'s means.
pub fn stage_times(
    pb: &PlanProblem,
    params: &crate::params::Params,
) -> Result<Vec<StageTimes>, String> {
    let mut times = Vec::with_capacity(pb.stages().len());
    for (s, st) in pb.stages().iter().enumerate() {
        times.push(match params.functions.get(&st.name) {
            Some(f) => StageTimes {
                cold: f
                    .cold_times()
                    .map_err(|e| format!("{}.cold_s: {e}", st.name))?,
                hot: f
                    .hot_times()
                    .map_err(|e| format!("{}.hot_s: {e}", st.name))?,
                together: false,
            },
            None => StageTimes::points(pb, s).map_err(|e| e.to_string())?,
        });
    }
    Ok(times)
}

/// The compute time of stage `s` under `pl`: its slowest VM's batches, one after another.
pub(crate) fn compute(
    pb: &PlanProblem,
    s: usize,
    pl: crate::model::Placement,
    t: &StageTimes,
) -> Dist {
    let st = &pb.stages()[s];
    // On the cores each instance is given: the lambda's time scaled, the cold start not.
    let g = st.on_cores(pb.cores(pl));
    let (cold, hot) = if g == 1.0 {
        (t.cold.clone(), t.hot.clone())
    } else {
        (
            t.cold.shifted(-st.start_s).scaled(g).shifted(st.start_s),
            t.hot.scaled(g),
        )
    };
    let first = if pb.warm_start(s, pl) {
        hot.clone()
    } else if pb.prewarmed(s, pl) {
        cold.shifted(-st.start_s)
    } else {
        cold
    };
    let slowest = |d: &Dist, k: u32| {
        if t.together {
            d.clone()
        } else {
            d.slowest_of(k)
        }
    };
    let conc = pl.concurrent.max(1);
    // One VM running `k` instances: its batches in a row, the last one possibly short.
    let vm = |k: u32| -> Dist {
        let batches = k.div_ceil(conc).max(1);
        let mut total = slowest(&first, k.min(conc));
        for b in 1..batches {
            let size = (k - b * conc).min(conc);
            total = total.then(&slowest(&hot, size));
        }
        total
    };
    let vms = pl.vms.max(1);
    let full = pb.per_vm(s, vms);
    let instances = st.instances;
    // The fullest VMs hold `full` instances, the others one fewer (contiguous blocks).
    let fullest = match instances % vms {
        0 => vms,
        r => r,
    };
    let others = vms - fullest;
    let mut stage = vm(full);
    if !t.together {
        stage = stage.slowest_of(fullest);
        if others > 0 && full > 1 {
            stage = stage.max(&vm(full - 1).slowest_of(others));
        }
    }
    stage
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Catalog;
    use crate::dag::{Bounds, EdgeKind};
    use crate::model::{EdgeSpec, Placement, Stage};
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn problem(stages: &[(u32, f64, f64)], edges: &[(usize, usize, EdgeKind)]) -> PlanProblem {
        let stages: Vec<Stage> = stages
            .iter()
            .enumerate()
            .map(|(i, &(instances, cold, hot))| Stage {
                parallel: if i % 2 == 1 { 0.6 } else { 0.0 },
                name: format!("s{i}"),
                memory_mb: 100.0,
                cold_s: cold,
                hot_s: hot,
                instances,
                overhead_s: 0.05,
                overhead_hot_s: None,
                start_s: 0.1,
            })
            .collect();
        let edges: Vec<EdgeSpec> = edges
            .iter()
            .map(|&(a, b, kind)| EdgeSpec {
                from: format!("s{a}"),
                to: format!("s{b}"),
                kind,
                bytes: 20e6,
            })
            .collect();
        PlanProblem::new(stages, edges, Catalog::default(), Bounds::default()).expect("problem")
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// With every instance time a point, the distribution is the model's latency, on random
        /// DAGs (edges from lower to higher stages) and placements, any method but vm-storage.
        #[test]
        fn points_give_the_models_latency(
            n in 1usize..6,
            links in proptest::collection::vec((0usize..6, 0usize..6, any::<bool>()), 0..8),
            shape in proptest::collection::vec((1u32..9, 0.2f64..5.0, 1u32..4, 1u32..3, any::<bool>()), 6),
        ) {
            let mut edges = std::collections::BTreeSet::new();
            for &(a, b, remote) in &links {
                let (a, b) = (a.min(b), a.max(b));
                if b < n && a != b {
                    edges.insert((a, b, remote));
                }
            }
            let edges: Vec<(usize, usize, bool)> = {
                let mut seen = std::collections::BTreeSet::new();
                edges.into_iter().filter(|&(a, b, _)| seen.insert((a, b))).collect()
            };
            let pb = problem(
                &(0..n).map(|i| (shape[i].0, shape[i].1, shape[i].1 * 0.6)).collect::<Vec<_>>(),
                &edges.iter().map(|&(a, b, _)| (a, b, EdgeKind::Shuffle)).collect::<Vec<_>>(),
            );
            let large = pb.catalog().vm_types.iter().position(|t| t.name == "m5.large").unwrap();
            let a = Assignment {
                placements: (0..n)
                    .map(|i| {
                        let vms = pb.fit_vms(i, large, shape[i].2);
                        Placement { vm: large, vms, concurrent: shape[i].3.min(pb.max_concurrent(i, large)).max(1) }
                    })
                    .collect(),
                methods: edges
                    .iter()
                    .map(|&(_, _, remote)| if remote { Method::Remote } else { Method::Direct })
                    .collect(),
            };
            let Ok(pred) = pb.evaluate(&a) else {
                return Ok(());
            };
            let times: Vec<StageTimes> = (0..n).map(|i| StageTimes::points(&pb, i).unwrap()).collect();
            let d = latency(&pb, &a, &times).unwrap();
            for p in [0.0, 0.5, 0.99, 1.0] {
                prop_assert!((d.job.quantile(p) - pred.latency_s).abs() < 1e-9 * pred.latency_s.max(1.0),
                    "p{}: {} vs {}", p, d.job.quantile(p), pred.latency_s);
            }
            for (r, st) in pred.stages.iter().enumerate() {
                prop_assert!((d.stage_ends[r].mean() - st.end_s).abs() < 1e-9 * st.end_s.max(1.0));
            }
        }
    }

    /// split (1) -> map (8 on 2 VMs, 2 at once: 2 batches each) -> reduce (1), remote edges,
    /// skewed map times: the predicted quantiles are those of sampling the same timeline.
    #[test]
    fn a_fan_out_matches_sampling_and_grows_a_tail() {
        let pb = problem(
            &[(1, 1.0, 0.8), (8, 2.0, 1.5), (1, 1.0, 0.8)],
            &[(0, 1, EdgeKind::Scatter), (1, 2, EdgeKind::Gather)],
        )
        .with_prewarm(true);
        let large = pb
            .catalog()
            .vm_types
            .iter()
            .position(|t| t.name == "m5.large")
            .unwrap();
        let a = Assignment {
            placements: vec![
                Placement {
                    vm: large,
                    vms: 1,
                    concurrent: 1,
                },
                Placement {
                    vm: large,
                    vms: 2,
                    concurrent: 2,
                },
                Placement {
                    vm: large,
                    vms: 1,
                    concurrent: 1,
                },
            ],
            methods: vec![Method::Remote, Method::Remote],
        };
        let pred = pb.evaluate(&a).unwrap();
        assert!(pb.prewarmed(1, a.placements[1]));
        let mut rng = StdRng::seed_from_u64(3);
        // Map instances: a mean-preserving skew (most a little faster, one in ten 3x slower).
        let skew = |rng: &mut StdRng, mean: f64| {
            if rng.r#gen::<f64>() < 0.1 {
                mean * 2.8
            } else {
                mean * 0.8
            }
        };
        let samples = |rng: &mut StdRng, mean: f64| -> Vec<f64> {
            (0..5000).map(|_| skew(rng, mean)).collect()
        };
        let map = StageTimes {
            cold: Dist::from_samples(&samples(&mut rng, 2.0)).unwrap(),
            hot: Dist::from_samples(&samples(&mut rng, 1.5)).unwrap(),
            together: false,
        };
        let times = vec![
            StageTimes::points(&pb, 0).unwrap(),
            map,
            StageTimes::points(&pb, 2).unwrap(),
        ];
        let d = latency(&pb, &a, &times).unwrap();
        // Sampling the timeline: everything but map's compute as predicted.
        let (s0, s1, s2) = (&pred.stages[0], &pred.stages[1], &pred.stages[2]);
        let before = s1.start_s + s1.fetch_s + s1.overhead_s;
        let after = s2.end_s - s1.end_s;
        let mut job: Vec<f64> = (0..200_000)
            .map(|_| {
                // Prewarmed: the first batch is cold less the container's start.
                let first = |rng: &mut StdRng| skew(rng, 2.0) - 0.1;
                let vm = |rng: &mut StdRng| {
                    first(rng).max(first(rng)) + skew(rng, 1.5).max(skew(rng, 1.5))
                };
                let map_compute = vm(&mut rng).max(vm(&mut rng));
                before + map_compute + after
            })
            .collect();
        job.sort_by(f64::total_cmp);
        assert!(s0.end_s > 0.0);
        for p in [0.5, 0.9, 0.95, 0.99] {
            let want = job[(p * job.len() as f64) as usize];
            let got = d.job.quantile(p);
            assert!(
                (got - want).abs() <= 0.03 * want,
                "p{p}: {got} vs sampled {want}"
            );
        }
        // The model's mean is below what the slowest instance makes the job take.
        assert!(
            d.job.mean() > pred.latency_s * 1.05,
            "{} vs {}",
            d.job.mean(),
            pred.latency_s
        );
        // Instances that move together: the slowest of them is one of them.
        let mut together = times.clone();
        together[1].together = true;
        let t = latency(&pb, &a, &together).unwrap();
        assert!(t.job.quantile(0.5) < d.job.quantile(0.5));
    }
}
