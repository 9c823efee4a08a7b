//! The network bandwidth the planner uses per VM type: a moving average of what the agents
//! measure (their heartbeats carry each agent's own moving average of completed transfers),
//! falling back to the catalog's nominal `network_mbps` for a type nobody measured yet.
//!
//! The paper samples bandwidth every 5 minutes; here every heartbeat that carries new
//! measurements updates the average at once, so plans follow the network within seconds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use sonic_api::agent::BandwidthReport;
use sonic_api::plan::{BandwidthSource, TypeBandwidth};
use sonic_core::catalog::Catalog;

/// Weight of the newest agent report in its VM type's average.
pub const ALPHA: f64 = 0.3;

/// Bytes per second to megabits per second.
pub fn bytes_per_s_to_mbps(bps: f64) -> f64 {
    bps * 8.0 / 1e6
}

#[derive(Debug, Default)]
struct Book {
    /// Per VM type: the moving average (Mbit/s) and how many reports it holds.
    types: HashMap<String, (f64, u64)>,
    /// Per agent: the sample count of its last report, so a repeated report is not counted twice.
    seen: HashMap<String, u64>,
}

/// Per VM type moving averages of measured bandwidth. Shared by the heartbeat handler (writer)
/// and the planner (reader).
#[derive(Debug, Default)]
pub struct BandwidthBook {
    book: Mutex<Book>,
}

impl BandwidthBook {
    fn lock(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes one agent report (registration or heartbeat). Only a report with new measurements
    /// moves the average; an agent whose count went down restarted and starts over. Returns
    /// whether the average moved.
    pub fn observe(&self, agent: &str, vm_type: &str, report: &BandwidthReport) -> bool {
        // The best direction is the closest to the VM's capacity: the other may have been
        // limited by the peer or the object store.
        let best = [report.egress_bps, report.ingress_bps]
            .into_iter()
            .flatten()
            .filter(|v| v.is_finite() && *v > 0.0)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))));
        let Some(bps) = best else {
            return false;
        };
        let mut book = self.lock();
        let last = book.seen.get(agent).copied();
        if last.is_some_and(|n| report.samples == n) {
            return false;
        }
        book.seen.insert(agent.to_owned(), report.samples);
        let mbps = bytes_per_s_to_mbps(bps);
        let entry = book.types.entry(vm_type.to_owned()).or_insert((mbps, 0));
        if entry.1 > 0 {
            entry.0 = ALPHA * mbps + (1.0 - ALPHA) * entry.0;
        }
        entry.1 += 1;
        true
    }

    /// The measured moving average of a VM type, if any agent of it reported.
    pub fn network_mbps(&self, vm_type: &str) -> Option<f64> {
        self.lock().types.get(vm_type).map(|t| t.0)
    }

    /// The catalog with each VM type's `network_mbps` replaced by the measured average where
    /// there is one, and what each type's bandwidth came from.
    pub fn apply(&self, catalog: &Catalog) -> (Catalog, BTreeMap<String, TypeBandwidth>) {
        let book = self.lock();
        let mut out = catalog.clone();
        let mut used = BTreeMap::new();
        for vm in &mut out.vm_types {
            let bw = match book.types.get(&vm.name) {
                Some(&(mbps, reports)) => {
                    vm.network_mbps = mbps;
                    TypeBandwidth {
                        network_mbps: mbps,
                        source: BandwidthSource::Measured,
                        reports,
                    }
                }
                None => TypeBandwidth {
                    network_mbps: vm.network_mbps,
                    source: BandwidthSource::Catalog,
                    reports: 0,
                },
            };
            used.insert(vm.name.clone(), bw);
        }
        (out, used)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(egress: Option<f64>, ingress: Option<f64>, samples: u64) -> BandwidthReport {
        BandwidthReport {
            egress_bps: egress,
            ingress_bps: ingress,
            samples,
        }
    }

    #[test]
    fn reports_move_the_average_of_their_type_once() {
        let b = BandwidthBook::default();
        assert!(!b.observe("a-1", "m5.large", &report(None, None, 0)));
        assert_eq!(b.network_mbps("m5.large"), None);
        // 100 MB/s = 800 Mbit/s; the better direction counts.
        assert!(b.observe("a-1", "m5.large", &report(Some(50e6), Some(100e6), 2)));
        assert_eq!(b.network_mbps("m5.large"), Some(800.0));
        // The same report again (a heartbeat without new transfers) changes nothing.
        assert!(!b.observe("a-1", "m5.large", &report(Some(1e6), None, 2)));
        assert_eq!(b.network_mbps("m5.large"), Some(800.0));
        // Another agent of the type: weighted in.
        assert!(b.observe("a-2", "m5.large", &report(Some(50e6), None, 1)));
        let v = b.network_mbps("m5.large").expect("measured");
        assert!(
            (v - (ALPHA * 400.0 + (1.0 - ALPHA) * 800.0)).abs() < 1e-9,
            "{v}"
        );
        // A restarted agent (fewer samples) counts again.
        assert!(b.observe("a-1", "m5.large", &report(Some(100e6), None, 1)));
        assert_eq!(b.network_mbps("m5.xlarge"), None);
    }

    #[test]
    fn the_catalog_keeps_its_value_for_unmeasured_types() {
        let b = BandwidthBook::default();
        b.observe("a-1", "m5.large", &report(Some(25e6), None, 1));
        let (c, used) = b.apply(&Catalog::default());
        let large = c.vm_type("m5.large").expect("type");
        assert_eq!(large.network_mbps, 200.0);
        assert_eq!(used["m5.large"].source, BandwidthSource::Measured);
        assert_eq!(used["m5.large"].reports, 1);
        let xl = c.vm_type("m5.xlarge").expect("type");
        assert_eq!(
            xl.network_mbps,
            Catalog::default()
                .vm_type("m5.xlarge")
                .expect("type")
                .network_mbps
        );
        assert_eq!(used["m5.xlarge"].source, BandwidthSource::Catalog);
    }
}
