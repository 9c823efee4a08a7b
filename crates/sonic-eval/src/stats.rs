//! The evaluation's statistics: Perf/$ of a cell of jobs, a bootstrap confidence interval on the
//! ratio of two cells' Perf/$, the verdict it allows, and the seeded shuffles that put the
//! policies of each round in a random order (docs/evaluation.md#statistics).
//!
//! Perf/$ has one definition: `1 / (mean latency x mean cost)` over a cell's jobs. The interval
//! on `Perf/$(a) / Perf/$(b)` is a percentile bootstrap: each cell's jobs are resampled with
//! replacement (independently: the two cells ran different jobs), the ratio recomputed, and the
//! 2.5th and 97.5th percentiles of [`RESAMPLES`] resamples taken. Everything is a pure function of
//! its inputs and a seed.

/// Bootstrap resamples per interval.
pub const RESAMPLES: usize = 2000;

/// The least jobs a cell needs for an interval (with one job every resample is that job).
pub const MIN_JOBS: usize = 2;

/// The rounds every policy comparison runs at least (each round runs every policy once, in a
/// random order).
pub const MIN_ROUNDS: usize = 5;

/// The seeded generator (the simulator's SplitMix64), so that a run's order and intervals follow
/// from its seed alone.
pub type Rng = sonic_sim::SplitMix64;

/// `items` in a random order (Fisher-Yates).
pub fn shuffled<T: Clone>(items: &[T], rng: &mut Rng) -> Vec<T> {
    let mut v = items.to_vec();
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
    v
}

/// One job's measures.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    pub latency_s: f64,
    pub cost_usd: f64,
}

/// `1 / (mean latency x mean cost)` over the jobs; 0 when there are none or a mean is not
/// positive.
pub fn perf_per_dollar(jobs: &[Job]) -> f64 {
    if jobs.is_empty() {
        return 0.0;
    }
    let n = jobs.len() as f64;
    let lat = jobs.iter().map(|j| j.latency_s).sum::<f64>() / n;
    let cost = jobs.iter().map(|j| j.cost_usd).sum::<f64>() / n;
    if lat > 0.0 && cost > 0.0 {
        1.0 / (lat * cost)
    } else {
        0.0
    }
}

/// A ratio with its 95% confidence interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
}

/// `Perf/$(a) / Perf/$(b)` with a 95% percentile-bootstrap interval (seeded); `None` when a cell
/// has fewer than [`MIN_JOBS`] jobs or a Perf/$ of 0.
pub fn ratio_interval(a: &[Job], b: &[Job], seed: u64) -> Option<Interval> {
    let (pa, pb) = (perf_per_dollar(a), perf_per_dollar(b));
    if a.len() < MIN_JOBS || b.len() < MIN_JOBS || pa <= 0.0 || pb <= 0.0 {
        return None;
    }
    let mut rng = Rng::new(seed);
    let resample = |jobs: &[Job], rng: &mut Rng| -> f64 {
        let n = jobs.len();
        let (mut lat, mut cost) = (0.0, 0.0);
        for _ in 0..n {
            let j = jobs[rng.below(n)];
            lat += j.latency_s;
            cost += j.cost_usd;
        }
        let (lat, cost) = (lat / n as f64, cost / n as f64);
        1.0 / (lat * cost)
    };
    let mut ratios: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            let ra = resample(a, &mut rng);
            let rb = resample(b, &mut rng);
            ra / rb
        })
        .filter(|r| r.is_finite())
        .collect();
    if ratios.is_empty() {
        return None;
    }
    ratios.sort_by(f64::total_cmp);
    let at =
        |q: f64| ratios[((q * (ratios.len() - 1) as f64).round() as usize).min(ratios.len() - 1)];
    Some(Interval {
        ratio: pa / pb,
        lo: at(0.025),
        hi: at(0.975),
    })
}

/// What a comparison may claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The whole interval is above 1.
    Win,
    /// The whole interval is below 1.
    Loss,
    /// The interval holds 1.
    NoDifference,
    /// No interval (too few jobs, or one simulated run).
    NoInterval,
}

impl Outcome {
    /// The verdict rule: a win or a loss only where the interval excludes 1.
    pub fn of(ci: Option<&Interval>) -> Outcome {
        match ci {
            Some(c) if c.lo > 1.0 => Outcome::Win,
            Some(c) if c.hi < 1.0 => Outcome::Loss,
            Some(_) => Outcome::NoDifference,
            None => Outcome::NoInterval,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Win => "win",
            Outcome::Loss => "loss",
            Outcome::NoDifference => "no difference measured",
            Outcome::NoInterval => "no interval",
        }
    }
}

/// Whether the goal `ratio >= goal` is met: `Some(true)` when the whole interval is at least the
/// goal, `Some(false)` when it is all below, `None` when the interval straddles it (or there is
/// none: then the point estimate decides, and the caller says there was no interval).
pub fn goal_met(ci: Option<&Interval>, goal: f64) -> Option<bool> {
    let c = ci?;
    if c.lo >= goal {
        Some(true)
    } else if c.hi < goal {
        Some(false)
    } else {
        None
    }
}

/// A seed for one comparison, from the run's seed and the comparison's name (FNV-1a), so that
/// each interval has its own resamples and adding a cell does not change the others'.
pub fn seed_for(run_seed: u64, name: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ run_seed;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jobs(pairs: &[(f64, f64)]) -> Vec<Job> {
        pairs
            .iter()
            .map(|&(latency_s, cost_usd)| Job {
                latency_s,
                cost_usd,
            })
            .collect()
    }

    #[test]
    fn perf_per_dollar_is_one_over_the_product_of_the_means() {
        // Means 2 s and $2: 1/4, not the mean of per-job Perf/$ (1/1 + 1/9) / 2.
        let j = jobs(&[(1.0, 1.0), (3.0, 3.0)]);
        assert!((perf_per_dollar(&j) - 0.25).abs() < 1e-12);
        assert_eq!(perf_per_dollar(&[]), 0.0);
        assert_eq!(perf_per_dollar(&jobs(&[(0.0, 1.0)])), 0.0);
    }

    #[test]
    fn identical_cells_have_a_tight_interval_around_one() {
        let a = jobs(&[(2.0, 1.0); 6]);
        let ci = ratio_interval(&a, &a, 1).expect("interval");
        assert_eq!((ci.ratio, ci.lo, ci.hi), (1.0, 1.0, 1.0));
        assert_eq!(Outcome::of(Some(&ci)), Outcome::NoDifference);
    }

    #[test]
    fn a_clear_difference_excludes_one_and_noise_does_not() {
        // a twice as fast at the same cost, little spread: a win, and b against a a loss.
        let a = jobs(&[(1.0, 1.0), (1.1, 1.0), (0.9, 1.0), (1.05, 1.0), (0.95, 1.0)]);
        let b = jobs(&[(2.0, 1.0), (2.2, 1.0), (1.8, 1.0), (2.1, 1.0), (1.9, 1.0)]);
        let ci = ratio_interval(&a, &b, 7).expect("interval");
        assert!((ci.ratio - 2.0).abs() < 1e-12);
        assert!(
            ci.lo > 1.5 && ci.hi < 2.5 && ci.lo <= ci.ratio && ci.ratio <= ci.hi,
            "{ci:?}"
        );
        assert_eq!(Outcome::of(Some(&ci)), Outcome::Win);
        let back = ratio_interval(&b, &a, 7).expect("interval");
        assert_eq!(Outcome::of(Some(&back)), Outcome::Loss);
        // 10% apart in the means, but each cell spreads by a factor of 3: no claim.
        let c = jobs(&[(1.0, 1.0), (3.0, 1.0), (1.0, 1.0), (3.0, 1.0), (2.0, 1.0)]);
        let d = jobs(&[(1.1, 1.0), (3.3, 1.0), (1.1, 1.0), (3.3, 1.0), (2.2, 1.0)]);
        let ci = ratio_interval(&c, &d, 7).expect("interval");
        assert!((ci.ratio - 1.1).abs() < 1e-9);
        assert!(ci.lo < 1.0 && ci.hi > 1.0, "{ci:?}");
        assert_eq!(Outcome::of(Some(&ci)), Outcome::NoDifference);
    }

    #[test]
    fn the_interval_is_a_function_of_the_seed() {
        let a = jobs(&[(1.0, 1.0), (1.5, 0.8), (0.7, 1.3), (1.2, 1.1)]);
        let b = jobs(&[(1.3, 1.0), (1.1, 0.9), (1.6, 1.2)]);
        assert_eq!(ratio_interval(&a, &b, 3), ratio_interval(&a, &b, 3));
        assert_ne!(ratio_interval(&a, &b, 3), ratio_interval(&a, &b, 4));
    }

    #[test]
    fn too_few_jobs_give_no_interval_and_no_claim() {
        let one = jobs(&[(1.0, 1.0)]);
        let two = jobs(&[(9.0, 9.0), (9.0, 9.0)]);
        assert_eq!(ratio_interval(&one, &two, 1), None);
        assert_eq!(Outcome::of(None), Outcome::NoInterval);
        assert_eq!(goal_met(None, 0.95), None);
    }

    #[test]
    fn the_goal_is_met_only_by_the_whole_interval() {
        let ci = |lo, hi| Interval {
            ratio: (lo + hi) / 2.0,
            lo,
            hi,
        };
        assert_eq!(goal_met(Some(&ci(0.96, 1.2)), 0.95), Some(true));
        assert_eq!(goal_met(Some(&ci(0.5, 0.9)), 0.95), Some(false));
        assert_eq!(goal_met(Some(&ci(0.9, 1.1)), 0.95), None);
    }

    #[test]
    fn shuffles_are_permutations_that_follow_the_seed() {
        let items = ["remote", "local", "direct", "sonic", "oracle"];
        let mut rng = Rng::new(42);
        let rounds: Vec<Vec<&str>> = (0..20).map(|_| shuffled(&items, &mut rng)).collect();
        for r in &rounds {
            let mut sorted = r.clone();
            sorted.sort_unstable();
            let mut want = items.to_vec();
            want.sort_unstable();
            assert_eq!(sorted, want);
        }
        // Not one fixed order, and each policy is sometimes first.
        assert!(rounds.iter().any(|r| r != &rounds[0]));
        for p in items {
            assert!(rounds.iter().any(|r| r[0] == p), "{p} never first");
        }
        let mut again = Rng::new(42);
        assert_eq!(shuffled(&items, &mut again), rounds[0]);
    }
}
