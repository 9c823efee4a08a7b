//! The exact search: a dynamic program over the stages in topological order whose states are
//! *frontiers* — the stages already placed that still have unplaced receivers, with their VM
//! groups — and whose values are Pareto sets of labels (end times, hold times, cost so far).
//!
//! Perf/$ = 1 / (latency * cost) is not a sum over stages, so one score per state (the paper's
//! Viterbi) is not exact; a set of non-dominated labels per state is. For a chain the frontier is
//! the last stage's placement and a label is (latency so far, cost so far), i.e. the Viterbi
//! recursion over labels; forks and joins widen the frontier to every open stage, which keeps
//! shared ancestors consistent (each appears once, with one placement) and stays exact.
//!
//! Dominance (docs/model.md, "Exactness"): label `a` dominates `b` of the same state when every
//! time of `a` is at most `b`'s and `a`'s cost plus a bound on what the earlier times could
//! still cost later (waiting storage, VM holds that a later transfer would have covered anyway)
//! is at most `b`'s cost; a common shift of all times is free, as the future is translation
//! invariant when no unplaced root remains. Pruning: the bounds, and a lower bound on the final
//! latency * cost against the best plan known (baselines evaluated first).

use std::collections::HashMap;

use crate::dag::Bounds;
use crate::model::{Assignment, Groups, Host, Method, Placement, PlanProblem, Sender};
use crate::planner::budget::{Limit, Meter};
use crate::planner::{PlanError, Policy, baseline, local_on};

/// More incoming edges than this make the method enumeration (up to 3^edges) unreasonable; a
/// DAG file is refused with more ([`crate::dag::MAX_INPUTS`]), a problem built otherwise here.
pub(crate) const MAX_INPUTS: usize = crate::dag::MAX_INPUTS;

/// A placement class of a stage: VM type and count; the concurrency varies within it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Opt {
    pub vm: usize,
    pub vms: u32,
    pub per_vm: u32,
    /// Most lambdas at once on one VM (memory, vCPUs, and the VM's load).
    pub cmax: u32,
    /// The concurrency that keeps the stage busy the least ([`PlanProblem::best_concurrent`]):
    /// `cmax` for a single-threaded function.
    pub best_c: u32,
    pub rate: f64,
}

/// Where a (VM type, VM count) sits in a stage's option list.
#[derive(Debug, Clone)]
pub(crate) struct OptIndex {
    /// The stage's VM counts, descending.
    counts: Vec<u32>,
    /// Per VM type, the index of its first option and how many of the largest `counts` the
    /// type's VM limit leaves out (`None`: the stage does not fit it).
    base: Vec<Option<(u32, usize)>>,
}

impl OptIndex {
    pub fn get(&self, vm: usize, vms: u32) -> Option<u32> {
        let (base, skip) = (*self.base.get(vm)?)?;
        let pos = self.counts.binary_search_by(|c| vms.cmp(c)).ok()?;
        let pos = pos.checked_sub(skip)?;
        Some(base + pos as u32)
    }
}

/// Every placement class of every stage (VM types it fits x the VM counts its fanout and the
/// type's VM limit allow), and an index from (VM type, VM count) to its position.
pub(crate) fn options(pb: &PlanProblem) -> (Vec<Vec<Opt>>, Vec<OptIndex>) {
    let n = pb.stages().len();
    let types = pb.catalog().vm_types.len();
    let mut opts = Vec::with_capacity(n);
    let mut index = Vec::with_capacity(n);
    for s in 0..n {
        let counts = pb.vm_counts(s);
        let mut row = Vec::with_capacity(types * counts.len());
        let mut base = vec![None; types];
        for (vm, slot) in base.iter_mut().enumerate() {
            let cm = pb.max_concurrent(s, vm);
            if cm == 0 {
                continue;
            }
            // Counts are descending: those over the type's limit are a prefix.
            let skip = pb
                .vm_limit(vm)
                .map_or(0, |l| counts.iter().take_while(|&&c| c > l).count());
            if skip == counts.len() {
                continue;
            }
            *slot = Some((row.len() as u32, skip));
            for &vms in &counts[skip..] {
                let per_vm = pb.per_vm(s, vms);
                row.push(Opt {
                    vm,
                    vms,
                    per_vm,
                    cmax: cm.min(per_vm),
                    best_c: pb.best_concurrent(s, vm, vms),
                    rate: pb.rate(vm, vms),
                });
            }
        }
        opts.push(row);
        index.push(OptIndex { counts, base });
    }
    (opts, index)
}

/// How a label was made: the stage's placement and its incoming methods (2 bits per incoming
/// edge, in the problem's order).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Back {
    prev: u32,
    pub pl: Placement,
    pub methods: u64,
}

/// The best label seen per stage and VM type, for the explanation table.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Seen {
    pub end: f64,
    pub cost: f64,
    pub pl: Placement,
    pub methods: u64,
    /// Labels kept for this stage and VM type (before later dominance).
    pub labels: u32,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct Stats {
    /// `[stage][vm]`.
    pub seen: Vec<Vec<Option<Seen>>>,
    /// Candidate placements x methods evaluated per stage.
    pub evaluated: Vec<u64>,
}

pub(crate) struct Solved {
    pub best: Option<Assignment>,
    /// What the search saw; when a limit stopped it, what it saw until then.
    pub stats: Stats,
}

/// Precomputed structure of one problem.
pub(crate) struct Search<'a> {
    pb: &'a PlanProblem,
    opts: Vec<Vec<Opt>>,
    opt_of: Vec<OptIndex>,
    /// `open[i]`: stages placed once stage `i` is, that still have unplaced receivers.
    open: Vec<Vec<usize>>,
    /// `src[i][j]`: where open stage `j` of layer `i` was in layer `i - 1` (`None`: it is `i`).
    src: Vec<Vec<Option<usize>>>,
    /// `in_pos[r][k]`: the position in layer `r - 1` of the sender of `r`'s k-th incoming edge.
    in_pos: Vec<Vec<usize>>,
    has_children: Vec<bool>,
    /// Longest path of least busy times ([`PlanProblem::least_busy_s`]) from a stage
    /// (excluded) to a sink.
    tail_t: Vec<f64>,
    /// A lower bound on the cost of the stages after `i` (chains only; 0 otherwise).
    tail_c: Vec<f64>,
    /// `w_e[i][j]`: per second that open stage `j` of layer `i` ended earlier, at most this much
    /// more storage may be paid later (its unplaced out-edges' bytes at the dearest price).
    w_e: Vec<Vec<f64>>,
    /// Whether a stage after `i` has no sender (starts at time 0: no translation invariance).
    roots_ahead: Vec<bool>,
    /// Enumerate every concurrency; on a chain the least busy one dominates (docs/model.md).
    all_c: bool,
}

/// What a state costs besides its key's ids: the key's and the label list's headers and the
/// hash table's slot, roughly.
const STATE_BYTES: usize = 64;

/// Labels of one layer, grouped by state key.
struct Layer {
    /// Open stages.
    d: usize,
    keys: HashMap<Vec<u32>, Vec<u32>>,
    /// Per label: E[d], hold[d], busy[d], M, C (hold and busy at a group's first position).
    vals: Vec<f64>,
    back: Vec<Back>,
}

impl Layer {
    fn stride(&self) -> usize {
        3 * self.d + 2
    }

    fn label(&self, id: u32) -> &[f64] {
        let s = self.stride();
        &self.vals[id as usize * s..(id as usize + 1) * s]
    }
}

/// `a` dominates `b` (see the module documentation).
fn dominates(
    a: &[f64],
    b: &[f64],
    d: usize,
    w_e: &[f64],
    w_h: &[f64],
    canon: &[u32],
    shift: bool,
) -> bool {
    let (ma, mb) = (a[3 * d], b[3 * d]);
    if ma > mb {
        return false;
    }
    let mut delta = f64::INFINITY;
    for j in 0..d {
        let de = b[j] - a[j];
        if de < 0.0 {
            return false;
        }
        delta = delta.min(de);
        if canon[j] as usize == j {
            let (dh, db) = (b[d + j] - a[d + j], b[2 * d + j] - a[2 * d + j]);
            if dh < 0.0 || db < 0.0 {
                return false;
            }
            delta = delta.min(dh).min(db);
        }
    }
    if !shift || d == 0 {
        delta = 0.0;
    }
    let mut penalty = 0.0;
    for j in 0..d {
        penalty += w_e[j] * (b[j] - a[j] - delta);
        if canon[j] as usize == j {
            penalty += w_h[j] * (b[d + j] - a[d + j] - delta);
        }
    }
    a[3 * d + 1] + penalty <= b[3 * d + 1]
}

pub(crate) fn encode(m: Method) -> u64 {
    match m {
        Method::VmStorage => 0,
        Method::Direct => 1,
        Method::Remote => 2,
        Method::Memory => 3,
    }
}

pub(crate) fn decode(bits: u64, k: usize) -> Method {
    match (bits >> (2 * k)) & 3 {
        0 => Method::VmStorage,
        1 => Method::Direct,
        2 => Method::Remote,
        _ => Method::Memory,
    }
}

impl<'a> Search<'a> {
    pub fn new(pb: &'a PlanProblem) -> Result<Search<'a>, PlanError> {
        let n = pb.stages().len();
        for s in 0..n {
            if pb.incoming(s).len() > MAX_INPUTS {
                return Err(PlanError::TooManyInputs {
                    stage: pb.stages()[s].name.clone(),
                    edges: pb.incoming(s).len(),
                    max: MAX_INPUTS,
                });
            }
        }
        let (opts, opt_of) = options(pb);
        let last_child: Vec<Option<usize>> = (0..n)
            .map(|s| pb.outgoing(s).iter().map(|&e| pb.edges()[e].to).max())
            .collect();
        let mut open: Vec<Vec<usize>> = Vec::with_capacity(n);
        let mut src = Vec::with_capacity(n);
        let mut in_pos = Vec::with_capacity(n);
        for i in 0..n {
            let now: Vec<usize> = (0..=i)
                .filter(|&s| last_child[s].is_some_and(|c| c > i))
                .collect();
            let before: &[usize] = if i == 0 { &[] } else { &open[i - 1] };
            src.push(
                now.iter()
                    .map(|&s| {
                        if s == i {
                            None
                        } else {
                            before.iter().position(|&b| b == s)
                        }
                    })
                    .collect(),
            );
            let mut ip = Vec::new();
            for &e in pb.incoming(i) {
                let from = pb.edges()[e].from;
                let pos = before.iter().position(|&b| b == from).ok_or_else(|| {
                    PlanError::Internal(format!("sender of edge {e} is not open before stage {i}"))
                })?;
                ip.push(pos);
            }
            in_pos.push(ip);
            open.push(now);
        }
        let mut tail_t = vec![0.0; n];
        for s in (0..n).rev() {
            tail_t[s] = pb
                .outgoing(s)
                .iter()
                .map(|&e| {
                    let c = pb.edges()[e].to;
                    pb.least_busy_s(c) + tail_t[c]
                })
                .fold(0.0, f64::max);
        }
        let roots = (0..n).filter(|&s| pb.incoming(s).is_empty()).count();
        let chain =
            roots == 1 && (0..n).all(|s| pb.incoming(s).len() <= 1 && pb.outgoing(s).len() <= 1);
        let mut tail_c = vec![0.0; n];
        if chain {
            // Each later stage costs at least its cheapest compute: on a chain a stage's VMs are
            // held at least for its compute, and nothing it runs on is already paid for.
            for i in (0..n.saturating_sub(1)).rev() {
                let s = i + 1;
                let min = opts[s]
                    .iter()
                    .map(|o| {
                        o.rate
                            * pb.busy_s(
                                s,
                                Placement {
                                    vm: o.vm,
                                    vms: o.vms,
                                    concurrent: o.best_c,
                                },
                            )
                    })
                    .fold(f64::INFINITY, f64::min);
                tail_c[i] = tail_c[s] + if min.is_finite() { min } else { 0.0 };
            }
        }
        // The dearest place a file can wait in: a disk, the store, or the memory tier.
        let price = pb
            .local_price()
            .max(pb.remote_price())
            .max(pb.memory_price());
        let w_e = (0..n)
            .map(|i| {
                open[i]
                    .iter()
                    .map(|&s| {
                        pb.outgoing(s)
                            .iter()
                            .filter(|&&e| pb.edges()[e].to > i)
                            .map(|&e| pb.edges()[e].bytes * price)
                            .sum()
                    })
                    .collect()
            })
            .collect();
        let roots_ahead = (0..n)
            .map(|i| (i + 1..n).any(|s| pb.incoming(s).is_empty()))
            .collect();
        Ok(Search {
            pb,
            opts,
            opt_of,
            open,
            src,
            in_pos,
            has_children: last_child.iter().map(Option::is_some).collect(),
            tail_t,
            tail_c,
            w_e,
            roots_ahead,
            all_c: !chain,
        })
    }

    /// Concurrencies to try for an option.
    fn cs(&self, o: &Opt) -> std::ops::RangeInclusive<u32> {
        if self.all_c {
            1..=o.cmax
        } else {
            o.best_c..=o.best_c
        }
    }

    /// The best plan (min latency * cost) meeting the bounds with no vm-storage on `banned`
    /// edges; `prune`: use the bounds and the baselines to cut the search.
    /// `extra`: more candidate plans for the incumbent (e.g. the chain search's hull vertices).
    /// When `meter` stops the search, the best of those candidates and the baselines (the
    /// incumbent), if one meets the bounds: the caller sees `meter.stopped()`.
    pub fn solve(
        &self,
        banned: &[bool],
        prune: bool,
        extra: &[Assignment],
        meter: &Meter<'_>,
    ) -> Solved {
        let bounds = if prune {
            self.pb.bounds()
        } else {
            Bounds::default()
        };
        let (incumbent, inc_plan) = if prune {
            self.incumbent(banned, bounds, extra)
        } else {
            (f64::INFINITY, None)
        };
        let (last, backs, stats) = match self.run(banned, bounds, incumbent, meter, false) {
            Ok(done) => done,
            Err((_, stats)) => {
                return Solved {
                    best: inc_plan,
                    stats,
                };
            }
        };
        let (best, unfit) = self.best_fitting(&last, &backs);
        let (best, stats) = match best {
            // Under VM limits the best plan kept may hold more VMs at once than the pool has
            // (`PlanProblem::over_pool`, known only of a complete plan), and labels it dominated
            // are gone: the search runs again keeping every label, and its best fitting plan is
            // the optimum. When the budget stops it, the best fitting plan of the first search
            // (or the incumbent) comes back, `meter.stopped()` saying so.
            _ if unfit => match self.run(banned, bounds, incumbent, meter, true) {
                Ok((last, backs, stats)) => (self.best_fitting(&last, &backs).0, stats),
                Err((_, stats)) => (best, stats),
            },
            _ => (best, stats),
        };
        let best = match (best, inc_plan) {
            (Some((p, a)), inc) if p < incumbent || inc.is_none() => Some(a),
            (_, inc) => inc,
        };
        Solved { best, stats }
    }

    /// The best complete plan (min latency * cost) of a search's last layer that fits the
    /// pool's VM limits, and whether a better one did not.
    fn best_fitting(&self, last: &Layer, backs: &[Vec<Back>]) -> (Option<(f64, Assignment)>, bool) {
        let mut ends: Vec<(f64, u32)> = last
            .keys
            .get(&Vec::new())
            .map(|ids| {
                ids.iter()
                    .map(|&id| (last.label(id)[0] * last.label(id)[1], id))
                    .collect()
            })
            .unwrap_or_default();
        ends.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
        let mut unfit = false;
        for (product, id) in ends {
            let a = self.rebuild(backs, id);
            if self.pb.over_pool(&a).is_none() {
                return (Some((product, a)), unfit);
            }
            unfit = true;
        }
        (None, unfit)
    }

    /// Every (latency, cost) at the end of a search cut only by `bounds`: the Pareto front of
    /// the plans within them; or the limit that stopped the search.
    pub fn front(
        &self,
        banned: &[bool],
        bounds: Bounds,
        meter: &Meter<'_>,
    ) -> Result<Vec<(f64, f64)>, Limit> {
        // Under VM limits, the plans that fit the pool; when some kept do not, from a search
        // that keeps every label (see `solve`).
        let mut keep_all = false;
        loop {
            let (last, backs, _) = self
                .run(banned, bounds, f64::INFINITY, meter, keep_all)
                .map_err(|(limit, _)| limit)?;
            let ids = last.keys.get(&Vec::new()).cloned().unwrap_or_default();
            let fits: Vec<bool> = ids
                .iter()
                .map(|&id| self.pb.over_pool(&self.rebuild(&backs, id)).is_none())
                .collect();
            if keep_all || fits.iter().all(|&f| f) {
                return Ok(ids
                    .iter()
                    .zip(fits)
                    .filter(|(_, f)| *f)
                    .map(|(&id, _)| (last.label(id)[0], last.label(id)[1]))
                    .collect());
            }
            keep_all = true;
        }
    }

    /// The best baseline-like plan that is allowed and meets the bounds: its latency * cost
    /// bounds the search from above.
    fn incumbent(
        &self,
        banned: &[bool],
        bounds: Bounds,
        extra: &[Assignment],
    ) -> (f64, Option<Assignment>) {
        let pb = self.pb;
        let n = pb.stages().len();
        let mut candidates = vec![baseline(pb, Policy::Remote), baseline(pb, Policy::Direct)];
        candidates.extend(extra.iter().cloned());
        for vm in 0..pb.catalog().vm_types.len() {
            if let Some(a) = local_on(pb, vm) {
                candidates.push(a);
            }
            if (0..n).all(|s| pb.max_concurrent(s, vm) > 0) {
                let placements: Vec<Placement> = (0..n)
                    .map(|s| {
                        let c = pb.max_concurrent(s, vm);
                        pb.placement_from_per_vm(s, vm, c, c)
                    })
                    .collect();
                for m in [Method::Direct, Method::Remote, Method::Memory] {
                    candidates.push(Assignment {
                        placements: placements.clone(),
                        methods: vec![m; pb.edges().len()],
                    });
                }
            }
        }
        let mut best = (f64::INFINITY, None);
        for a in candidates {
            if a.methods
                .iter()
                .zip(banned)
                .any(|(m, &b)| b && *m == Method::VmStorage)
            {
                continue;
            }
            let Ok(p) = pb.evaluate(&a) else { continue };
            if bounds.max_latency_s.is_some_and(|l| p.latency_s > l)
                || bounds.max_cost_usd.is_some_and(|c| p.cost_usd > c)
            {
                continue;
            }
            let product = p.latency_s * p.cost_usd;
            if product < best.0 {
                best = (product, Some(a));
            }
        }
        best
    }

    fn rebuild(&self, backs: &[Vec<Back>], mut id: u32) -> Assignment {
        let pb = self.pb;
        let n = pb.stages().len();
        let mut placements = vec![
            Placement {
                vm: 0,
                vms: 1,
                concurrent: 1
            };
            n
        ];
        let mut methods = vec![Method::Direct; pb.edges().len()];
        for r in (0..n).rev() {
            let b = backs[r][id as usize];
            placements[r] = b.pl;
            for (k, &e) in pb.incoming(r).iter().enumerate() {
                methods[e] = decode(b.methods, k);
            }
            id = b.prev;
        }
        Assignment {
            placements,
            methods,
        }
    }

    /// The layers of the search; returns the last one, every layer's back pointers, and stats;
    /// or the limit that stopped it, with the stats until then. `keep_all`: no label dominates
    /// another (every plan within the bounds and the incumbent is kept).
    #[allow(clippy::type_complexity)]
    fn run(
        &self,
        banned: &[bool],
        bounds: Bounds,
        incumbent: f64,
        meter: &Meter<'_>,
        keep_all: bool,
    ) -> Result<(Layer, Vec<Vec<Back>>, Stats), (Limit, Stats)> {
        let pb = self.pb;
        let n = pb.stages().len();
        let types = pb.catalog().vm_types.len();
        let mut stats = Stats {
            seen: vec![vec![None; types]; n],
            evaluated: vec![0; n],
        };
        let mut layer = Layer {
            d: 0,
            keys: HashMap::new(),
            vals: vec![0.0, 0.0],
            back: Vec::new(),
        };
        layer.keys.insert(Vec::new(), vec![0]);
        meter.new_search();
        if let Err(limit) = meter.check() {
            return Err((limit, stats));
        }
        let mut backs = Vec::with_capacity(n);
        for r in 0..n {
            let mut next = match self.advance(
                r, &layer, banned, bounds, incumbent, keep_all, &mut stats, meter,
            ) {
                Ok(next) => next,
                Err(limit) => return Err((limit, stats)),
            };
            backs.push(std::mem::take(&mut next.back));
            layer = next;
        }
        // The last layer has no open stage: its labels are (M, C) = (latency, cost).
        Ok((layer, backs, stats))
    }

    /// Places stage `r` in every way from every label of `prev`, each candidate and each label
    /// kept counted by `meter`, which may stop it.
    #[allow(clippy::too_many_arguments)]
    fn advance(
        &self,
        r: usize,
        prev: &Layer,
        banned: &[bool],
        bounds: Bounds,
        incumbent: f64,
        keep_all: bool,
        stats: &mut Stats,
        meter: &Meter<'_>,
    ) -> Result<Layer, Limit> {
        let pb = self.pb;
        let d = prev.d;
        let before: &[usize] = if r == 0 { &[] } else { &self.open[r - 1] };
        let now = &self.open[r];
        let d2 = now.len();
        let mut next = Layer {
            d: d2,
            keys: HashMap::new(),
            vals: Vec::new(),
            back: Vec::new(),
        };
        let incoming = pb.incoming(r);
        let in_pos = &self.in_pos[r];
        let shift = !self.roots_ahead[r];
        let k_r = pb.stages()[r].instances;

        // Scratch space reused across labels.
        let mut hold = vec![0.0; d];
        let mut busy = vec![0.0; d];
        let mut rate = vec![0.0; d];
        let mut senders: Vec<Sender> = Vec::with_capacity(incoming.len());
        let mut times = Vec::with_capacity(incoming.len());
        let mut cand = vec![0.0; 3 * d2 + 2];
        let mut methods = vec![Method::Direct; incoming.len()];
        let mut key2 = vec![0u32; 2 * d2];
        let mut gid2 = vec![0usize; d2];
        let mut w_h = vec![0.0; d2];
        const NEW: usize = usize::MAX;

        for (key, ids) in &prev.keys {
            for j in 0..d {
                let c = key[2 * j + 1] as usize;
                let o = &self.opts[before[j]][key[2 * j] as usize];
                if c == j {
                    rate[j] = o.rate;
                }
            }
            // Hosts: new VMs, or the group of some sender (vm-storage), when every edge from that
            // group may use vm-storage.
            let mut hosts: Vec<Host> = vec![Host::New];
            for &p in in_pos {
                let g = key[2 * p + 1] as usize;
                if hosts.contains(&Host::Continue(g)) {
                    continue;
                }
                let go = &self.opts[before[g]][key[2 * g] as usize];
                let ok = pb.max_concurrent(r, go.vm) > 0
                    && go.vms <= k_r
                    && self.opt_of[r].get(go.vm, go.vms).is_some()
                    && incoming.iter().zip(in_pos).all(|(&e, &q)| {
                        key[2 * q + 1] as usize != g
                            || (!banned[e]
                                && (pb.edges()[e].kind == crate::dag::EdgeKind::One || go.vms == 1))
                    });
                if ok {
                    hosts.push(Host::Continue(g));
                }
            }
            for host in hosts {
                let r_opts: Vec<u32> = match host {
                    Host::New => (0..self.opts[r].len() as u32).collect(),
                    Host::Continue(g) => {
                        let go = &self.opts[before[g]][key[2 * g] as usize];
                        self.opt_of[r]
                            .get(go.vm, go.vms)
                            .map(|o| vec![o])
                            .unwrap_or_default()
                    }
                };
                // Edges whose method is free (not tied to the host group).
                let free: Vec<usize> = (0..incoming.len())
                    .filter(|&k| match host {
                        Host::New => true,
                        Host::Continue(g) => key[2 * in_pos[k] + 1] as usize != g,
                    })
                    .collect();
                for &o_r in &r_opts {
                    let o = self.opts[r][o_r as usize];
                    // The next state's key: open stages' options and groups.
                    for (j2, s2) in self.src[r].iter().enumerate() {
                        match s2 {
                            Some(j) => {
                                key2[2 * j2] = key[2 * j];
                                gid2[j2] = key[2 * j + 1] as usize;
                            }
                            None => {
                                key2[2 * j2] = o_r;
                                gid2[j2] = match host {
                                    Host::New => NEW,
                                    Host::Continue(g) => g,
                                };
                            }
                        }
                    }
                    for j2 in 0..d2 {
                        let first = (0..=j2).find(|&x| gid2[x] == gid2[j2]).unwrap_or(j2);
                        key2[2 * j2 + 1] = first as u32;
                        w_h[j2] = if first == j2 {
                            self.opts[now[j2]][key2[2 * j2] as usize].rate
                        } else {
                            0.0
                        };
                    }
                    let canon2: Vec<u32> = (0..d2).map(|j2| key2[2 * j2 + 1]).collect();
                    for c in self.cs(&o) {
                        let pl = Placement {
                            vm: o.vm,
                            vms: o.vms,
                            concurrent: c,
                        };
                        // Every combination of the free edges' methods, counted in mixed radix
                        // (direct, remote, and memory where the edge fits the tier).
                        let choices: Vec<&[Method]> = free
                            .iter()
                            .map(|&k| pb.moving_methods(incoming[k]))
                            .collect();
                        let combos: u64 = choices.iter().map(|c| c.len() as u64).product();
                        for combo in 0..combos {
                            let mut bits = 0u64;
                            let mut rest = combo;
                            for (k, m) in methods.iter_mut().enumerate() {
                                *m = Method::VmStorage;
                                if let Some(f) = free.iter().position(|&x| x == k) {
                                    let c = choices[f];
                                    *m = c[(rest % c.len() as u64) as usize];
                                    rest /= c.len() as u64;
                                }
                                bits |= encode(*m) << (2 * k);
                            }
                            for &id in ids {
                                let v = prev.label(id);
                                hold.copy_from_slice(&v[d..2 * d]);
                                busy.copy_from_slice(&v[2 * d..3 * d]);
                                senders.clear();
                                for (k, &e) in incoming.iter().enumerate() {
                                    let j = in_pos[k];
                                    let so = &self.opts[before[j]][key[2 * j] as usize];
                                    senders.push(Sender {
                                        edge: e,
                                        method: methods[k],
                                        end: v[j],
                                        vm: so.vm,
                                        vms: so.vms,
                                        per_vm: so.per_vm,
                                        group: key[2 * j + 1] as usize,
                                    });
                                }
                                let mut groups = Groups {
                                    hold: &mut hold,
                                    busy: &mut busy,
                                    rate: &rate,
                                };
                                if !pb.direct_fits(pl, host, &senders) {
                                    continue;
                                }
                                let out = pb.step(r, pl, host, &senders, &mut groups, &mut times);
                                stats.evaluated[r] += 1;
                                meter.expand(1)?;
                                let cost = v[3 * d + 1] + out.cost;
                                let mut m = v[3 * d];
                                if !self.has_children[r] {
                                    m = m.max(out.end);
                                }
                                let mut lb_t = m;
                                for (j2, s2) in self.src[r].iter().enumerate() {
                                    let e = match s2 {
                                        Some(j) => v[*j],
                                        None => out.end,
                                    };
                                    cand[j2] = e;
                                    lb_t = lb_t.max(e + self.tail_t[now[j2]]);
                                    if key2[2 * j2 + 1] as usize == j2 {
                                        let (h, b) = match gid2[j2] {
                                            NEW => (out.end, out.end),
                                            g => (hold[g], busy[g]),
                                        };
                                        cand[d2 + j2] = h;
                                        cand[2 * d2 + j2] = b;
                                    } else {
                                        cand[d2 + j2] = 0.0;
                                        cand[2 * d2 + j2] = 0.0;
                                    }
                                }
                                cand[3 * d2] = m;
                                cand[3 * d2 + 1] = cost;
                                if bounds.max_cost_usd.is_some_and(|b| cost > b)
                                    || bounds.max_latency_s.is_some_and(|b| lb_t > b)
                                    || lb_t * (cost + self.tail_c[r]) >= incumbent
                                {
                                    continue;
                                }
                                let back = Back {
                                    prev: id,
                                    pl,
                                    methods: bits,
                                };
                                if let Some(bytes) = next.insert(
                                    &key2,
                                    &cand,
                                    back,
                                    &self.w_e[r],
                                    &w_h,
                                    &canon2,
                                    shift,
                                    keep_all,
                                ) {
                                    meter.keep(bytes)?;
                                    let seen = &mut stats.seen[r][o.vm];
                                    let labels = seen.map_or(0, |s| s.labels) + 1;
                                    if seen.is_none_or(|s| out.end * cost < s.end * s.cost) {
                                        *seen = Some(Seen {
                                            end: out.end,
                                            cost,
                                            pl,
                                            methods: bits,
                                            labels,
                                        });
                                    } else if let Some(s) = seen {
                                        s.labels = labels;
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        Ok(next)
    }
}

impl Layer {
    /// Adds a label unless one of its state dominates it; drops the ones it dominates (their
    /// values stay until the layer is dropped). Returns the bytes the layer grew by, if added.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &mut self,
        key: &[u32],
        cand: &[f64],
        back: Back,
        w_e: &[f64],
        w_h: &[f64],
        canon: &[u32],
        shift: bool,
        keep_all: bool,
    ) -> Option<u64> {
        let d = self.d;
        let stride = self.stride();
        let vals = &self.vals;
        // A label's values, back pointer and id; a new state's key and map entry.
        let mut bytes = (stride * size_of::<f64>() + size_of::<Back>() + size_of::<u32>()) as u64;
        let list = match self.keys.get_mut(key) {
            Some(list) => list,
            None => {
                bytes += (size_of_val(key) + STATE_BYTES) as u64;
                self.keys.entry(key.to_vec()).or_default()
            }
        };
        if !keep_all {
            for &id in list.iter() {
                let v = &vals[id as usize * stride..(id as usize + 1) * stride];
                if dominates(v, cand, d, w_e, w_h, canon, shift) {
                    return None;
                }
            }
            list.retain(|&id| {
                let v = &vals[id as usize * stride..(id as usize + 1) * stride];
                !dominates(cand, v, d, w_e, w_h, canon, shift)
            });
        }
        let id = self.back.len() as u32;
        list.push(id);
        self.vals.extend_from_slice(cand);
        self.back.push(back);
        Some(bytes)
    }
}
