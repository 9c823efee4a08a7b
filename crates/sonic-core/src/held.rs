//! Which of a plan's VMs are held at the same time: the one rule by which the model prices a plan
//! under a pool's VM limits and the resource manager grants it agents (docs/model.md, "VM limits").
//!
//! A plan runs each stage on a *group* of VMs: a stage and the stages that continue on its VMs
//! over `vm-storage`, one after another. A group holds its VMs from its first stage's start until
//! its last stage ends, and past that until every stage it sends to over `direct` has fetched.
//! Two groups are held at once unless one is over, by the DAG's order alone, before the other
//! starts. Groups held at once never share a VM: a pool with fewer VMs of a type than such a set
//! of groups needs cannot run the plan as priced.
//!
//! A `remote` sender is not held past its last stage: the executor's run reports after its
//! uploads, and its receivers start after the stage has ended. The model lets a receiver start
//! once its own edge's upload has ended, so where one sender's uploads to two receivers take
//! different times, the model's timeline can hold the sender while the quicker receiver starts;
//! the rule follows the executor there (the receiver starts later than the model says, on the
//! agents the rule gave it).

/// Which stages run before which: `i` before `j` when a path of edges leads from `i` to `j`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reach {
    reach: Vec<Vec<bool>>,
}

impl Reach {
    /// The order of `n` stages (in topological order: every edge goes from a lower index to a
    /// higher one) joined by `edges` (`(from, to)`; pairs out of range are ignored).
    pub fn new(n: usize, edges: impl IntoIterator<Item = (usize, usize)>) -> Reach {
        let mut out: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (from, to) in edges {
            if from < n && to < n && from != to {
                out[from].push(to);
            }
        }
        let mut reach = vec![vec![false; n]; n];
        // A receiver's row is complete before its senders read it, walking from the last stage.
        for i in (0..n).rev() {
            for &to in &out[i] {
                reach[i][to] = true;
                let below = reach[to].clone();
                for (j, r) in below.into_iter().enumerate() {
                    reach[i][j] |= r;
                }
            }
        }
        Reach { reach }
    }

    /// Whether a path of edges leads from `i` to `j` (never from a stage to itself).
    pub fn before(&self, i: usize, j: usize) -> bool {
        self.reach
            .get(i)
            .and_then(|row| row.get(j))
            .copied()
            .unwrap_or(false)
    }

    /// Whether stages `i` and `j` (not the same) can run at the same time: neither comes before
    /// the other.
    pub fn together(&self, i: usize, j: usize) -> bool {
        i != j && !self.before(i, j) && !self.before(j, i)
    }
}

/// A plan's VM groups and which of them are held at the same time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    /// Per stage, its group (`0..count`).
    group_of: Vec<usize>,
    /// `[g][h]`: groups `g` and `h` (not the same) are held at once.
    at_once: Vec<Vec<bool>>,
}

/// The heaviest set of groups held at once, from [`Groups::most`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heaviest {
    /// The VMs they hold together.
    pub vms: u32,
    /// The groups, in increasing order.
    pub groups: Vec<usize>,
    /// Whether the search was exact (else `vms` is an upper bound and `groups` a set that
    /// reaches the exact part of it).
    pub exact: bool,
}

/// How many branch-and-bound steps [`Groups::most`] takes before it answers with an upper bound.
const MOST_STEPS: usize = 200_000;

impl Groups {
    /// The groups of stages ordered by `reach`: `group_of[i]` is stage `i`'s group (any ids;
    /// stages with the same id run on the same VMs, one after another); `direct` lists the
    /// `(from, to)` stage pairs of the plan's `direct` edges.
    pub fn new(
        reach: &Reach,
        group_of: &[usize],
        direct: impl IntoIterator<Item = (usize, usize)>,
    ) -> Groups {
        // Dense ids in order of first appearance.
        let mut ids: Vec<usize> = Vec::new();
        let dense: Vec<usize> = group_of
            .iter()
            .map(|g| match ids.iter().position(|x| x == g) {
                Some(k) => k,
                None => {
                    ids.push(*g);
                    ids.len() - 1
                }
            })
            .collect();
        let count = ids.len();
        let n = group_of.len();
        let mut members: Vec<Vec<usize>> = vec![Vec::new(); count];
        for (i, &g) in dense.iter().enumerate() {
            members[g].push(i);
        }
        // What holds a group's VMs: its stages, and the stages they send to over `direct` (held
        // until those have fetched).
        let mut holds = members.clone();
        for (from, to) in direct {
            if from < n && to < n && !holds[dense[from]].contains(&to) {
                holds[dense[from]].push(to);
            }
        }
        // `g` is over before `h` starts when everything holding `g` comes before every stage of
        // `h`.
        let over_before = |g: usize, h: usize| {
            holds[g]
                .iter()
                .all(|&i| members[h].iter().all(|&j| reach.before(i, j)))
        };
        let at_once = (0..count)
            .map(|g| {
                (0..count)
                    .map(|h| g != h && !over_before(g, h) && !over_before(h, g))
                    .collect()
            })
            .collect();
        Groups {
            group_of: dense,
            at_once,
        }
    }

    /// The number of groups.
    pub fn count(&self) -> usize {
        self.at_once.len()
    }

    /// Stage `i`'s group.
    pub fn of(&self, i: usize) -> usize {
        self.group_of[i]
    }

    /// The stages of group `g`, in order.
    pub fn stages(&self, g: usize) -> impl Iterator<Item = usize> + '_ {
        self.group_of
            .iter()
            .enumerate()
            .filter(move |(_, x)| **x == g)
            .map(|(i, _)| i)
    }

    /// Whether groups `g` and `h` (not the same) hold VMs at the same time.
    pub fn at_once(&self, g: usize, h: usize) -> bool {
        self.at_once
            .get(g)
            .and_then(|row| row.get(h))
            .copied()
            .unwrap_or(false)
    }

    /// The heaviest set of groups all held at once, group `g` weighing `vms[g]` (0: not
    /// counted, e.g. a group of another VM type): the most VMs the plan holds at the same time.
    /// Exact by branch and bound (heaviest groups first); past a bound on its steps, an upper
    /// bound (each group with every group held beside it) and `exact: false`.
    pub fn most(&self, vms: &[u32]) -> Heaviest {
        let mut order: Vec<usize> = (0..self.count())
            .filter(|&g| vms.get(g).copied().unwrap_or(0) > 0)
            .collect();
        order.sort_by_key(|&g| (std::cmp::Reverse(vms[g]), g));
        struct Search<'a> {
            groups: &'a Groups,
            vms: &'a [u32],
            order: &'a [usize],
            best: Heaviest,
            steps: usize,
        }
        impl Search<'_> {
            fn visit(&mut self, from: usize, sum: u32, chosen: &mut Vec<usize>) -> bool {
                self.steps += 1;
                if self.steps > MOST_STEPS {
                    return false;
                }
                if sum > self.best.vms || self.best.groups.is_empty() && !chosen.is_empty() {
                    self.best.vms = sum;
                    self.best.groups = chosen.clone();
                }
                // What the remaining candidates could add at most.
                let rest: u32 = self.order[from..]
                    .iter()
                    .filter(|&&h| chosen.iter().all(|&g| self.groups.at_once(g, h)))
                    .map(|&h| self.vms[h])
                    .sum();
                if sum + rest <= self.best.vms {
                    return true;
                }
                for k in from..self.order.len() {
                    let h = self.order[k];
                    if chosen.iter().all(|&g| self.groups.at_once(g, h)) {
                        chosen.push(h);
                        let done = self.visit(k + 1, sum + self.vms[h], chosen);
                        chosen.pop();
                        if !done {
                            return false;
                        }
                    }
                }
                true
            }
        }
        let mut search = Search {
            groups: self,
            vms,
            order: &order,
            best: Heaviest {
                exact: true,
                ..Heaviest::default()
            },
            steps: 0,
        };
        let mut chosen = Vec::new();
        if search.visit(0, 0, &mut chosen) {
            let mut best = search.best;
            best.groups.sort_unstable();
            return best;
        }
        // Too many sets to search: each group with everything held beside it.
        let mut bound = Heaviest::default();
        for &g in &order {
            let beside: Vec<usize> = order
                .iter()
                .copied()
                .filter(|&h| h == g || self.at_once(g, h))
                .collect();
            let sum = beside.iter().map(|&h| vms[h]).sum();
            if sum > bound.vms {
                bound = Heaviest {
                    vms: sum,
                    groups: beside,
                    exact: false,
                };
            }
        }
        bound.groups.sort_unstable();
        bound
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// a -> (b, c) -> d.
    fn diamond() -> Reach {
        Reach::new(4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    }

    #[test]
    fn branches_are_held_at_once_and_a_chain_is_not() {
        let r = diamond();
        assert!(r.before(0, 3) && !r.before(3, 0) && r.together(1, 2));
        // Every stage on VMs of its own, every edge remote: only the branches overlap.
        let g = Groups::new(&r, &[0, 1, 2, 3], []);
        assert!(g.at_once(1, 2));
        assert!(!g.at_once(0, 1) && !g.at_once(0, 3) && !g.at_once(1, 3));
        let most = g.most(&[1, 1, 1, 1]);
        assert_eq!(
            (most.vms, most.groups.clone(), most.exact),
            (2, vec![1, 2], true)
        );
        // Two VMs for b: three at once.
        assert_eq!(g.most(&[1, 2, 1, 1]).vms, 3);
        // b and c of another type than the one counted: one VM at a time.
        assert_eq!(g.most(&[1, 0, 0, 1]).vms, 1);
    }

    #[test]
    fn a_direct_sender_is_held_until_its_receivers_have_fetched() {
        let r = diamond();
        // a sends to b and c over direct: a is held while both run.
        let g = Groups::new(&r, &[0, 1, 2, 3], [(0, 1), (0, 2)]);
        assert!(g.at_once(0, 1) && g.at_once(0, 2) && !g.at_once(0, 3));
        assert_eq!(g.most(&[1, 1, 1, 1]).groups, vec![0, 1, 2]);
        // b and c send to d over direct: d fetches from both at once.
        let g = Groups::new(&r, &[0, 1, 2, 3], [(1, 3), (2, 3)]);
        assert!(g.at_once(1, 3) && g.at_once(2, 3));
        assert_eq!(g.most(&[1, 1, 1, 1]).vms, 3);
        // A chain a -> b -> c with a -> c direct: a is held while b runs.
        let chain = Reach::new(3, [(0, 1), (1, 2), (0, 2)]);
        let g = Groups::new(&chain, &[0, 1, 2], [(0, 2)]);
        assert!(g.at_once(0, 1) && g.at_once(0, 2) && !g.at_once(1, 2));
    }

    #[test]
    fn a_group_is_held_from_its_first_stage_to_its_last() {
        let r = diamond();
        // a, b and d on one group over vm-storage; c beside it.
        let g = Groups::new(&r, &[7, 7, 9, 7], []);
        assert_eq!(g.count(), 2);
        assert_eq!((g.of(0), g.of(2), g.of(3)), (0, 1, 0));
        assert_eq!(g.stages(0).collect::<Vec<_>>(), vec![0, 1, 3]);
        assert!(g.at_once(0, 1));
        // Everything on one group: one VM.
        let one = Groups::new(&r, &[0, 0, 0, 0], []);
        assert_eq!(one.most(&[1]).vms, 1);
        // a chain x -> y -> z where x and z share a group and y runs between them: held at once.
        let chain = Reach::new(3, [(0, 1), (1, 2)]);
        let g = Groups::new(&chain, &[0, 1, 0], []);
        assert!(g.at_once(0, 1));
    }

    /// The heaviest set of pairwise held-at-once groups, by trying every subset.
    fn brute(g: &Groups, vms: &[u32]) -> u32 {
        let n = g.count();
        let mut best = 0;
        for mask in 0u32..(1 << n) {
            let set: Vec<usize> = (0..n).filter(|&k| mask >> k & 1 == 1).collect();
            if set
                .iter()
                .all(|&a| set.iter().all(|&b| a == b || g.at_once(a, b)))
            {
                best = best.max(set.iter().map(|&k| vms[k]).sum());
            }
        }
        best
    }

    proptest! {
        #[test]
        fn the_heaviest_set_is_found_exactly(
            edges in prop::collection::vec((0usize..9, 0usize..9), 0..16),
            groups in prop::collection::vec(0usize..6, 9),
            direct in prop::collection::vec(any::<bool>(), 16),
            vms in prop::collection::vec(0u32..4, 9),
        ) {
            let edges: Vec<(usize, usize)> = edges
                .into_iter()
                .filter(|(a, b)| a < b)
                .collect();
            let reach = Reach::new(9, edges.iter().copied());
            let direct_edges = edges.iter().zip(&direct).filter(|(_, d)| **d).map(|(e, _)| *e);
            let g = Groups::new(&reach, &groups, direct_edges);
            let weights: Vec<u32> = (0..g.count()).map(|k| vms[k]).collect();
            let most = g.most(&weights);
            prop_assert!(most.exact);
            prop_assert_eq!(most.vms, brute(&g, &weights));
            prop_assert_eq!(most.groups.iter().map(|&k| weights[k]).sum::<u32>(), most.vms);
            // Held at once is symmetric, and a stage's group never overlaps itself.
            for a in 0..g.count() {
                prop_assert!(!g.at_once(a, a));
                for b in 0..g.count() {
                    prop_assert_eq!(g.at_once(a, b), g.at_once(b, a));
                }
            }
        }
    }
}
