//! The planner against brute force: on random small DAGs (chains, forks, joins, diamonds; 2-4
//! stages; fanouts 1-6; 1-3 VM types; with and without bounds) the planner's best Perf/$ equals
//! the best over an enumeration of every plan under the same `evaluate`, its plan meets the
//! bounds, and its second-best equals the best plan without vm-storage where the best has it;
//! the same under random limits on VMs per type (a resource manager's pool).

use std::collections::BTreeMap;

use proptest::prelude::*;
use sonic_core::catalog::{Catalog, LocalStorage, MemoryTier, RemoteStorage, VmType};
use sonic_core::dag::{Bounds, EdgeKind};
use sonic_core::model::{Assignment, EdgeSpec, Method, Placement, PlanProblem, Stage};
use sonic_core::planner::{PlanError, Policy, plan};

#[derive(Debug, Clone)]
struct Case {
    shape: u8,
    n: usize,
    fanouts: Vec<u32>,
    kinds: Vec<u8>,
    /// Per stage: memory, cold time, hot over cold, parallel share (right-sizing).
    stages: Vec<(f64, f64, f64, f64)>,
    bytes: Vec<f64>,
    types: Vec<(u32, u64, f64, f64)>,
    reserve: u64,
    local_usd: f64,
    remote: (f64, f64, f64, f64, Option<f64>, f64),
    bounds: (u8, f64, f64),
    /// A memory tier: $/h, capacity MB (small ones refuse the larger edges), Mbit/s, latency ms.
    memory: Option<(f64, u64, f64, f64)>,
}

fn case() -> impl Strategy<Value = Case> {
    (
        (
            0u8..4,
            2usize..=4,
            prop::collection::vec(prop_oneof![Just(1u32), 1u32..=6], 4),
            prop::collection::vec(0u8..4, 4),
        ),
        (
            prop::collection::vec(
                (
                    300.0f64..3500.0,
                    0.5f64..20.0,
                    0.0f64..1.3,
                    prop_oneof![Just(0.0f64), 0.0f64..=1.0],
                ),
                4,
            ),
            prop::collection::vec(prop_oneof![Just(0.0f64), 1e6f64..3e9], 4),
        ),
        (
            prop::collection::vec(
                (
                    prop_oneof![Just(1u32), Just(2), Just(4)],
                    prop_oneof![Just(2048u64), Just(4096), Just(8192)],
                    100.0f64..3000.0,
                    0.02f64..0.6,
                ),
                1..=3,
            ),
            prop_oneof![Just(0u64), Just(512)],
            // Storage is made dear at times so that waiting costs matter to the optimum.
            prop_oneof![Just(0.08f64), 0.0f64..50.0],
        ),
        (
            (
                200.0f64..3000.0,
                100.0f64..2000.0,
                0.0f64..60.0,
                50.0f64..5000.0,
                prop::option::of(500.0f64..10_000.0),
                prop_oneof![Just(0.023f64), 0.0f64..30.0],
            ),
            (0u8..4, 0.7f64..1.6, 0.7f64..1.6),
        ),
        prop::option::of((
            prop_oneof![Just(0.206f64), 0.01f64..50.0],
            prop_oneof![Just(64u64), Just(13_383)],
            300.0f64..10_000.0,
            0.0f64..5.0,
        )),
    )
        .prop_map(
            |(
                (shape, n, fanouts, kinds),
                (stages, bytes),
                (types, reserve, local_usd),
                (remote, bounds),
                memory,
            )| Case {
                shape,
                n,
                fanouts,
                kinds,
                stages,
                bytes,
                types,
                reserve,
                local_usd,
                remote,
                bounds,
                memory,
            },
        )
}

fn edges_of(shape: u8, n: usize) -> Vec<(usize, usize)> {
    match (shape, n) {
        (1, 3) => vec![(0, 1), (0, 2)],
        (1, 4) => vec![(0, 1), (0, 2), (1, 3)],
        (2, 3) => vec![(0, 2), (1, 2)],
        (2, 4) => vec![(0, 2), (1, 2), (2, 3)],
        (3, 4) => vec![(0, 1), (0, 2), (1, 3), (2, 3)],
        _ => (0..n - 1).map(|i| (i, i + 1)).collect(),
    }
}

fn catalog(c: &Case) -> Catalog {
    let (write, read, lat, rate, agg, remote_usd) = c.remote;
    Catalog {
        reserve_mb: c.reserve,
        vm_types: c
            .types
            .iter()
            .enumerate()
            .map(|(i, &(vcpus, mem, mbps, usd))| VmType {
                name: format!("t{i}"),
                vcpus,
                memory_mb: mem,
                network_mbps: mbps,
                usd_per_hour: usd,
            })
            .collect(),
        local_storage: LocalStorage {
            usd_per_gb_month: c.local_usd,
        },
        remote_storage: RemoteStorage {
            write_mbps: write,
            read_mbps: read,
            request_latency_ms: lat,
            put_usd_per_1k: 0.005,
            get_usd_per_1k: 0.0004,
            usd_per_gb_month: remote_usd,
            requests_per_s: rate,
            aggregate_mbps: agg,
        },
        memory_tier: c.memory.map(|(usd, cap, mbps, lat)| MemoryTier {
            usd_per_hour: usd,
            capacity_mb: cap,
            network_mbps: mbps,
            request_latency_ms: lat,
            requests_per_s: 100_000.0,
        }),
    }
}

fn problem(c: &Case, bounds: Bounds) -> PlanProblem {
    let cat = catalog(c);
    let usable = cat
        .vm_types
        .iter()
        .map(|v| (v.memory_mb - cat.reserve_mb) as f64)
        .fold(0.0, f64::max);
    let stages: Vec<Stage> = (0..c.n)
        .map(|i| {
            let (mem, cold, hotf, parallel) = c.stages[i];
            Stage {
                // Half the stages use several cores: a bigger VM runs them faster, so the
                // searches are proven exact with compute depending on the placement.
                parallel,
                name: format!("s{i}"),
                memory_mb: mem.min(usable),
                cold_s: cold,
                hot_s: cold * hotf,
                instances: c.fanouts[i],
                // Every other stage pays a per-instance overhead (per batch), so that the
                // searches are proven exact with the term too; every fourth a hot batch's own
                // (smaller than the cold batch's, as measured), and the stage after it a
                // larger one.
                overhead_s: if i % 2 == 1 { 0.25 * cold * hotf } else { 0.0 },
                overhead_hot_s: match i % 4 {
                    1 => Some(0.1 * cold * hotf),
                    2 => Some(0.05 * cold),
                    _ => None,
                },
                start_s: 0.0,
            }
        })
        .collect();
    let edges: Vec<EdgeSpec> = edges_of(c.shape, c.n)
        .into_iter()
        .enumerate()
        .map(|(i, (a, b))| {
            let (ks, kr) = (c.fanouts[a], c.fanouts[b]);
            let mut allowed = vec![EdgeKind::Shuffle];
            if ks == kr {
                allowed.push(EdgeKind::One);
            }
            if ks == 1 {
                allowed.extend([EdgeKind::Broadcast, EdgeKind::Scatter]);
            }
            if kr == 1 {
                allowed.push(EdgeKind::Gather);
            }
            EdgeSpec {
                from: format!("s{a}"),
                to: format!("s{b}"),
                kind: allowed[c.kinds[i] as usize % allowed.len()],
                bytes: c.bytes[i].round(),
            }
        })
        .collect();
    PlanProblem::new(stages, edges, cat, bounds).expect("generated problems are valid")
}

/// Every placement of stage `s` a user could ask for: any VM type, any p in 1..=K, any c.
fn placements(pb: &PlanProblem, s: usize) -> Vec<Placement> {
    let mut out = Vec::new();
    for vm in 0..pb.catalog().vm_types.len() {
        let cmax = pb.max_concurrent(s, vm);
        for p in 1..=pb.stages()[s].instances {
            for c in 1..=p.min(cmax) {
                let pl = pb.placement_from_per_vm(s, vm, p, c);
                if !out.contains(&pl) {
                    out.push(pl);
                }
            }
        }
    }
    out
}

/// Enumerates every plan; vm-storage receivers only on their sender's VM type and count (the
/// others are infeasible and `evaluate` would refuse them anyway). Calls `f` with each feasible
/// plan's (latency, cost).
fn enumerate(pb: &PlanProblem, banned: &[bool], f: &mut dyn FnMut(f64, f64, &Assignment)) -> usize {
    let n = pb.stages().len();
    let all: Vec<Vec<Placement>> = (0..n).map(|s| placements(pb, s)).collect();
    let mut a = Assignment {
        placements: vec![
            Placement {
                vm: 0,
                vms: 1,
                concurrent: 1
            };
            n
        ],
        methods: vec![Method::Direct; pb.edges().len()],
    };
    let mut count = 0;
    fn go(
        pb: &PlanProblem,
        r: usize,
        all: &[Vec<Placement>],
        banned: &[bool],
        a: &mut Assignment,
        count: &mut usize,
        f: &mut dyn FnMut(f64, f64, &Assignment),
    ) {
        if r == pb.stages().len() {
            *count += 1;
            if let Ok(p) = pb.evaluate(a) {
                f(p.latency_s, p.cost_usd, a);
            }
            return;
        }
        let inc = pb.incoming(r).to_vec();
        // Every method, memory too when the catalog has a tier (for an edge it cannot hold,
        // `evaluate` refuses it).
        let methods: Vec<Method> = Method::ALL
            .into_iter()
            .filter(|&m| m != Method::Memory || pb.catalog().memory_tier.is_some())
            .collect();
        let k = methods.len();
        let combos = k.pow(inc.len() as u32);
        for combo in 0..combos {
            let mut x = combo;
            let mut vm_sender = None;
            let mut skip = false;
            for &e in &inc {
                let m = methods[x % k];
                x /= k;
                if m == Method::VmStorage {
                    if banned[e] {
                        skip = true;
                    }
                    vm_sender.get_or_insert(pb.edges()[e].from);
                }
                a.methods[e] = m;
            }
            if skip {
                continue;
            }
            for &pl in &all[r] {
                if let Some(s) = vm_sender {
                    let sp = a.placements[s];
                    if (pl.vm, pl.vms) != (sp.vm, sp.vms) {
                        continue;
                    }
                }
                a.placements[r] = pl;
                go(pb, r + 1, all, banned, a, count, f);
            }
        }
    }
    go(pb, 0, &all, banned, &mut a, &mut count, f);
    count
}

/// An upper bound on how many plans `enumerate` visits.
fn size(pb: &PlanProblem) -> f64 {
    let moving = if pb.catalog().memory_tier.is_some() {
        3.0
    } else {
        2.0
    };
    (0..pb.stages().len())
        .map(|s| {
            let k = pb.incoming(s).len() as i32;
            let ps = placements(pb, s).len() as f64;
            f64::powi(moving, k) * ps + (f64::powi(moving + 1.0, k) - f64::powi(moving, k)) * 6.0
        })
        .product()
}

#[derive(Debug, Default, Clone, Copy)]
struct Best {
    product: f64,
    found: bool,
    min_latency: f64,
    min_cost: f64,
    min_cost_within_latency: f64,
}

fn brute(pb: &PlanProblem, banned: &[bool]) -> Best {
    let b = pb.bounds();
    let mut best = Best {
        product: f64::INFINITY,
        found: false,
        min_latency: f64::INFINITY,
        min_cost: f64::INFINITY,
        min_cost_within_latency: f64::INFINITY,
    };
    enumerate(pb, banned, &mut |l, c, _| {
        best.min_latency = best.min_latency.min(l);
        best.min_cost = best.min_cost.min(c);
        if b.max_latency_s.is_none_or(|x| l <= x) {
            best.min_cost_within_latency = best.min_cost_within_latency.min(c);
        }
        if b.max_latency_s.is_some_and(|x| l > x) || b.max_cost_usd.is_some_and(|x| c > x) {
            return;
        }
        best.found = true;
        best.product = best.product.min(l * c);
    });
    best
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs())
}

fn check(c: &Case, limits: &BTreeMap<String, u32>) -> Result<(), TestCaseError> {
    let free = problem(c, Bounds::default());
    let free = match free.with_vm_limits(limits) {
        Ok(pb) => pb,
        Err(_) => {
            prop_assume!(false, "no VM type left within the limits");
            unreachable!()
        }
    };
    prop_assume!(size(&free) <= 60_000.0);
    let unbounded = brute(&free, &vec![false; free.edges().len()]);
    if !unbounded.found && !limits.is_empty() {
        // Stages held at the same time need more VMs of a type than the limits allow
        // (`PlanProblem::over_pool`): the planner finds no plan either.
        let planned = plan(&free, Policy::Sonic);
        prop_assert!(
            planned.is_err(),
            "a plan the pool cannot hold: {:?}",
            planned
        );
        return Ok(());
    }
    prop_assert!(unbounded.found, "every generated problem has a plan");
    // Bounds relative to the unbounded optimum's neighbourhood, so that some bind and some fail.
    let (kind, lf, cf) = c.bounds;
    let bounds = Bounds {
        max_latency_s: (kind & 1 == 1).then_some(unbounded.min_latency * lf * 1.3),
        max_cost_usd: (kind & 2 == 2).then_some(unbounded.min_cost * cf * 1.3),
    };
    let pb = free.with_bounds(bounds).expect("positive bounds");
    let want = brute(&pb, &vec![false; pb.edges().len()]);
    match plan(&pb, Policy::Sonic) {
        Ok(out) => {
            prop_assert!(
                out.exact && out.stopped.is_none(),
                "the default budget never cuts these: {:?}",
                out.stopped
            );
            prop_assert!(
                want.found,
                "the planner found a plan the brute force did not: {:?}",
                out.best
            );
            let a = out
                .best
                .assignment(&pb)
                .expect("the plan names the problem's stages");
            let p = pb.evaluate(&a).expect("the chosen plan is feasible");
            for st in &out.best.stages {
                prop_assert!(
                    limits.get(&st.vm_type).is_none_or(|&l| st.vms <= l),
                    "{} uses {} {} VMs over the limit {:?}",
                    st.function,
                    st.vms,
                    st.vm_type,
                    limits
                );
            }
            prop_assert!(
                bounds.max_latency_s.is_none_or(|x| p.latency_s <= x),
                "latency bound broken"
            );
            prop_assert!(
                bounds.max_cost_usd.is_none_or(|x| p.cost_usd <= x),
                "cost bound broken"
            );
            prop_assert_eq!(p.perf_per_dollar, out.best.predicted.perf_per_dollar);
            let got = p.latency_s * p.cost_usd;
            prop_assert!(
                close(got, want.product),
                "planner {} vs brute force {} (perf/$ {} vs {})",
                got,
                want.product,
                1.0 / got,
                1.0 / want.product
            );

            let banned: Vec<bool> = a.methods.iter().map(|m| *m == Method::VmStorage).collect();
            if banned.iter().any(|&x| x) {
                let want2 = brute(&pb, &banned);
                match &out.second_best {
                    Some(sb) => {
                        prop_assert!(want2.found);
                        let a2 = sb
                            .assignment(&pb)
                            .expect("second-best names the problem's stages");
                        for (e, m) in a2.methods.iter().enumerate() {
                            prop_assert!(
                                !(banned[e] && *m == Method::VmStorage),
                                "second-best keeps vm-storage on a vetoed edge"
                            );
                        }
                        let p2 = pb.evaluate(&a2).expect("second-best is feasible");
                        prop_assert!(
                            close(p2.latency_s * p2.cost_usd, want2.product),
                            "second-best {} vs {}",
                            p2.latency_s * p2.cost_usd,
                            want2.product
                        );
                    }
                    None => prop_assert!(!want2.found, "a second-best exists: {}", want2.product),
                }
            } else {
                prop_assert!(out.second_best.is_none());
            }
        }
        Err(PlanError::Latency { best_s, .. }) => {
            prop_assert!(!want.found);
            prop_assert!(
                close(best_s, want.min_latency),
                "fastest {} vs {}",
                best_s,
                want.min_latency
            );
        }
        Err(PlanError::Cost { best_usd, .. }) => {
            prop_assert!(!want.found);
            prop_assert!(
                close(best_usd, want.min_cost),
                "cheapest {} vs {}",
                best_usd,
                want.min_cost
            );
        }
        Err(PlanError::Both { best_usd, .. }) => {
            prop_assert!(!want.found);
            prop_assert!(
                close(best_usd, want.min_cost_within_latency),
                "{} vs {}",
                best_usd,
                want.min_cost_within_latency
            );
        }
        Err(e) => prop_assert!(false, "unexpected error {e}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, max_global_rejects: 4096, ..ProptestConfig::default() })]

    #[test]
    fn planner_equals_brute_force(c in case()) {
        check(&c, &BTreeMap::new())?;
    }

    #[test]
    fn planner_equals_brute_force_within_vm_limits(
        c in case(),
        limits in prop::collection::vec(prop::option::of(0u32..=3), 3),
    ) {
        let limits: BTreeMap<String, u32> = limits
            .into_iter()
            .enumerate()
            .filter_map(|(i, l)| l.map(|l| (format!("t{i}"), l)))
            .collect();
        check(&c, &limits)?;
    }
}

/// A limit of 2 VMs of the only type: a stage of 6 instances plans 2 VMs (3 lambdas each), not
/// 6; a limit of 0 on a type removes it; the `remote` baseline keeps within the limit too.
#[test]
fn vm_limits_bound_every_stage() {
    let c = Case {
        shape: 0,
        n: 2,
        fanouts: vec![6, 6, 1, 1],
        kinds: vec![1, 0, 0, 0],
        stages: vec![(1000.0, 5.0, 0.5, 0.0); 4],
        bytes: vec![1e6; 4],
        types: vec![(2, 8192, 750.0, 0.1), (4, 8192, 750.0, 0.1)],
        reserve: 512,
        local_usd: 0.08,
        remote: (600.0, 400.0, 25.0, 3500.0, None, 0.023),
        bounds: (0, 1.0, 1.0),
        memory: None,
    };
    let pb = problem(&c, Bounds::default());
    let unlimited = plan(&pb, Policy::Remote).expect("plan");
    assert!(unlimited.best.stages.iter().all(|s| s.vms == 6));
    let limits = BTreeMap::from([("t0".to_owned(), 0), ("t1".to_owned(), 2)]);
    let limited = pb.with_vm_limits(&limits).expect("t1 fits");
    for policy in [Policy::Sonic, Policy::Remote, Policy::Direct, Policy::Local] {
        let out = plan(&limited, policy).expect("plan");
        for st in &out.best.stages {
            assert_eq!(st.vm_type, "t1", "{policy}: t0 is removed");
            assert!(st.vms <= 2, "{policy}: {st:?}");
        }
    }
    assert_eq!(limited.vm_limit(1), Some(2));
    assert_eq!(limited.fit_vms(0, 1, 6), 2);
    assert!(
        limited
            .check_placement(
                0,
                Placement {
                    vm: 1,
                    vms: 3,
                    concurrent: 1
                }
            )
            .is_err()
    );
    let none = BTreeMap::from([("t0".to_owned(), 0), ("t1".to_owned(), 0)]);
    let err = pb.with_vm_limits(&none).expect_err("nothing left");
    assert!(
        err.to_string()
            .contains("fits no VM type within the limits"),
        "{err}"
    );
}

/// The enumeration itself: a chain of two K=2 stages on one VM type with 2 vCPUs has
/// placements (2 VMs, c=1), (1 VM, c=1), (1 VM, c=2) per stage.
#[test]
fn enumeration_counts_every_plan() {
    let c = Case {
        shape: 0,
        n: 2,
        fanouts: vec![2, 2, 1, 1],
        kinds: vec![1, 0, 0, 0],
        stages: vec![(1000.0, 5.0, 0.5, 0.0); 4],
        bytes: vec![1e8; 4],
        types: vec![(2, 8192, 750.0, 0.1)],
        reserve: 512,
        local_usd: 0.08,
        remote: (600.0, 400.0, 25.0, 3500.0, None, 0.023),
        bounds: (0, 1.0, 1.0),
        memory: None,
    };
    let pb = problem(&c, Bounds::default());
    assert_eq!(placements(&pb, 0).len(), 3);
    assert_eq!(pb.edges()[0].kind, EdgeKind::One);
    // direct/remote: 3 x 3 x 2; vm-storage: 3 senders x receivers on the same VMs (c choices).
    let mut feasible = 0;
    let visited = enumerate(&pb, &[false], &mut |_, _, _| feasible += 1);
    assert_eq!(visited, 3 * 3 * 2 + 1 + 2 + 2);
    assert_eq!(feasible, visited);
    // With a memory tier, memory is a third moving method; with one too small for the edge's
    // 100 MB, those plans are visited and refused.
    for (cap, fits) in [(13_383, true), (64, false)] {
        let with = Case {
            memory: Some((0.206, cap, 750.0, 0.5)),
            ..c.clone()
        };
        let pb = problem(&with, Bounds::default());
        let mut feasible = 0;
        let visited = enumerate(&pb, &[false], &mut |_, _, _| feasible += 1);
        assert_eq!(visited, 3 * 3 * 3 + 1 + 2 + 2);
        assert_eq!(feasible, if fits { visited } else { visited - 9 });
    }
}

/// A `direct` sender's VMs are held until its receiver has fetched, so under VM limits (the
/// pool's agents of a type) a direct edge's two ends never share the pool's only VM of a type:
/// such an assignment is infeasible, the `direct` baseline moves the receiver to the next
/// smallest type with room, and every plan the planner makes within the limits keeps each
/// receiver and its direct senders within them.
#[test]
fn direct_ends_never_share_a_vm_under_vm_limits() {
    let c = Case {
        shape: 0,
        n: 3,
        fanouts: vec![1, 1, 1, 1],
        kinds: vec![0, 0, 0, 0],
        stages: vec![(1000.0, 5.0, 0.5, 0.0); 4],
        bytes: vec![1e8; 4],
        // t0 the smallest (the direct baseline's first choice), t1 the next.
        types: vec![(2, 4096, 750.0, 0.1), (2, 8192, 750.0, 0.2)],
        reserve: 512,
        local_usd: 0.08,
        remote: (600.0, 400.0, 25.0, 3500.0, None, 0.023),
        bounds: (0, 1.0, 1.0),
        memory: None,
    };
    let pb = problem(&c, Bounds::default());
    let one_each = BTreeMap::from([("t0".to_owned(), 1), ("t1".to_owned(), 1)]);
    let limited = pb.with_vm_limits(&one_each).expect("limits");
    let on = |vms: &[usize]| Assignment {
        placements: vms
            .iter()
            .map(|&vm| Placement {
                vm,
                vms: 1,
                concurrent: 1,
            })
            .collect(),
        methods: vec![Method::Direct; 2],
    };
    // Without limits the cloud has VMs to spare: all three on t0 is a plan.
    assert!(pb.evaluate(&on(&[0, 0, 0])).is_ok());
    let err = limited
        .evaluate(&on(&[0, 0, 0]))
        .expect_err("s0 and s1 on the one t0 VM");
    assert!(err.to_string().contains("over direct edges"), "{err}");
    // Alternating types is within the limits: s0's VM is given back once s1 has fetched.
    assert!(limited.evaluate(&on(&[0, 1, 0])).is_ok());

    let direct = plan(&limited, Policy::Direct).expect("direct within limits");
    let types: Vec<&str> = direct
        .best
        .stages
        .iter()
        .map(|s| s.vm_type.as_str())
        .collect();
    assert_eq!(types, ["t0", "t1", "t0"]);
    assert!(
        direct.best.edges.iter().all(|e| e.method == Method::Direct),
        "{direct:?}"
    );
    for policy in [Policy::Sonic, Policy::Remote, Policy::Local] {
        let out = plan(&limited, policy).expect("plan");
        let a = out.best.assignment(&limited).expect("assignment");
        limited.evaluate(&a).expect("within the limits");
        for (e, m) in a.methods.iter().enumerate() {
            let (from, to) = (limited.edges()[e].from, limited.edges()[e].to);
            if *m == Method::Direct {
                assert_ne!(
                    a.placements[from].vm, a.placements[to].vm,
                    "{policy}: a direct edge within one VM type of one VM"
                );
            }
        }
    }
}

/// Branches that run at once each hold VMs of their own (sonic_core::held): on a diamond under a
/// limit of 2 VMs of the only type, every edge `remote` with each stage on one VM fits (the two
/// branches hold 2), two VMs for a branch does not (3 at once), and the baselines and the
/// planner keep within it; under a limit of 1 the branches can only share `a`'s VM one after
/// the other (vm-storage), which is what the planner plans, and the `remote` baseline cannot.
#[test]
fn branches_that_run_at_once_never_share_the_pools_vms() {
    let c = Case {
        shape: 3,
        n: 4,
        fanouts: vec![1, 2, 2, 1],
        kinds: vec![0, 0, 0, 0],
        stages: vec![(1000.0, 5.0, 0.5, 0.0); 4],
        bytes: vec![1e7; 4],
        types: vec![(2, 4096, 750.0, 0.1)],
        reserve: 512,
        local_usd: 0.08,
        remote: (600.0, 400.0, 25.0, 3500.0, None, 0.023),
        bounds: (0, 1.0, 1.0),
        memory: None,
    };
    let pb = problem(&c, Bounds::default());
    let two = pb
        .with_vm_limits(&BTreeMap::from([("t0".to_owned(), 2)]))
        .expect("limits");
    let on = |vms: [u32; 4]| Assignment {
        placements: vms
            .iter()
            .map(|&vms| Placement {
                vm: 0,
                vms,
                concurrent: 1,
            })
            .collect(),
        methods: vec![Method::Remote; 4],
    };
    two.evaluate(&on([1, 1, 1, 1]))
        .expect("b and c hold two VMs");
    assert!(pb.evaluate(&on([1, 2, 1, 1])).is_ok(), "no limit, no rule");
    let err = two
        .evaluate(&on([1, 2, 1, 1]))
        .expect_err("b's two VMs and c's one at once");
    assert!(
        err.to_string()
            .contains("s1, s2 hold 3 t0 VMs at the same time"),
        "{err}"
    );
    // (`direct` cannot: d fetches from b and c at once, three VMs.)
    for policy in [Policy::Sonic, Policy::Remote, Policy::Local] {
        let out = plan(&two, policy).unwrap_or_else(|e| panic!("{policy}: {e}"));
        let a = out.best.assignment(&two).expect("assignment");
        assert!(two.over_pool(&a).is_none(), "{policy}: {a:?}");
        assert!(out.exact, "{policy}");
    }
    // The remote baseline gives each branch one VM per lambda, as many as fit beside the other.
    let remote = plan(&two, Policy::Remote).expect("remote");
    let vms: Vec<u32> = remote.best.stages.iter().map(|s| s.vms).collect();
    assert_eq!(vms, [1, 1, 1, 1]);

    let one = pb
        .with_vm_limits(&BTreeMap::from([("t0".to_owned(), 1)]))
        .expect("limits");
    let out = plan(&one, Policy::Sonic).expect("sonic within one VM");
    let a = out.best.assignment(&one).expect("assignment");
    assert!(one.over_pool(&a).is_none());
    assert_eq!(
        (a.methods[0], a.methods[1]),
        (Method::VmStorage, Method::VmStorage),
        "both branches continue on a's VM: {a:?}"
    );
    // Every edge remote cannot hold the branches apart on one VM.
    let err = plan(&one, Policy::Remote).expect_err("remote on one VM");
    assert!(
        err.to_string().contains("hold 2 t0 VMs at the same time"),
        "{err}"
    );
}
