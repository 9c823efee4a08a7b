//! The exact fast path for chains without binding bounds.
//!
//! On a chain, latency and cost are both sums of per-edge increments, and the objective
//! latency * cost is quasi-concave and increasing in both. Its minimum over any finite set of
//! (latency, cost) points is therefore reached at a vertex of the lower-left convex hull of the
//! set: a plan that minimizes `w_l * latency + w_c * cost` for some weights. Such a plan is
//! found by a scalar Viterbi recursion (one number per stage and placement, which *is* exact for
//! a weighted sum), and the hull's vertices by the dichotomic search of Aneja and Nair: solve
//! for the weights normal to the segment between two known vertices, recurse on both sides of
//! any new vertex. A segment is skipped when no point of the triangle it leaves open (between
//! the segment and the two supporting lines) could beat the best product found.
//!
//! Each recursion step is O(P log P) per edge rather than O(P^2): `remote` is separable (upload
//! depends only on the sender, download only on the receiver); `direct` couples the two through
//! `max(sender time, receiver time)`, which two sweeps with Li Chao trees (lower envelopes of
//! lines) resolve; `vm-storage` maps each sender placement to one receiver placement.
//! Concurrency is always the largest allowed: on a chain it dominates (docs/model.md).

use crate::dag::EdgeKind;
use crate::model::{Assignment, Method, Placement, PlanProblem};
use crate::planner::budget::Meter;
use crate::planner::dp::{Opt, Seen, Stats, options};

/// Below this many placements on a side, `direct` is scored pairwise.
const PAIRWISE: usize = 8;
/// A safety net: a chain's hull has far fewer vertices than this.
const MAX_SOLVES: usize = 4096;

/// Whether `pb` is one chain: a single root, every stage with at most one sender and one
/// receiver.
pub(crate) fn is_chain(pb: &PlanProblem) -> bool {
    let n = pb.stages().len();
    let roots = (0..n).filter(|&s| pb.incoming(s).is_empty()).count();
    roots == 1 && (0..n).all(|s| pb.incoming(s).len() <= 1 && pb.outgoing(s).len() <= 1)
}

/// Per-placement terms of one edge `i -> i+1`.
struct Link {
    edge: usize,
    broadcast: bool,
    /// Sender side: direct send time of the busiest VM (for a broadcast: per receiving VM).
    x: Vec<f64>,
    /// Sender side: upload time.
    up: Vec<f64>,
    /// Sender side: cost per second of transfer (sender VMs held, sender's copy stored).
    a: Vec<f64>,
    /// Receiver side: direct receive time of the busiest VM.
    z: Vec<f64>,
    down: Vec<f64>,
    /// Receiver side: cost per second of the stage (its VMs, the copies on its disks).
    b: Vec<f64>,
    /// Receiver side: store time of the edge's bytes per second of download, and GET cost.
    remote_per_s: f64,
    gets: Vec<f64>,
    puts: f64,
    /// `memory`, when the edge fits the memory tier: upload per sender placement, download per
    /// receiver placement, and the tier's cost of the edge's bytes per second of download.
    memory: Option<MemoryLink>,
    /// Receiver side: VM count (broadcast sends one copy per receiving VM).
    nr: Vec<f64>,
    /// Sender placement -> receiver placement under vm-storage, when feasible.
    vm_to: Vec<Option<u32>>,
    /// Storage cost per second of the receiver's compute under vm-storage.
    vm_store: f64,
    /// Senders by `x`, receivers by `z`, receivers by `b` (the order of `w_c * b + w_l` for
    /// any weights), and each receiver's rank in the last.
    by_x: Vec<u32>,
    by_z: Vec<u32>,
    by_b: Vec<u32>,
    rank_b: Vec<u32>,
}

/// The `memory` terms of one edge (separable as `remote`'s).
struct MemoryLink {
    up: Vec<f64>,
    down: Vec<f64>,
    per_s: f64,
}

#[derive(Debug, Clone, Copy)]
struct Cell {
    v: f64,
    e: f64,
    c: f64,
    prev: u32,
    method: Method,
}

const NONE: Cell = Cell {
    v: f64::INFINITY,
    e: f64::INFINITY,
    c: f64::INFINITY,
    prev: u32::MAX,
    method: Method::Direct,
};

/// How `direct` transitions are scored (tests compare them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirectMode {
    Auto,
    #[cfg_attr(not(test), allow(dead_code))]
    Pairwise,
    #[cfg_attr(not(test), allow(dead_code))]
    LiChao,
}

pub(crate) struct Chain<'a> {
    pb: &'a PlanProblem,
    direct: DirectMode,
    opts: Vec<Vec<Opt>>,
    comp: Vec<Vec<f64>>,
    links: Vec<Link>,
}

/// A point found by the search.
#[derive(Debug, Clone)]
struct Point {
    l: f64,
    c: f64,
    a: Assignment,
}

#[derive(Debug, Clone)]
pub(crate) struct ChainResult {
    /// The plan with the least latency * cost, and every plan found with its (latency, cost)
    /// (incumbents under bounds).
    pub best: Assignment,
    pub points: Vec<(f64, f64, Assignment)>,
    pub stats: Stats,
    /// Half-planes `w . (latency, cost) >= v` that hold for every plan.
    pub cuts: Vec<((f64, f64), f64)>,
}

/// Indices of `v` in ascending order.
fn sorted(v: &[f64]) -> Vec<u32> {
    let mut keyed: Vec<(f64, u32)> = v.iter().enumerate().map(|(i, &k)| (k, i as u32)).collect();
    keyed.sort_unstable_by(|p, q| p.0.total_cmp(&q.0));
    keyed.into_iter().map(|k| k.1).collect()
}

/// Li Chao tree: the lower envelope of lines `a + b * x`, queried at fixed, sorted
/// coordinates. Storage is reused across queries sets.
#[derive(Default)]
struct LiChao {
    xs: Vec<f64>,
    tree: Vec<(f64, f64, u32)>,
}

const EMPTY: u32 = u32::MAX;

impl LiChao {
    fn reset(&mut self, xs: impl Iterator<Item = f64>) {
        self.xs.clear();
        self.xs.extend(xs);
        self.tree.clear();
        self.tree
            .resize(4 * self.xs.len().max(1), (0.0, 0.0, EMPTY));
    }

    fn insert(&mut self, a: f64, b: f64, id: u32) {
        if self.xs.is_empty() {
            return;
        }
        let f = |l: (f64, f64, u32), x: f64| l.0 + l.1 * x;
        let (mut node, mut lo, mut hi) = (1usize, 0usize, self.xs.len() - 1);
        let mut line = (a, b, id);
        loop {
            let cur = self.tree[node];
            if cur.2 == EMPTY {
                self.tree[node] = line;
                return;
            }
            let mid = (lo + hi) / 2;
            let (xl, xm, xr) = (self.xs[lo], self.xs[mid], self.xs[hi]);
            let (mut keep, mut push) = (cur, line);
            if f(push, xm) < f(keep, xm) {
                std::mem::swap(&mut keep, &mut push);
            }
            self.tree[node] = keep;
            if lo == hi {
                return;
            }
            if f(push, xl) < f(keep, xl) {
                node *= 2;
                hi = mid;
            } else if f(push, xr) < f(keep, xr) {
                node = node * 2 + 1;
                lo = mid + 1;
            } else {
                return;
            }
            line = push;
        }
    }

    /// The lowest line at coordinate index `i`: (value, id).
    fn query(&self, i: usize) -> Option<(f64, u32)> {
        let x = self.xs[i];
        let (mut node, mut lo, mut hi) = (1usize, 0usize, self.xs.len() - 1);
        let mut best: Option<(f64, u32)> = None;
        loop {
            let (a, b, id) = self.tree[node];
            if id == EMPTY {
                return best;
            }
            let v = a + b * x;
            if best.is_none_or(|(bv, _)| v < bv) {
                best = Some((v, id));
            }
            if lo == hi {
                return best;
            }
            let mid = (lo + hi) / 2;
            if i <= mid {
                node *= 2;
                hi = mid;
            } else {
                node = node * 2 + 1;
                lo = mid + 1;
            }
        }
    }
}

/// Buffers one search reuses across its solves.
#[derive(Default)]
struct Scratch {
    low: LiChao,
    high: LiChao,
    best: Vec<(f64, u32, Method)>,
    /// The recursion's table of the latest solve, per stage and placement.
    cells: Vec<Vec<Cell>>,
}

impl<'a> Chain<'a> {
    /// `pb` must be a chain ([`is_chain`]); stages are in chain order.
    pub fn new(pb: &'a PlanProblem) -> Chain<'a> {
        let (opts, opt_of) = options(pb);
        let n = pb.stages().len();
        let comp: Vec<Vec<f64>> = (0..n)
            .map(|s| {
                opts[s]
                    .iter()
                    .map(|o| {
                        pb.busy_s(
                            s,
                            Placement {
                                vm: o.vm,
                                vms: o.vms,
                                concurrent: o.best_c,
                            },
                        )
                    })
                    .collect()
            })
            .collect();
        let lp = pb.local_price();
        let rp = pb.remote_price();
        let put = pb.catalog().remote_storage.put_usd_per_1k / 1e3;
        let get = pb.catalog().remote_storage.get_usd_per_1k / 1e3;
        let mut links = Vec::with_capacity(n.saturating_sub(1));
        for i in 0..n.saturating_sub(1) {
            let e = pb.outgoing(i)[0];
            let edge = pb.edges()[e];
            let t = edge.bytes;
            let (src, dst) = (&opts[i], &opts[i + 1]);
            let broadcast = edge.kind == EdgeKind::Broadcast;
            let mut x = Vec::with_capacity(src.len());
            let mut up = Vec::with_capacity(src.len());
            let mut a = Vec::with_capacity(src.len());
            let mut vm_to = Vec::with_capacity(src.len());
            let mut puts = 0.0;
            for o in src {
                // Sender-side quantities do not depend on the receiver's placement (for a
                // broadcast the direct volume is per receiving VM: x * n_r).
                let f = pb.flow(e, o.per_vm, 1, 1);
                let bw = pb.catalog().vm_types[o.vm].bandwidth_bps();
                x.push(f.sent_per_vm / bw);
                up.push(pb.upload_s(e, &f, o.vm));
                a.push(t * lp + o.rate);
                puts = f.puts * put;
                let ok = (edge.kind == EdgeKind::One || o.vms == 1)
                    && o.vms <= pb.stages()[i + 1].instances;
                vm_to.push(if ok {
                    opt_of[i + 1].get(o.vm, o.vms)
                } else {
                    None
                });
            }
            let memory = pb.memory_fits(e).then(|| MemoryLink {
                up: src
                    .iter()
                    .map(|o| pb.memory_upload_s(e, &pb.flow(e, o.per_vm, 1, 1), o.vm))
                    .collect(),
                down: dst
                    .iter()
                    .map(|o| pb.memory_download_s(&pb.flow(e, 1, o.vms, o.per_vm), o.vm))
                    .collect(),
                per_s: t * pb.memory_price(),
            });
            let mut z = Vec::with_capacity(dst.len());
            let mut down = Vec::with_capacity(dst.len());
            let mut b = Vec::with_capacity(dst.len());
            let mut gets = Vec::with_capacity(dst.len());
            let mut nr = Vec::with_capacity(dst.len());
            for o in dst {
                let f = pb.flow(e, 1, o.vms, o.per_vm);
                let bw = pb.catalog().vm_types[o.vm].bandwidth_bps();
                z.push(f.recv_per_vm / bw);
                down.push(pb.download_s(&f, o.vm));
                b.push(f.fetched * lp + o.rate);
                gets.push(f.gets * get);
                nr.push(f64::from(o.vms));
            }
            // Orders for the sweeps (not needed where direct is scored pairwise).
            let sweeps = !broadcast && src.len() > PAIRWISE && dst.len() > PAIRWISE;
            let (by_x, by_z, by_b) = if sweeps {
                (sorted(&x), sorted(&z), sorted(&b))
            } else {
                (Vec::new(), Vec::new(), Vec::new())
            };
            let mut rank_b = vec![0u32; by_b.len()];
            for (k, &r) in by_b.iter().enumerate() {
                rank_b[r as usize] = k as u32;
            }
            links.push(Link {
                by_x,
                by_z,
                by_b,
                rank_b,
                edge: e,
                broadcast,
                x,
                up,
                a,
                z,
                down,
                b,
                remote_per_s: t * rp,
                gets,
                puts,
                memory,
                nr,
                vm_to,
                vm_store: t * lp,
            });
        }
        Chain {
            pb,
            direct: DirectMode::Auto,
            opts,
            comp,
            links,
        }
    }

    /// (dt, dc) of edge `i -> i+1` from sender placement `s` to receiver placement `r`.
    fn delta(&self, i: usize, s: usize, r: usize, m: Method) -> (f64, f64) {
        let l = &self.links[i];
        let comp = self.comp[i + 1][r];
        match m {
            Method::VmStorage => (comp, comp * l.vm_store + comp * self.opts[i + 1][r].rate),
            Method::Direct => {
                let send = if l.broadcast {
                    l.x[s] * l.nr[r]
                } else {
                    l.x[s]
                };
                let fetch = send.max(l.z[r]);
                (fetch + comp, fetch * l.a[s] + (fetch + comp) * l.b[r])
            }
            Method::Remote => {
                let (up, down) = (l.up[s], l.down[r]);
                (
                    up + down + comp,
                    up * l.a[s]
                        + l.puts
                        + down * l.remote_per_s
                        + (down + comp) * l.b[r]
                        + l.gets[r],
                )
            }
            Method::Memory => match &l.memory {
                Some(m) => {
                    let (up, down) = (m.up[s], m.down[r]);
                    (
                        up + down + comp,
                        up * l.a[s] + down * m.per_s + (down + comp) * l.b[r],
                    )
                }
                None => (f64::INFINITY, f64::INFINITY),
            },
        }
    }

    /// The plan minimizing `wl * latency + wc * cost` with no vm-storage on `banned` edges.
    /// Its table is left in `sc.cells`. `None` also when `meter` stops it (each stage's
    /// placements count as candidates).
    fn solve(
        &self,
        wl: f64,
        wc: f64,
        banned: &[bool],
        sc: &mut Scratch,
        meter: &Meter<'_>,
    ) -> Option<Assignment> {
        meter.expand(self.opts[0].len() as u64).ok()?;
        let n = self.opts.len();
        let mut cells = std::mem::take(&mut sc.cells);
        cells.resize_with(n, Vec::new);
        cells[0].clear();
        cells[0].extend(self.opts[0].iter().enumerate().map(|(o, opt)| {
            let e = self.comp[0][o];
            let c = opt.rate * e;
            Cell {
                v: wl * e + wc * c,
                e,
                c,
                prev: u32::MAX,
                method: Method::Direct,
            }
        }));
        for i in 0..n - 1 {
            let (done, rest) = cells.split_at_mut(i + 1);
            let prev = &done[i];
            let l = &self.links[i];
            let comp = &self.comp[i + 1];
            let nt = comp.len();
            if meter.expand((self.opts[i].len() + nt) as u64).is_err() {
                sc.cells = cells;
                return None;
            }
            // Best (value, sender, method) per receiver placement.
            let best = &mut sc.best;
            best.clear();
            best.resize(nt, (f64::INFINITY, u32::MAX, Method::Direct));
            // vm-storage
            if !banned[l.edge] {
                for (s, to) in l.vm_to.iter().enumerate() {
                    if let (Some(r), true) = (to, prev[s].v.is_finite()) {
                        let r = *r as usize;
                        let (dt, dc) = self.delta(i, s, r, Method::VmStorage);
                        let v = prev[s].v + wl * dt + wc * dc;
                        if v < best[r].0 {
                            best[r] = (v, s as u32, Method::VmStorage);
                        }
                    }
                }
            }
            // remote: the best sender side, once.
            let mut rs: Option<(f64, usize)> = None;
            for (s, cell) in prev.iter().enumerate() {
                if !cell.v.is_finite() {
                    continue;
                }
                let v = cell.v + wl * l.up[s] + wc * (l.up[s] * l.a[s] + l.puts);
                if rs.is_none_or(|(b, _)| v < b) {
                    rs = Some((v, s));
                }
            }
            if let Some((vs, s)) = rs {
                for (r, slot) in best.iter_mut().enumerate() {
                    let (down, b) = (l.down[r], l.b[r]);
                    let v = vs
                        + wl * (down + comp[r])
                        + wc * (down * l.remote_per_s + (down + comp[r]) * b + l.gets[r]);
                    if v < slot.0 {
                        *slot = (v, s as u32, Method::Remote);
                    }
                }
            }
            // memory: separable as remote.
            if let Some(m) = &l.memory {
                let mut ms: Option<(f64, usize)> = None;
                for (s, cell) in prev.iter().enumerate() {
                    if !cell.v.is_finite() {
                        continue;
                    }
                    let v = cell.v + wl * m.up[s] + wc * (m.up[s] * l.a[s]);
                    if ms.is_none_or(|(b, _)| v < b) {
                        ms = Some((v, s));
                    }
                }
                if let Some((vs, s)) = ms {
                    for (r, slot) in best.iter_mut().enumerate() {
                        let (down, b) = (m.down[r], l.b[r]);
                        let v = vs
                            + wl * (down + comp[r])
                            + wc * (down * m.per_s + (down + comp[r]) * b);
                        if v < slot.0 {
                            *slot = (v, s as u32, Method::Memory);
                        }
                    }
                }
            }
            // direct
            let live = prev.iter().filter(|c| c.v.is_finite()).count();
            let pairwise = match self.direct {
                DirectMode::Auto => l.by_x.is_empty() || live <= PAIRWISE,
                DirectMode::Pairwise => true,
                DirectMode::LiChao => l.by_x.is_empty(),
            };
            if pairwise {
                for (r, slot) in best.iter_mut().enumerate() {
                    for (s, cell) in prev.iter().enumerate() {
                        if !cell.v.is_finite() {
                            continue;
                        }
                        let (dt, dc) = self.delta(i, s, r, Method::Direct);
                        let v = cell.v + wl * dt + wc * dc;
                        if v < slot.0 {
                            *slot = (v, s as u32, Method::Direct);
                        }
                    }
                }
            } else {
                // value = V_s + max(x_s, z_r) * (alpha_s + beta_r) + comp_r * beta_r, with
                // alpha = wc * a and beta = wc * b + wl.
                // Sweep 1: senders with x <= z, as lines in z.
                sc.low.reset(l.by_z.iter().map(|&r| l.z[r as usize]));
                let mut k = 0;
                for (qi, &r) in l.by_z.iter().enumerate() {
                    let r = r as usize;
                    while k < l.by_x.len() && l.x[l.by_x[k] as usize] <= l.z[r] {
                        let s = l.by_x[k] as usize;
                        if prev[s].v.is_finite() {
                            sc.low.insert(prev[s].v, wc * l.a[s], s as u32);
                        }
                        k += 1;
                    }
                    if let Some((v, s)) = sc.low.query(qi) {
                        let beta = wc * l.b[r] + wl;
                        let v = v + l.z[r] * beta + comp[r] * beta;
                        if v < best[r].0 {
                            best[r] = (v, s, Method::Direct);
                        }
                    }
                }
                // Sweep 2: senders with x > z, as lines in beta.
                sc.high
                    .reset(l.by_b.iter().map(|&r| wc * l.b[r as usize] + wl));
                let mut k = l.by_x.len();
                for &r in l.by_z.iter().rev() {
                    let r = r as usize;
                    while k > 0 && l.x[l.by_x[k - 1] as usize] > l.z[r] {
                        let s = l.by_x[k - 1] as usize;
                        if prev[s].v.is_finite() {
                            sc.high
                                .insert(prev[s].v + l.x[s] * wc * l.a[s], l.x[s], s as u32);
                        }
                        k -= 1;
                    }
                    if let Some((v, s)) = sc.high.query(l.rank_b[r] as usize) {
                        let v = v + comp[r] * (wc * l.b[r] + wl);
                        if v < best[r].0 {
                            best[r] = (v, s, Method::Direct);
                        }
                    }
                }
            }
            let next = &mut rest[0];
            next.clear();
            next.extend(best.iter().enumerate().map(|(r, &(v, s, m))| {
                if !v.is_finite() {
                    return NONE;
                }
                let (dt, dc) = self.delta(i, s as usize, r, m);
                let from = &prev[s as usize];
                Cell {
                    v,
                    e: from.e + dt,
                    c: from.c + dc,
                    prev: s,
                    method: m,
                }
            }));
        }
        // The last stage's best placement, then back.
        let last = &cells[n - 1];
        let found = (0..last.len())
            .filter(|&o| last[o].v.is_finite())
            .min_by(|&p, &q| last[p].v.total_cmp(&last[q].v));
        let Some(mut o) = found else {
            sc.cells = cells;
            return None;
        };
        let mut placements = vec![
            Placement {
                vm: 0,
                vms: 1,
                concurrent: 1
            };
            n
        ];
        let mut methods = vec![Method::Direct; self.pb.edges().len()];
        for i in (0..n).rev() {
            let opt = self.opts[i][o];
            placements[i] = Placement {
                vm: opt.vm,
                vms: opt.vms,
                concurrent: opt.best_c,
            };
            if i > 0 {
                methods[self.links[i - 1].edge] = cells[i][o].method;
                o = cells[i][o].prev as usize;
            }
        }
        sc.cells = cells;
        Some(Assignment {
            placements,
            methods,
        })
    }

    fn point(
        &self,
        wl: f64,
        wc: f64,
        banned: &[bool],
        sc: &mut Scratch,
        meter: &Meter<'_>,
    ) -> Option<Point> {
        let a = self.solve(wl, wc, banned, sc, meter)?;
        let p = self.pb.evaluate(&a).ok()?;
        Some(Point {
            l: p.latency_s,
            c: p.cost_usd,
            a,
        })
    }

    /// The least latency and the least cost any plan reaches (each on its own); `None` also
    /// when `meter` stops it.
    pub fn extremes(&self, banned: &[bool], meter: &Meter<'_>) -> Option<(f64, f64)> {
        let sc = &mut Scratch::default();
        Some((
            self.point(1.0, 0.0, banned, sc, meter)?.l,
            self.point(0.0, 1.0, banned, sc, meter)?.c,
        ))
    }

    /// The exact minimum of latency * cost over the chain's plans (no bounds), or `None` when
    /// the safety net trips (the caller falls back to the label search).
    ///
    /// Outer approximation: every solve for weights `w` returns a plan `q` minimizing `w . p`,
    /// so every plan lies in the half-plane `w . p >= w . q`; the intersection of these
    /// half-planes is a convex region containing all plans, and latency * cost, quasi-concave
    /// and increasing, is least over it at one of its vertices `v`. While that least value is
    /// below the best plan's, solve with the gradient at `v`, `(cost_v, latency_v)`: either the
    /// new plan is below the tangent of the level curve through `v` — then its product is below
    /// `v`'s and so below the best — or its half-plane cuts `v` off.
    ///
    /// `warm`: a run on a superset of these plans (fewer banned edges): its cuts hold here too,
    /// and its plans that respect `banned` are candidates.
    ///
    /// When `meter` stops it, the best plan found until then (`None` if none was): the caller
    /// sees `meter.stopped()`.
    pub fn run(
        &self,
        banned: &[bool],
        warm: Option<&ChainResult>,
        meter: &Meter<'_>,
    ) -> Option<ChainResult> {
        let sc = &mut Scratch::default();
        let product = |p: &Point| p.l * p.c;
        // Start from lower bounds no plan beats: every stage computes at least its cold time
        // and pays at least its cheapest compute.
        let n = self.opts.len();
        let floor_l: f64 = (0..n)
            .map(|s| self.comp[s].iter().copied().fold(f64::INFINITY, f64::min))
            .sum();
        let floor_c: f64 = (0..n)
            .map(|s| {
                self.opts[s]
                    .iter()
                    .zip(&self.comp[s])
                    .map(|(o, c)| o.rate * c)
                    .fold(f64::INFINITY, f64::min)
            })
            .sum();
        let mut cuts: Vec<((f64, f64), f64)> = vec![((1.0, 0.0), floor_l), ((0.0, 1.0), floor_c)];
        let mut points: Vec<Point> = Vec::new();
        let mut best: Option<usize> = None;
        let mut best_cells: Vec<Vec<Cell>> = Vec::new();
        if let Some(w) = warm {
            cuts.extend(w.cuts.iter().copied());
            for (l, c, a) in &w.points {
                let allowed = a
                    .methods
                    .iter()
                    .zip(banned)
                    .all(|(m, &b)| !(b && *m == Method::VmStorage));
                if allowed {
                    points.push(Point {
                        l: *l,
                        c: *c,
                        a: a.clone(),
                    });
                    if best.is_none_or(|b| product(&points[b]) > l * c) {
                        best = Some(points.len() - 1);
                    }
                }
            }
        }
        let mut solves = 0;
        loop {
            let best_product = best.map_or(f64::INFINITY, |b| product(&points[b]));
            let Some((vl, vc)) = lowest_vertex(&cuts) else {
                break;
            };
            if vl * vc >= best_product * (1.0 - 1e-12) {
                break;
            }
            if solves >= MAX_SOLVES {
                return None;
            }
            solves += 1;
            // The gradient of latency * cost at v; at a zero coordinate, the other axis.
            let w = if vl > 0.0 && vc > 0.0 {
                (vc, vl)
            } else if vl > 0.0 {
                (0.0, 1.0)
            } else {
                (1.0, 0.0)
            };
            let Some(q) = self.point(w.0, w.1, banned, sc, meter) else {
                if meter.stopped().is_some() {
                    break;
                }
                return None;
            };
            let (vq, vv) = (w.0 * q.l + w.1 * q.c, w.0 * vl + w.1 * vc);
            let improved = product(&q) < best_product;
            let cut = vq > vv * (1.0 + 1e-12);
            cuts.push((w, vq));
            points.push(q);
            if improved {
                best = Some(points.len() - 1);
                // Keep the recursion that found it, for the explanation.
                std::mem::swap(&mut best_cells, &mut sc.cells);
            }
            if !improved && !cut {
                // Only rounding separates the bound from the best plan.
                break;
            }
        }
        let best = best?;
        let stats = self.stats(&best_cells);
        Some(ChainResult {
            best: points[best].a.clone(),
            points: points.iter().map(|p| (p.l, p.c, p.a.clone())).collect(),
            stats,
            cuts,
        })
    }

    /// Per stage and VM type, the best cell of the recursion that found the best plan.
    fn stats(&self, cells: &[Vec<Cell>]) -> Stats {
        let n = self.opts.len();
        let types = self.pb.catalog().vm_types.len();
        let mut seen = vec![vec![None::<Seen>; types]; n];
        let mut evaluated = vec![0u64; n];
        for i in 0..n {
            let mut best_v = vec![f64::INFINITY; types];
            // A plan carried over from a warm start has no recursion to show.
            for (o, cell) in cells.get(i).map_or(&[][..], |c| &c[..]).iter().enumerate() {
                evaluated[i] += if i == 0 { 1 } else { 3 };
                if !cell.v.is_finite() {
                    continue;
                }
                let opt = self.opts[i][o];
                let slot = &mut seen[i][opt.vm];
                let labels = slot.map_or(0, |s| s.labels) + 1;
                if cell.v < best_v[opt.vm] {
                    best_v[opt.vm] = cell.v;
                    let methods = if i == 0 {
                        0
                    } else {
                        crate::planner::dp::encode(cell.method)
                    };
                    *slot = Some(Seen {
                        end: cell.e,
                        cost: cell.c,
                        pl: Placement {
                            vm: opt.vm,
                            vms: opt.vms,
                            concurrent: opt.best_c,
                        },
                        methods,
                        labels,
                    });
                } else if let Some(s) = slot {
                    s.labels = labels;
                }
            }
        }
        Stats { seen, evaluated }
    }
}

/// The vertex of `{p : w . p >= v for every cut (w, v)}` with the least latency * cost: every
/// pairwise intersection of the cut lines that satisfies all cuts (up to rounding, which only
/// lowers the bound).
fn lowest_vertex(cuts: &[((f64, f64), f64)]) -> Option<(f64, f64)> {
    let mut best: Option<(f64, f64)> = None;
    for (i, &(wi, vi)) in cuts.iter().enumerate() {
        for &(wj, vj) in &cuts[i + 1..] {
            let det = wi.0 * wj.1 - wi.1 * wj.0;
            if det == 0.0 {
                continue;
            }
            let l = (vi * wj.1 - wi.1 * vj) / det;
            let c = (wi.0 * vj - vi * wj.0) / det;
            if !(l.is_finite() && c.is_finite()) {
                continue;
            }
            let inside = cuts
                .iter()
                .all(|&(w, v)| w.0 * l + w.1 * c >= v - 1e-9 * v.abs());
            if inside && best.is_none_or(|(bl, bc)| l * c < bl * bc) {
                best = Some((l, c));
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, LocalStorage, MemoryTier, RemoteStorage, VmType};
    use crate::dag::{Bounds, EdgeKind};
    use crate::model::{EdgeSpec, PlanProblem, Stage};

    /// A deterministic pseudo-random chain with large fanouts, so that the sweeps run.
    fn chain(seed: u64, n: usize, k: u32) -> PlanProblem {
        let mut st = seed;
        let mut u = || {
            st = st.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = st;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        };
        let vm_types = (0..3)
            .map(|i| VmType {
                name: format!("t{i}"),
                vcpus: [1, 2, 4][i],
                memory_mb: [4096, 8192, 16384][i],
                network_mbps: 100.0 + 2000.0 * u(),
                usd_per_hour: 0.05 + 0.5 * u(),
            })
            .collect();
        let catalog = Catalog {
            reserve_mb: 256,
            vm_types,
            local_storage: LocalStorage {
                usd_per_gb_month: 10.0 * u(),
            },
            remote_storage: RemoteStorage {
                aggregate_mbps: Some(20_000.0),
                ..RemoteStorage::default()
            },
            // Half the chains have a memory tier, at times too small for some edges.
            memory_tier: (u() < 0.5).then(|| MemoryTier {
                usd_per_hour: 0.01 + 2.0 * u(),
                capacity_mb: if u() < 0.5 { 64 } else { 16_384 },
                network_mbps: 300.0 + 5000.0 * u(),
                request_latency_ms: 2.0 * u(),
                requests_per_s: 100_000.0,
            }),
        };
        let kinds = [EdgeKind::One, EdgeKind::Shuffle];
        let stages = (0..n)
            .map(|i| Stage {
                parallel: if i % 2 == 1 { u() } else { 0.0 },
                name: format!("s{i}"),
                memory_mb: 300.0 + 2500.0 * u(),
                cold_s: 1.0 + 10.0 * u(),
                hot_s: 0.5 + 8.0 * u(),
                instances: k,
                overhead_s: 0.5 * u(),
                overhead_hot_s: None,
                start_s: 0.0,
            })
            .collect();
        let edges = (0..n - 1)
            .map(|i| EdgeSpec {
                from: format!("s{i}"),
                to: format!("s{}", i + 1),
                kind: kinds[(u() * 2.0) as usize % 2],
                bytes: 1e9 * u(),
            })
            .collect();
        PlanProblem::new(stages, edges, catalog, Bounds::default()).unwrap()
    }

    #[test]
    fn sweeps_agree_with_pairwise_scoring() {
        for seed in 0..12 {
            let pb = chain(seed, 4, 60 + seed as u32 * 7);
            let banned = vec![false; pb.edges().len()];
            let mut auto = Chain::new(&pb);
            assert!(
                auto.links.iter().all(|l| !l.by_x.is_empty()),
                "the sweeps run"
            );
            let mut sc = Scratch::default();
            for (wl, wc) in [(1.0, 0.0), (0.0, 1.0), (1.0, 30.0), (0.01, 1.0), (1.0, 1e4)] {
                let mut values = Vec::new();
                for mode in [DirectMode::Auto, DirectMode::LiChao, DirectMode::Pairwise] {
                    auto.direct = mode;
                    auto.solve(wl, wc, &banned, &mut sc, &Meter::unlimited())
                        .unwrap();
                    let v: Vec<f64> = sc.cells.last().unwrap().iter().map(|c| c.v).collect();
                    values.push(v);
                }
                for (a, b) in values[0]
                    .iter()
                    .zip(&values[2])
                    .chain(values[1].iter().zip(&values[2]))
                {
                    assert!(
                        (a - b).abs() <= 1e-9 * b.abs().max(1e-12),
                        "seed {seed} w ({wl}, {wc}): {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn hull_search_equals_label_search() {
        // Both exact, by different arguments: the hull search (scalar recursions) and the label
        // search (Pareto labels) must agree on chains with enough placements for the sweeps.
        for seed in 0..6 {
            let pb = chain(100 + seed, 3, 30 + seed as u32 * 5);
            let banned = vec![false; pb.edges().len()];
            let meter = Meter::unlimited();
            let fast = Chain::new(&pb).run(&banned, None, &meter).unwrap();
            let slow = crate::planner::dp::Search::new(&pb)
                .unwrap()
                .solve(&banned, false, &[], &meter)
                .best
                .unwrap();
            let (a, b) = (
                pb.evaluate(&fast.best).unwrap(),
                pb.evaluate(&slow).unwrap(),
            );
            let (pa, pb_) = (a.latency_s * a.cost_usd, b.latency_s * b.cost_usd);
            assert!(
                (pa - pb_).abs() <= 1e-9 * pb_,
                "seed {seed}: hull {pa} vs labels {pb_}"
            );
        }
    }
}
