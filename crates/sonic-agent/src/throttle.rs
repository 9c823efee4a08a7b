//! Bandwidth like a VM's: one egress and one ingress limiter per agent ([`AgentThrottle`]), shared
//! by every stream it sends or receives (file server, direct fetches, the object store), and a
//! meter of the bandwidth actually obtained ([`BandwidthMeter`]), for the planner.
//!
//! The limits stand for the VM type's `network_mbps` (megabits per second, as cloud catalogs quote
//! them). A token bucket with a short refill period (20 ms) keeps bursts small, so a measured rate
//! over a transfer of half a second or more stays within a few percent of the limit.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The limiter type used for every stream (`async-speed-limit`, standard clock).
pub type Limiter = async_speed_limit::Limiter;

/// How much of a burst a limiter allows after being idle: one refill period of its rate.
const REFILL: Duration = Duration::from_millis(20);

/// Converts a catalog's megabits per second to bytes per second.
pub fn mbps_to_bytes_per_sec(mbps: f64) -> f64 {
    mbps * 1_000_000.0 / 8.0
}

/// A limiter at `bytes_per_sec`, or an unlimited one for `None` (or a value that is not a positive
/// finite number).
pub fn limiter(bytes_per_sec: Option<f64>) -> Limiter {
    match bytes_per_sec {
        Some(rate) if rate.is_finite() && rate > 0.0 => {
            Limiter::builder(rate).refill(REFILL).build()
        }
        _ => Limiter::new(f64::INFINITY),
    }
}

/// The two limiters of one agent, standing for its VM's network. Clones share the limiters.
///
/// Streams take the limiter pair as a [`sonic_storage::Throttle`] (see
/// [`AgentThrottle::storage_throttle`]), the one type the object store uses too, so S3 traffic
/// shares the VM's bandwidth with agent-to-agent traffic.
#[derive(Clone, Debug)]
pub struct AgentThrottle {
    egress: Limiter,
    ingress: Limiter,
}

impl Default for AgentThrottle {
    fn default() -> Self {
        Self::unlimited()
    }
}

impl AgentThrottle {
    /// No limit either way.
    pub fn unlimited() -> Self {
        Self::from_bytes_per_sec(None, None)
    }

    /// Symmetric limits from the VM type's `network_mbps` (megabits per second); unlimited when
    /// not configured.
    pub fn from_mbps(network_mbps: Option<f64>) -> Self {
        let rate = network_mbps.map(mbps_to_bytes_per_sec);
        Self::from_bytes_per_sec(rate, rate)
    }

    /// Separate limits per direction, in bytes per second; `None` is unlimited.
    pub fn from_bytes_per_sec(egress: Option<f64>, ingress: Option<f64>) -> Self {
        Self {
            egress: limiter(egress),
            ingress: limiter(ingress),
        }
    }

    /// Every byte this agent sends passes through it (the file server's responses, S3 uploads).
    pub fn egress(&self) -> &Limiter {
        &self.egress
    }

    /// Every byte this agent receives passes through it (direct fetches, S3 downloads).
    pub fn ingress(&self) -> &Limiter {
        &self.ingress
    }

    /// The same limiters (shared, not copied) as the type every stream takes: the file server,
    /// [`crate::transfer::fetch_direct`], and `S3Store::with_throttle`.
    pub fn storage_throttle(&self) -> sonic_storage::Throttle {
        sonic_storage::Throttle {
            egress: self.egress.clone(),
            ingress: self.ingress.clone(),
        }
    }
}

/// Which way bytes went, seen from this agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Egress,
    Ingress,
}

/// What a meter reports: exponentially weighted moving averages of the throughput of completed
/// transfers, in **bytes per second**, per direction; `None` before the first sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BandwidthSnapshot {
    pub egress_bps: Option<f64>,
    pub ingress_bps: Option<f64>,
    pub egress_samples: u64,
    pub ingress_samples: u64,
    /// Samples in both directions.
    pub samples: u64,
}

#[derive(Debug, Default, Clone, Copy)]
struct Ewma {
    value: Option<f64>,
    samples: u64,
}

impl Ewma {
    fn add(&mut self, x: f64, alpha: f64) {
        self.value = Some(match self.value {
            None => x,
            Some(v) => alpha * x + (1.0 - alpha) * v,
        });
        self.samples += 1;
    }
}

#[derive(Debug, Default)]
struct MeterState {
    egress: Ewma,
    ingress: Ewma,
}

/// Measures the bandwidth obtained by completed transfers (bytes over the seconds spent moving
/// them) as an exponentially weighted moving average per direction. Clones share the state.
///
/// Transfers smaller than `min_sample_bytes` are ignored: their time is mostly request latency, and
/// counting them would make the planner believe the network is slow.
#[derive(Debug, Clone)]
pub struct BandwidthMeter {
    state: Arc<Mutex<MeterState>>,
    alpha: f64,
    min_sample_bytes: u64,
}

impl Default for BandwidthMeter {
    /// `alpha` 0.25 (a sample's weight halves after about 2.4 newer samples), samples from 256 KiB.
    fn default() -> Self {
        Self::new(0.25, 256 * 1024)
    }
}

impl BandwidthMeter {
    /// `alpha` in (0, 1] is the weight of the newest sample (clamped into that range).
    pub fn new(alpha: f64, min_sample_bytes: u64) -> Self {
        let alpha = if alpha.is_finite() {
            alpha.clamp(f64::MIN_POSITIVE, 1.0)
        } else {
            1.0
        };
        Self {
            state: Arc::new(Mutex::new(MeterState::default())),
            alpha,
            min_sample_bytes,
        }
    }

    /// Records one completed transfer; returns whether it counted as a sample.
    pub fn record(&self, direction: Direction, bytes: u64, seconds: f64) -> bool {
        if bytes < self.min_sample_bytes || !seconds.is_finite() || seconds <= 0.0 {
            return false;
        }
        let rate = bytes as f64 / seconds;
        let mut state = self.lock();
        match direction {
            Direction::Egress => state.egress.add(rate, self.alpha),
            Direction::Ingress => state.ingress.add(rate, self.alpha),
        }
        true
    }

    pub fn snapshot(&self) -> BandwidthSnapshot {
        let state = self.lock();
        BandwidthSnapshot {
            egress_bps: state.egress.value,
            ingress_bps: state.ingress.value,
            egress_samples: state.egress.samples,
            ingress_samples: state.ingress.samples,
            samples: state.egress.samples + state.ingress.samples,
        }
    }

    /// The snapshot in the wire type of the agent API (capacity and heartbeats).
    pub fn report(&self) -> sonic_api::agent::BandwidthReport {
        let s = self.snapshot();
        sonic_api::agent::BandwidthReport {
            egress_bps: s.egress_bps,
            ingress_bps: s.ingress_bps,
            samples: s.samples,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MeterState> {
        // Each update is a couple of float writes: a poisoned state is still usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn megabits_to_bytes() {
        assert_eq!(mbps_to_bytes_per_sec(750.0), 93_750_000.0);
        assert_eq!(mbps_to_bytes_per_sec(8.0), 1_000_000.0);
    }

    #[test]
    fn limits_from_catalog() {
        let bw = AgentThrottle::from_mbps(Some(800.0));
        assert_eq!(bw.egress().speed_limit(), 100_000_000.0);
        assert_eq!(bw.ingress().speed_limit(), 100_000_000.0);
        let st = bw.storage_throttle();
        assert_eq!(st.egress.speed_limit(), 100_000_000.0);
        assert!(
            AgentThrottle::from_mbps(None)
                .egress()
                .speed_limit()
                .is_infinite()
        );
        assert!(limiter(Some(0.0)).speed_limit().is_infinite());
        assert!(limiter(Some(f64::NAN)).speed_limit().is_infinite());
    }

    #[test]
    fn clones_share_limiters() {
        let bw = AgentThrottle::from_bytes_per_sec(Some(1e6), None);
        let other = bw.clone();
        other.egress().set_speed_limit(2e6);
        assert_eq!(bw.egress().speed_limit(), 2e6);
        assert_eq!(bw.storage_throttle().egress.speed_limit(), 2e6);
    }

    #[test]
    fn ewma_per_direction() {
        let m = BandwidthMeter::new(0.5, 1_000);
        assert_eq!(m.snapshot().egress_bps, None);
        assert!(m.record(Direction::Egress, 100_000, 1.0));
        assert!(m.record(Direction::Egress, 300_000, 1.0));
        assert!(m.record(Direction::Ingress, 50_000, 0.5));
        // Too small, or no time: not a sample.
        assert!(!m.record(Direction::Ingress, 999, 0.001));
        assert!(!m.record(Direction::Ingress, 10_000, 0.0));
        let s = m.snapshot();
        assert_eq!(s.egress_bps, Some(200_000.0));
        assert_eq!(s.ingress_bps, Some(100_000.0));
        assert_eq!((s.egress_samples, s.ingress_samples, s.samples), (2, 1, 3));
        let shared = m.clone();
        shared.record(Direction::Ingress, 300_000, 1.0);
        assert_eq!(m.snapshot().ingress_bps, Some(200_000.0));
        let r = m.report();
        assert_eq!(
            (r.egress_bps, r.ingress_bps, r.samples),
            (Some(200_000.0), Some(200_000.0), 4)
        );
    }
}
