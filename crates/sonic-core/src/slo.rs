//! Percentile service-level objectives on job latency (interfaces.md §6; ORION, seed thesis
//! ch. 6): "the job's p95 latency at most 20 s", in a DAG's `slo:` or a job's `--slo p95=20s`.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::units::Seconds;

/// The lowest and highest percentile an objective may name.
pub const PERCENTILES: (f64, f64) = (50.0, 99.9);

/// The cheapest plan whose predicted `percentile` latency is at most `latency_s`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    /// 50 to 99.9.
    pub percentile: f64,
    /// Seconds, more than 0.
    pub latency_s: f64,
    /// Where no plan meets it: run the plan with the lowest percentile latency instead of
    /// refusing the job (`--slo-best-effort`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub best_effort: bool,
}

/// Why an objective was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SloError {
    #[error("the SLO's percentile must be from 50 to 99.9, got {0}")]
    Percentile(f64),
    #[error("the SLO's latency must be more than 0 s (at most a week), got {0}")]
    Latency(f64),
    #[error("{0:?} is not an SLO: write p<percentile>=<duration>, e.g. p95=20s or p99.9=1500ms")]
    Form(String),
}

impl Slo {
    /// A checked objective.
    pub fn new(percentile: f64, latency_s: f64) -> Result<Slo, SloError> {
        if !(percentile.is_finite() && (PERCENTILES.0..=PERCENTILES.1).contains(&percentile)) {
            return Err(SloError::Percentile(percentile));
        }
        if !(latency_s.is_finite() && latency_s > 0.0 && latency_s <= 7.0 * 86_400.0) {
            return Err(SloError::Latency(latency_s));
        }
        Ok(Slo {
            percentile,
            latency_s,
            best_effort: false,
        })
    }

    /// The percentile as a probability (95 -> 0.95).
    pub fn probability(&self) -> f64 {
        self.percentile / 100.0
    }

    /// Checks an objective read from elsewhere (a stored job, a request).
    pub fn checked(self) -> Result<Slo, SloError> {
        Ok(Slo {
            best_effort: self.best_effort,
            ..Slo::new(self.percentile, self.latency_s)?
        })
    }

    /// The same objective, best effort or not.
    pub fn best_effort(self, best_effort: bool) -> Slo {
        Slo {
            best_effort,
            ..self
        }
    }
}

impl FromStr for Slo {
    type Err = SloError;
    /// `p95=20s`, `p99.9=1500ms`, `p50=2m` (a bare number is seconds).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let form = || SloError::Form(s.to_owned());
        let (p, latency) = s.trim().split_once('=').ok_or_else(form)?;
        let p = p.trim();
        let p = p.strip_prefix('p').or_else(|| p.strip_prefix('P'));
        let percentile: f64 = p.ok_or_else(form)?.parse().map_err(|_| form())?;
        let latency: Seconds = latency.trim().parse().map_err(|_| form())?;
        Slo::new(percentile, latency.0)
    }
}

impl fmt::Display for Slo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{}={}s", self.percentile, self.latency_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objectives_parse_in_the_cli_form_and_bad_ones_are_refused() {
        let s: Slo = "p95=20s".parse().expect("p95");
        assert_eq!(s, Slo::new(95.0, 20.0).unwrap());
        assert!((s.probability() - 0.95).abs() < 1e-12);
        let s: Slo = "p99.9=1500ms".parse().expect("p99.9");
        assert_eq!((s.percentile, s.latency_s), (99.9, 1.5));
        let s: Slo = " P50 = 2m ".parse().expect("spaces, capital P");
        assert_eq!((s.percentile, s.latency_s), (50.0, 120.0));
        assert_eq!("p95=3".parse::<Slo>().unwrap().latency_s, 3.0);
        for bad in [
            "95=20s", "p95", "p95=", "p=20s", "px=20s", "p95=fast", "", "p95=-1s",
        ] {
            assert!(
                matches!(bad.parse::<Slo>(), Err(SloError::Form(_))),
                "{bad:?}"
            );
        }
        assert_eq!("p40=1s".parse::<Slo>(), Err(SloError::Percentile(40.0)));
        assert_eq!("p100=1s".parse::<Slo>(), Err(SloError::Percentile(100.0)));
        assert_eq!("p95=0s".parse::<Slo>(), Err(SloError::Latency(0.0)));
        assert!(matches!(
            Slo::new(f64::NAN, 1.0),
            Err(SloError::Percentile(_))
        ));
        assert!(matches!(
            Slo::new(95.0, f64::INFINITY),
            Err(SloError::Latency(_))
        ));
        // Round trip through the summary's JSON form.
        let s = Slo::new(95.0, 20.0).unwrap();
        let json = serde_json::to_value(s).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"percentile": 95.0, "latency_s": 20.0})
        );
        assert_eq!(s.to_string(), "p95=20s");
        let json = serde_json::to_value(s.best_effort(true)).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"percentile": 95.0, "latency_s": 20.0, "best_effort": true})
        );
        let bad: Slo =
            serde_json::from_value(serde_json::json!({"percentile": 20, "latency_s": 1}))
                .expect("decodes");
        assert!(bad.checked().is_err());
    }
}
