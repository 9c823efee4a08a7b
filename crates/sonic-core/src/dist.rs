//! Latency distributions (ORION, seed thesis ch. 6.4.1): a function's time is a distribution,
//! not a number, and a DAG's end-to-end latency is built from its functions' by two operations:
//! stages in series add (the distribution of a sum, a convolution), instances and branches in
//! parallel end with the slowest (the distribution of a maximum). Each comes in two forms: for
//! independent parts, and for parts that move together (comonotonic: a slow input makes every
//! part slow), which ORION applies where the parts' correlation is high.
//!
//! A [`Dist`] is a quantile sketch: [`ATOMS`] values of equal probability, sorted, each the mean
//! of its slice of the distribution. The mean is exact under every operation (a sum's atoms
//! are every pair of atoms, re-cut into slices by their means); quantiles are interpolated
//! between atoms. No I/O, no randomness: the same inputs give the same distribution.

use std::cmp::Ordering;

/// How many equally likely values a distribution keeps.
pub const ATOMS: usize = 256;

/// A non-negative time distribution, in seconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Dist {
    /// Sorted, non-negative, [`ATOMS`] of them, each of probability `1 / ATOMS`.
    atoms: Vec<f64>,
}

/// A distribution that cannot be built from what was given.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DistError {
    #[error("a distribution needs at least one sample")]
    NoSamples,
    #[error("a distribution's values must be finite and not negative, got {0}")]
    Value(f64),
    #[error("a quantile's probability must be in (0, 1), got {0}")]
    Probability(f64),
    #[error("quantiles must not decrease as their probability grows ({0})")]
    Decreasing(String),
}

fn checked(v: f64) -> Result<f64, DistError> {
    if v.is_finite() && v >= 0.0 {
        Ok(v)
    } else {
        Err(DistError::Value(v))
    }
}

fn by_value(a: &f64, b: &f64) -> Ordering {
    a.total_cmp(b)
}

impl Dist {
    /// Always `value`.
    pub fn point(value: f64) -> Result<Dist, DistError> {
        let v = checked(value)?;
        Ok(Dist {
            atoms: vec![v; ATOMS],
        })
    }

    /// Always 0.
    pub fn zero() -> Dist {
        Dist {
            atoms: vec![0.0; ATOMS],
        }
    }

    /// The empirical distribution of `samples`: each atom the mean of its slice of the sorted
    /// samples (a sample straddling two slices split between them by weight).
    pub fn from_samples(samples: &[f64]) -> Result<Dist, DistError> {
        if samples.is_empty() {
            return Err(DistError::NoSamples);
        }
        let mut sorted = samples
            .iter()
            .map(|&s| checked(s))
            .collect::<Result<Vec<f64>, _>>()?;
        sorted.sort_by(by_value);
        Ok(Dist {
            atoms: recut(&sorted),
        })
    }

    /// A distribution through given quantiles (`(p, value)`, `p` in (0, 1), values not
    /// decreasing with `p`), as a `--params` file may give it: the quantile function is linear
    /// between them, and beyond the outermost two it goes on with the slope of the nearest two
    /// (a single quantile is a point), never below 0.
    pub fn from_quantiles(points: &[(f64, f64)]) -> Result<Dist, DistError> {
        if points.is_empty() {
            return Err(DistError::NoSamples);
        }
        let mut pts = Vec::with_capacity(points.len());
        for &(p, v) in points {
            if !(p > 0.0 && p < 1.0) {
                return Err(DistError::Probability(p));
            }
            pts.push((p, checked(v)?));
        }
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        for w in pts.windows(2) {
            if w[1].1 < w[0].1 {
                return Err(DistError::Decreasing(format!(
                    "p{} = {} > p{} = {}",
                    w[0].0 * 100.0,
                    w[0].1,
                    w[1].0 * 100.0,
                    w[1].1
                )));
            }
        }
        pts.dedup_by(|b, a| a.0 == b.0);
        let q = |p: f64| -> f64 {
            if pts.len() == 1 {
                return pts[0].1;
            }
            // The segment holding p, or the outermost one past the ends.
            let i = pts
                .windows(2)
                .position(|w| p <= w[1].0)
                .unwrap_or(pts.len() - 2);
            let ((p0, v0), (p1, v1)) = (pts[i], pts[i + 1]);
            (v0 + (v1 - v0) * (p - p0) / (p1 - p0)).max(0.0)
        };
        // Each atom: the mean of the quantile function over its slice, by the midpoint rule
        // on a finer grid.
        const FINE: usize = 8;
        let atoms = (0..ATOMS)
            .map(|j| {
                (0..FINE)
                    .map(|f| q((j as f64 + (f as f64 + 0.5) / FINE as f64) / ATOMS as f64))
                    .sum::<f64>()
                    / FINE as f64
            })
            .collect::<Vec<f64>>();
        let mut atoms = atoms;
        atoms.sort_by(by_value);
        Ok(Dist { atoms })
    }

    /// The mean.
    pub fn mean(&self) -> f64 {
        self.atoms.iter().sum::<f64>() / ATOMS as f64
    }

    /// The lowest value it takes (its first atom).
    pub fn lowest(&self) -> f64 {
        self.atoms[0]
    }

    /// The `p` quantile (`p` in [0, 1]): interpolated between the atoms, each standing at the
    /// middle of its slice; below the first and above the last, the first and the last.
    pub fn quantile(&self, p: f64) -> f64 {
        let x = p.clamp(0.0, 1.0) * ATOMS as f64 - 0.5;
        if x <= 0.0 {
            return self.atoms[0];
        }
        let i = x.floor() as usize;
        if i + 1 >= ATOMS {
            return self.atoms[ATOMS - 1];
        }
        let f = x - i as f64;
        self.atoms[i] + (self.atoms[i + 1] - self.atoms[i]) * f
    }

    /// The probability of at most `x`.
    pub fn cdf(&self, x: f64) -> f64 {
        let below = self.atoms.partition_point(|&a| a <= x);
        below as f64 / ATOMS as f64
    }

    /// The distribution plus a fixed time.
    pub fn shifted(&self, by: f64) -> Dist {
        Dist {
            atoms: self.atoms.iter().map(|a| (a + by).max(0.0)).collect(),
        }
    }

    /// The distribution scaled by `factor` (not negative).
    pub fn scaled(&self, factor: f64) -> Dist {
        let f = factor.max(0.0);
        Dist {
            atoms: self.atoms.iter().map(|a| a * f).collect(),
        }
    }

    /// `self + other`, the two independent (a convolution).
    pub fn then(&self, other: &Dist) -> Dist {
        let mut all = Vec::with_capacity(ATOMS * ATOMS);
        for a in &self.atoms {
            for b in &other.atoms {
                all.push(a + b);
            }
        }
        all.sort_by(by_value);
        Dist { atoms: recut(&all) }
    }

    /// `self + other`, the two moving together: quantiles add.
    pub fn then_together(&self, other: &Dist) -> Dist {
        Dist {
            atoms: self
                .atoms
                .iter()
                .zip(&other.atoms)
                .map(|(a, b)| a + b)
                .collect(),
        }
    }

    /// The sum of `n` independent copies (`n` batches one after another); 0 for none.
    pub fn repeated(&self, n: u32) -> Dist {
        let mut out: Option<Dist> = None;
        let mut power = self.clone();
        let mut k = n;
        while k > 0 {
            if k & 1 == 1 {
                out = Some(match out {
                    None => power.clone(),
                    Some(o) => o.then(&power),
                });
            }
            k >>= 1;
            if k > 0 {
                power = power.then(&power);
            }
        }
        out.unwrap_or_else(Dist::zero)
    }

    /// `max(self, other)`, the two independent: the CDFs multiply.
    pub fn max(&self, other: &Dist) -> Dist {
        // P(max <= x) = F(x) G(x): on the merged atoms, each value's probability is the CDF's
        // step there; then re-cut into equal slices.
        let mut points: Vec<f64> = self.atoms.iter().chain(&other.atoms).copied().collect();
        points.sort_by(by_value);
        points.dedup();
        let mut weighted = Vec::with_capacity(points.len());
        let mut before = 0.0;
        for &x in &points {
            let now = self.cdf(x) * other.cdf(x);
            if now > before {
                weighted.push((x, now - before));
                before = now;
            }
        }
        Dist {
            atoms: recut_weighted(&weighted),
        }
    }

    /// `max(self, other)`, the two moving together: quantiles take the larger.
    pub fn max_together(&self, other: &Dist) -> Dist {
        let mut atoms: Vec<f64> = self
            .atoms
            .iter()
            .zip(&other.atoms)
            .map(|(a, b)| a.max(*b))
            .collect();
        atoms.sort_by(by_value);
        Dist { atoms }
    }

    /// The slowest of `n` independent copies (`n` instances at once): the CDF to the `n`th
    /// power, so the quantile at `p` is the copy's at `p^(1/n)`. One copy for `n` 0 or 1.
    pub fn slowest_of(&self, n: u32) -> Dist {
        if n <= 1 {
            return self.clone();
        }
        // Atom j of the result: the mean of the copy's quantile function over its slice of
        // probabilities, mapped through p -> p^(1/n).
        const FINE: usize = 8;
        let inv = 1.0 / f64::from(n);
        let atoms = (0..ATOMS)
            .map(|j| {
                (0..FINE)
                    .map(|f| {
                        let p = (j as f64 + (f as f64 + 0.5) / FINE as f64) / ATOMS as f64;
                        self.quantile(p.powf(inv))
                    })
                    .sum::<f64>()
                    / FINE as f64
            })
            .collect();
        Dist { atoms }
    }
}

/// The `q` quantile of `sorted` (ascending) values by nearest rank: the smallest value with at
/// least a `q` share of the values at or below it. `None` for none.
pub fn nearest_rank(sorted: &[f64], q: f64) -> Option<f64> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = (q * n as f64).ceil().clamp(1.0, n as f64) as usize;
    Some(sorted[rank - 1])
}

/// [`ATOMS`] atoms from sorted values of equal weight: each the mean of its slice.
fn recut(sorted: &[f64]) -> Vec<f64> {
    let w = 1.0 / sorted.len() as f64;
    let weighted: Vec<(f64, f64)> = sorted.iter().map(|&v| (v, w)).collect();
    recut_weighted(&weighted)
}

/// [`ATOMS`] atoms from sorted values with weights summing to 1: each the mean of its slice
/// of probability (a value straddling two slices split between them).
fn recut_weighted(sorted: &[(f64, f64)]) -> Vec<f64> {
    let total: f64 = sorted.iter().map(|x| x.1).sum();
    let slice = total / ATOMS as f64;
    let mut atoms = Vec::with_capacity(ATOMS);
    let (mut sum, mut filled) = (0.0, 0.0);
    for &(v, w) in sorted {
        let mut left = w;
        while left > 0.0 {
            let take = left.min(slice - filled);
            sum += v * take;
            filled += take;
            left -= take;
            if filled >= slice * (1.0 - 1e-12) {
                if atoms.len() < ATOMS {
                    atoms.push(sum / filled);
                }
                sum = 0.0;
                filled = 0.0;
            }
            if take <= 0.0 {
                break;
            }
        }
    }
    // Rounding can leave the last slice a hair short.
    if atoms.len() < ATOMS {
        let last = if filled > 0.0 {
            sum / filled
        } else {
            sorted.last().map_or(0.0, |x| x.0)
        };
        atoms.resize(ATOMS, last);
    }
    // A slice's mean is computed in floating point: equal values can come out an ulp apart.
    // Atoms never go down.
    for i in 1..atoms.len() {
        if atoms[i] < atoms[i - 1] {
            atoms[i] = atoms[i - 1];
        }
    }
    atoms
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs().max(1e-9)
    }

    /// Samples of a skewed time: mostly near 1 s, a tail to about 5 s.
    fn skewed(rng: &mut StdRng, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let u: f64 = rng.r#gen();
                1.0 + 0.3 * u
                    + if rng.r#gen::<f64>() < 0.1 {
                        3.0 * u
                    } else {
                        0.0
                    }
            })
            .collect()
    }

    #[test]
    fn a_point_is_its_value_everywhere() {
        let d = Dist::point(2.5).unwrap();
        assert_eq!(d.mean(), 2.5);
        assert_eq!(d.quantile(0.0), 2.5);
        assert_eq!(d.quantile(0.99), 2.5);
        assert_eq!(d.slowest_of(7), d);
        assert_eq!(d.then(&d).mean(), 5.0);
        assert!(Dist::point(-1.0).is_err() && Dist::point(f64::NAN).is_err());
    }

    #[test]
    fn samples_keep_their_mean_and_quantiles() {
        let mut rng = StdRng::seed_from_u64(7);
        let s = skewed(&mut rng, 10_000);
        let d = Dist::from_samples(&s).unwrap();
        let mean = s.iter().sum::<f64>() / s.len() as f64;
        assert!(close(d.mean(), mean, 1e-9), "{} vs {mean}", d.mean());
        let mut sorted = s.clone();
        sorted.sort_by(by_value);
        for p in [0.5, 0.9, 0.95, 0.99] {
            let want = sorted[(p * sorted.len() as f64) as usize];
            assert!(
                close(d.quantile(p), want, 0.03),
                "p{p}: {} vs {want}",
                d.quantile(p)
            );
        }
        assert!(Dist::from_samples(&[]).is_err());
        assert!(Dist::from_samples(&[1.0, -2.0]).is_err());
    }

    #[test]
    fn given_quantiles_come_back() {
        let d = Dist::from_quantiles(&[(0.5, 1.3), (0.95, 3.8)]).unwrap();
        assert!(close(d.quantile(0.5), 1.3, 0.01), "{}", d.quantile(0.5));
        assert!(close(d.quantile(0.95), 3.8, 0.01), "{}", d.quantile(0.95));
        assert!(d.quantile(0.0) >= 0.0);
        assert!(Dist::from_quantiles(&[(0.5, 2.0), (0.9, 1.0)]).is_err());
        assert!(Dist::from_quantiles(&[(1.5, 2.0)]).is_err());
        assert_eq!(Dist::from_quantiles(&[(0.5, 2.0)]).unwrap().mean(), 2.0);
    }

    /// Monte Carlo against the operations: independent sums and maxima, the slowest of n, and
    /// their comonotonic forms, on skewed samples.
    #[test]
    fn operations_match_sampling() {
        let mut rng = StdRng::seed_from_u64(11);
        let (xs, ys) = (skewed(&mut rng, 4000), skewed(&mut rng, 4000));
        let ys: Vec<f64> = ys.iter().map(|y| 0.5 * y + 0.2).collect();
        let (x, y) = (
            Dist::from_samples(&xs).unwrap(),
            Dist::from_samples(&ys).unwrap(),
        );
        let n = 200_000;
        let pick = |rng: &mut StdRng, v: &[f64]| v[rng.gen_range(0..v.len())];
        let quantiles = |mut v: Vec<f64>| {
            v.sort_by(by_value);
            [0.5, 0.9, 0.95, 0.99].map(|p| v[(p * v.len() as f64) as usize])
        };
        let sums = quantiles(
            (0..n)
                .map(|_| pick(&mut rng, &xs) + pick(&mut rng, &ys))
                .collect(),
        );
        let maxes = quantiles(
            (0..n)
                .map(|_| pick(&mut rng, &xs).max(pick(&mut rng, &ys)))
                .collect(),
        );
        let slowest = quantiles(
            (0..n)
                .map(|_| (0..8).map(|_| pick(&mut rng, &xs)).fold(0.0, f64::max))
                .collect(),
        );
        let batches = quantiles(
            (0..n)
                .map(|_| (0..3).map(|_| pick(&mut rng, &xs)).sum())
                .collect(),
        );
        for (k, p) in [0.5, 0.9, 0.95, 0.99].into_iter().enumerate() {
            let checks = [
                ("sum", x.then(&y).quantile(p), sums[k]),
                ("max", x.max(&y).quantile(p), maxes[k]),
                ("slowest of 8", x.slowest_of(8).quantile(p), slowest[k]),
                ("3 in a row", x.repeated(3).quantile(p), batches[k]),
            ];
            for (what, got, want) in checks {
                assert!(
                    close(got, want, 0.04),
                    "{what} p{p}: {got} vs sampled {want}"
                );
            }
        }
        // Together: quantiles add and take the larger, exactly.
        for p in [0.5, 0.95] {
            let (a, b) = (x.quantile(p), y.quantile(p));
            assert!(close(x.then_together(&y).quantile(p), a + b, 1e-9));
            assert!(close(x.max_together(&y).quantile(p), a.max(b), 1e-9));
        }
        // A tail grows with the width of a stage.
        assert!(x.slowest_of(32).quantile(0.5) > x.slowest_of(4).quantile(0.5));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// The mean of a sum is the sum of the means, whatever the distributions; a maximum
        /// is never below either part, in mean or at any quantile; n in a row is n means.
        #[test]
        fn sums_keep_means_and_maxima_dominate(
            xs in proptest::collection::vec(0.0f64..100.0, 1..60),
            ys in proptest::collection::vec(0.0f64..100.0, 1..60),
            n in 0u32..6,
        ) {
            let (x, y) = (Dist::from_samples(&xs).unwrap(), Dist::from_samples(&ys).unwrap());
            let sum = x.then(&y);
            prop_assert!(close(sum.mean(), x.mean() + y.mean(), 1e-9));
            prop_assert!(close(x.repeated(n).mean(), f64::from(n) * x.mean(), 1e-9));
            let m = x.max(&y);
            prop_assert!(m.mean() + 1e-9 >= x.mean().max(y.mean()));
            for p in [0.1, 0.5, 0.9, 0.99] {
                let larger = x.quantile(p).max(y.quantile(p));
                prop_assert!(m.quantile(p) >= larger * (1.0 - 0.02) - 1e-9, "p{}: {} < {}", p, m.quantile(p), larger);
                prop_assert!(x.slowest_of(n + 1).quantile(p) + 1e-9 >= x.quantile(p));
            }
        }
    }
}
