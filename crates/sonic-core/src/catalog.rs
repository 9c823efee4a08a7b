//! The VM catalog: which VM types exist, what they cost, and what storage costs. Read from YAML
//! (interfaces.md §3) or taken from the built-in defaults, which `deploy/catalog.yaml` repeats.
//!
//! Units: memory in MB, bandwidths in megabits per second, prices in US dollars.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

/// Seconds in the month that storage prices are quoted per (AWS bills a GB-month as 730 hours).
pub const SECONDS_PER_MONTH: f64 = 730.0 * 3600.0;

/// Memory each VM keeps for the agent and the OS unless the catalog says otherwise.
pub const DEFAULT_RESERVE_MB: u64 = 512;

/// One VM type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmType {
    pub name: String,
    pub vcpus: u32,
    pub memory_mb: u64,
    /// Sustained (baseline) network bandwidth, megabits per second.
    pub network_mbps: f64,
    pub usd_per_hour: f64,
}

/// Local disk (EBS-like) attached to the VMs: holds files for `vm-storage` and `direct`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LocalStorage {
    pub usd_per_gb_month: f64,
}

/// The S3-compatible object store used by `remote`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoteStorage {
    /// Upload throughput of one VM's connection to the store, megabits per second.
    pub write_mbps: f64,
    /// Download throughput of one VM's connection to the store, megabits per second.
    pub read_mbps: f64,
    /// Time to first byte of one request.
    pub request_latency_ms: f64,
    pub put_usd_per_1k: f64,
    pub get_usd_per_1k: f64,
    pub usd_per_gb_month: f64,
    /// Requests per second the store accepts for one job's prefix (Locus, S3: ~3,500 PUT/s).
    pub requests_per_s: f64,
    /// Aggregate throughput of the whole store, megabits per second; absent means it scales
    /// beyond what one job can use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate_mbps: Option<f64>,
}

/// An in-memory tier (Redis, as ElastiCache rents it) used by `memory`: one node, rented by the
/// hour, whose memory holds the edge's files while they pass. A job is charged its share of the
/// node: the bytes it holds over the node's capacity, for as long as it holds them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemoryTier {
    /// What the node costs per hour.
    pub usd_per_hour: f64,
    /// What it holds (MB, 1 GiB = 1024 MB, as VM memory).
    pub capacity_mb: u64,
    /// The node's network, megabits per second: every VM's transfers share it, and one VM's
    /// connection is also bounded by its own NIC.
    pub network_mbps: f64,
    /// Time to first byte of one request.
    pub request_latency_ms: f64,
    /// Requests per second the node serves.
    pub requests_per_s: f64,
}

impl Default for MemoryTier {
    fn default() -> Self {
        // ElastiCache cache.r6g.large, us-east-1 on-demand as listed in 2024-2025: $0.206/h,
        // 13.07 GiB, "up to 10 Gbit/s" (its baseline taken as an m5.large's 750 Mbit/s).
        // Latency and request rate: a Redis node in the same zone, sub-millisecond and about
        // 100,000 simple commands per second; assumptions until measured, as the store's.
        MemoryTier {
            usd_per_hour: 0.206,
            capacity_mb: 13_383,
            network_mbps: 750.0,
            request_latency_ms: 0.5,
            requests_per_s: 100_000.0,
        }
    }
}

impl MemoryTier {
    /// What it holds, in bytes.
    pub fn capacity_bytes(&self) -> f64 {
        self.capacity_mb as f64 * 1024.0 * 1024.0
    }

    /// Dollars per byte held per second: the node's price over its capacity.
    pub fn usd_per_byte_second(&self) -> f64 {
        self.usd_per_hour / 3600.0 / self.capacity_bytes()
    }
}

/// A checked VM catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Catalog {
    /// Memory per VM kept for the agent and the OS: lambdas fit in `memory_mb - reserve_mb`.
    #[serde(default = "default_reserve_mb")]
    pub reserve_mb: u64,
    pub vm_types: Vec<VmType>,
    #[serde(default)]
    pub local_storage: LocalStorage,
    #[serde(default)]
    pub remote_storage: RemoteStorage,
    /// The in-memory tier `memory` passes files through; absent, no edge can use it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_tier: Option<MemoryTier>,
}

fn default_reserve_mb() -> u64 {
    DEFAULT_RESERVE_MB
}

/// A refused catalog.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CatalogError {
    /// Not valid YAML or not the catalog's shape; serde-saphyr's message carries line and column.
    #[error("invalid catalog: {0}")]
    Yaml(String),
    #[error("invalid catalog: {field}: {message}")]
    Invalid { field: String, message: String },
}

// Defaults. Prices: AWS on-demand Linux, us-east-1 (N. Virginia), as listed in 2024-2025:
// m5.large $0.096/h, m5.xlarge $0.192/h, m5.2xlarge $0.384/h, t2.large $0.0928/h.
// Network: AWS lists m5 up to 2xlarge as "up to 10 Gbit/s", which is a burst rate; what a VM
// sustains is its baseline: about 0.75 Gbit/s for m5.large, 1.25 for m5.xlarge and 2.5 for
// m5.2xlarge (AWS "network performance" baseline tables). t2.large is "low to moderate": we
// assume about 500 Mbit/s. The agents measure real bandwidths; these are only priors.
// Memory: 8, 16, 32 and 8 GiB, written in MB as the catalog does (1 GiB = 1024 MB here).
// Local storage: EBS gp3, $0.08 per GB-month. Remote storage: S3 Standard, $0.023 per GB-month,
// PUT $0.005 and GET $0.0004 per 1,000 requests, 3,500 PUT/s per prefix. Per-connection
// throughputs (write 600, read 400 Mbit/s; writes faster than reads, as the SONIC paper measured)
// and the 25 ms request latency are assumptions to be replaced by measurements.
impl Default for Catalog {
    fn default() -> Self {
        let vm = |name: &str, vcpus, memory_mb, network_mbps, usd_per_hour| VmType {
            name: name.to_owned(),
            vcpus,
            memory_mb,
            network_mbps,
            usd_per_hour,
        };
        Catalog {
            reserve_mb: DEFAULT_RESERVE_MB,
            vm_types: vec![
                vm("m5.large", 2, 8192, 750.0, 0.096),
                vm("m5.xlarge", 4, 16384, 1250.0, 0.192),
                vm("m5.2xlarge", 8, 32768, 2500.0, 0.384),
                vm("t2.large", 2, 8192, 500.0, 0.0928),
            ],
            local_storage: LocalStorage::default(),
            remote_storage: RemoteStorage::default(),
            memory_tier: None,
        }
    }
}

impl Default for LocalStorage {
    fn default() -> Self {
        LocalStorage {
            usd_per_gb_month: 0.08,
        }
    }
}

impl Default for RemoteStorage {
    fn default() -> Self {
        RemoteStorage {
            write_mbps: 600.0,
            read_mbps: 400.0,
            request_latency_ms: 25.0,
            put_usd_per_1k: 0.005,
            get_usd_per_1k: 0.0004,
            usd_per_gb_month: 0.023,
            requests_per_s: 3500.0,
            aggregate_mbps: None,
        }
    }
}

/// Megabits per second to bytes per second.
pub fn mbps_to_bytes_per_s(mbps: f64) -> f64 {
    mbps * 1e6 / 8.0
}

impl VmType {
    /// Network bandwidth in bytes per second.
    pub fn bandwidth_bps(&self) -> f64 {
        mbps_to_bytes_per_s(self.network_mbps)
    }

    pub fn usd_per_second(&self) -> f64 {
        self.usd_per_hour / 3600.0
    }
}

impl Catalog {
    /// Parses and checks a catalog's YAML text.
    pub fn from_yaml(text: &str) -> Result<Catalog, CatalogError> {
        if text.len() > crate::yaml::MAX_YAML_BYTES {
            return Err(CatalogError::Yaml(format!(
                "the file has {} bytes; at most {}",
                text.len(),
                crate::yaml::MAX_YAML_BYTES
            )));
        }
        let catalog: Catalog = serde_saphyr::from_str_with_options(text, crate::yaml::options())
            .map_err(|e| CatalogError::Yaml(first_line(&e)))?;
        catalog.check()?;
        Ok(catalog)
    }

    /// Checks what serde cannot: positive numbers, unique names, at least one VM type.
    pub fn check(&self) -> Result<(), CatalogError> {
        let bad = |field: String, message: &str| CatalogError::Invalid {
            field,
            message: message.to_owned(),
        };
        if self.vm_types.is_empty() {
            return Err(bad("vm_types".into(), "at least one VM type is needed"));
        }
        let mut names = BTreeSet::new();
        for (i, v) in self.vm_types.iter().enumerate() {
            let at = |f: &str| format!("vm_types[{i}].{f}");
            if v.name.trim().is_empty() {
                return Err(bad(at("name"), "must not be empty"));
            }
            if !names.insert(v.name.as_str()) {
                return Err(bad(at("name"), &format!("duplicate VM type {:?}", v.name)));
            }
            if v.vcpus == 0 {
                return Err(bad(at("vcpus"), "must be at least 1"));
            }
            if v.memory_mb <= self.reserve_mb {
                return Err(bad(
                    at("memory_mb"),
                    &format!(
                        "must exceed the {} MB reserve (reserve_mb)",
                        self.reserve_mb
                    ),
                ));
            }
            positive(&at("network_mbps"), v.network_mbps)?;
            positive(&at("usd_per_hour"), v.usd_per_hour)?;
        }
        non_negative(
            "local_storage.usd_per_gb_month",
            self.local_storage.usd_per_gb_month,
        )?;
        let r = &self.remote_storage;
        positive("remote_storage.write_mbps", r.write_mbps)?;
        positive("remote_storage.read_mbps", r.read_mbps)?;
        non_negative("remote_storage.request_latency_ms", r.request_latency_ms)?;
        non_negative("remote_storage.put_usd_per_1k", r.put_usd_per_1k)?;
        non_negative("remote_storage.get_usd_per_1k", r.get_usd_per_1k)?;
        non_negative("remote_storage.usd_per_gb_month", r.usd_per_gb_month)?;
        positive("remote_storage.requests_per_s", r.requests_per_s)?;
        if let Some(a) = r.aggregate_mbps {
            positive("remote_storage.aggregate_mbps", a)?;
        }
        if let Some(m) = &self.memory_tier {
            positive("memory_tier.usd_per_hour", m.usd_per_hour)?;
            if m.capacity_mb == 0 {
                return Err(bad("memory_tier.capacity_mb".into(), "must be at least 1"));
            }
            positive("memory_tier.network_mbps", m.network_mbps)?;
            non_negative("memory_tier.request_latency_ms", m.request_latency_ms)?;
            positive("memory_tier.requests_per_s", m.requests_per_s)?;
        }
        Ok(())
    }

    pub fn vm_type(&self, name: &str) -> Option<&VmType> {
        self.vm_types.iter().find(|v| v.name == name)
    }

    /// Memory a VM of this type offers to lambdas.
    pub fn usable_mb(&self, vm: &VmType) -> f64 {
        vm.memory_mb.saturating_sub(self.reserve_mb) as f64
    }

    /// The catalog as a cluster dilated in time by `d` sees it (DieCast: every resource runs `d`
    /// times slower, so `d` seconds of the cluster stand for one emulated second): VM network
    /// rates, the store's throughputs and request rate divided by `d`, its request latency
    /// multiplied by `d` (the memory tier's alike). Prices are per second of VM and per request, and stay: what a dilated
    /// job is charged for its VMs is `d` times the emulated charge (the evaluation divides it),
    /// per-request charges are the same. vCPUs and memory stay the type's (each agent still
    /// stands for one whole VM; its CPU quota is what is dilated). `d` must be finite and >= 1
    /// (1: this catalog).
    pub fn dilated(&self, d: f64) -> Result<Catalog, CatalogError> {
        if !(d.is_finite() && d >= 1.0) {
            return Err(CatalogError::Invalid {
                field: "dilation".into(),
                message: format!("{d} is not a number >= 1"),
            });
        }
        let mut c = self.clone();
        for v in &mut c.vm_types {
            v.network_mbps /= d;
        }
        let r = &mut c.remote_storage;
        r.write_mbps /= d;
        r.read_mbps /= d;
        r.request_latency_ms *= d;
        r.requests_per_s /= d;
        if let Some(a) = &mut r.aggregate_mbps {
            *a /= d;
        }
        if let Some(m) = &mut c.memory_tier {
            m.network_mbps /= d;
            m.request_latency_ms *= d;
            m.requests_per_s /= d;
        }
        c.check()?;
        Ok(c)
    }

    /// The catalog as YAML, in the format [`Catalog::from_yaml`] reads.
    pub fn to_yaml(&self) -> Result<String, CatalogError> {
        serde_saphyr::to_string(self).map_err(|e| CatalogError::Yaml(e.to_string()))
    }
}

fn positive(field: &str, x: f64) -> Result<(), CatalogError> {
    if x.is_finite() && x > 0.0 {
        Ok(())
    } else {
        Err(CatalogError::Invalid {
            field: field.to_owned(),
            message: format!("{x} is not a positive number"),
        })
    }
}

fn non_negative(field: &str, x: f64) -> Result<(), CatalogError> {
    if x.is_finite() && x >= 0.0 {
        Ok(())
    } else {
        Err(CatalogError::Invalid {
            field: field.to_owned(),
            message: format!("{x} is not a number >= 0"),
        })
    }
}

/// serde-saphyr renders a source snippet after the first line; the first line holds the message
/// with its line and column.
pub(crate) fn first_line(e: &serde_saphyr::Error) -> String {
    let rendered = e.to_string();
    let first = rendered.lines().next().unwrap_or("invalid YAML").trim();
    let first = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    match e.location().filter(|l| l.line() > 0) {
        Some(l) if !first.contains(&format!("line {}", l.line())) => {
            format!("line {} column {}: {first}", l.line(), l.column())
        }
        _ => first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_is_valid_and_round_trips() {
        let c = Catalog::default();
        c.check().unwrap();
        let yaml = c.to_yaml().unwrap();
        assert_eq!(Catalog::from_yaml(&yaml).unwrap(), c);
    }

    #[test]
    fn dilation_slows_links_and_store_and_keeps_prices_cpus_memory() {
        let c = Catalog::default();
        assert_eq!(c.dilated(1.0).unwrap(), c);
        let d = c.dilated(4.0).unwrap();
        for (a, b) in c.vm_types.iter().zip(&d.vm_types) {
            assert_eq!(
                (a.vcpus, a.memory_mb, a.usd_per_hour),
                (b.vcpus, b.memory_mb, b.usd_per_hour)
            );
            assert!((b.network_mbps * 4.0 - a.network_mbps).abs() < 1e-9);
        }
        let (r, s) = (&c.remote_storage, &d.remote_storage);
        assert!((s.write_mbps * 4.0 - r.write_mbps).abs() < 1e-9);
        assert!((s.read_mbps * 4.0 - r.read_mbps).abs() < 1e-9);
        assert!((s.request_latency_ms - 4.0 * r.request_latency_ms).abs() < 1e-9);
        assert!((s.requests_per_s * 4.0 - r.requests_per_s).abs() < 1e-9);
        assert_eq!(
            (s.put_usd_per_1k, s.get_usd_per_1k),
            (r.put_usd_per_1k, r.get_usd_per_1k)
        );
        for bad in [0.5, 0.0, -2.0, f64::NAN, f64::INFINITY] {
            assert!(c.dilated(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_memory_tier_is_read_checked_dilated_and_priced_by_capacity() {
        let yaml = "vm_types: [{name: a, vcpus: 2, memory_mb: 4096, network_mbps: 100, usd_per_hour: 0.1}]\n\
                    memory_tier: {usd_per_hour: 0.36, capacity_mb: 1024, network_mbps: 800, request_latency_ms: 0.5, requests_per_s: 50000}\n";
        let c = Catalog::from_yaml(yaml).unwrap();
        let m = c.memory_tier.clone().unwrap();
        assert_eq!(m.capacity_bytes(), 1024.0 * 1024.0 * 1024.0);
        // $0.36/h over 1 GiB: 1e-4 $/s for the node, per byte that over 2^30.
        assert!((m.usd_per_byte_second() * m.capacity_bytes() - 1e-4).abs() < 1e-15);
        assert_eq!(Catalog::from_yaml(&c.to_yaml().unwrap()).unwrap(), c);
        let d = c.dilated(4.0).unwrap().memory_tier.unwrap();
        assert!((d.network_mbps * 4.0 - m.network_mbps).abs() < 1e-9);
        assert!((d.request_latency_ms - 4.0 * m.request_latency_ms).abs() < 1e-9);
        assert!((d.requests_per_s * 4.0 - m.requests_per_s).abs() < 1e-9);
        assert_eq!(
            (d.usd_per_hour, d.capacity_mb),
            (m.usd_per_hour, m.capacity_mb)
        );
        // No tier unless the catalog names one; a bad one is refused by its field.
        assert!(Catalog::default().memory_tier.is_none());
        let tier = |usd: &str, cap: &str, net: &str| {
            format!(
                "vm_types: [{{name: a, vcpus: 2, memory_mb: 4096, network_mbps: 100, usd_per_hour: 0.1}}]\n\
                 memory_tier: {{usd_per_hour: {usd}, capacity_mb: {cap}, network_mbps: {net}, request_latency_ms: 0.5, requests_per_s: 50000}}\n"
            )
        };
        Catalog::from_yaml(&tier("0.36", "1024", "800")).unwrap();
        for (field, text) in [
            ("capacity_mb", tier("0.36", "0", "800")),
            ("network_mbps", tier("0.36", "1024", "-1")),
            ("usd_per_hour", tier(".nan", "1024", "800")),
        ] {
            let err = Catalog::from_yaml(&text).unwrap_err().to_string();
            assert!(err.contains(&format!("memory_tier.{field}")), "{err}");
        }
    }

    #[test]
    fn deploy_catalog_is_the_default() {
        let shipped = Catalog::from_yaml(include_str!("../../../deploy/catalog.yaml")).unwrap();
        assert_eq!(shipped, Catalog::default());
    }

    #[test]
    fn interfaces_example_parses() {
        let text = r#"
vm_types:
  - { name: m5.large,   vcpus: 2, memory_mb: 8192,  network_mbps: 750,  usd_per_hour: 0.107 }
  - { name: m5.xlarge,  vcpus: 4, memory_mb: 16384, network_mbps: 1250, usd_per_hour: 0.214 }
local_storage:  { usd_per_gb_month: 0.12 }
remote_storage: { write_mbps: 600, read_mbps: 400, request_latency_ms: 25,
                  put_usd_per_1k: 0.0055, get_usd_per_1k: 0.00044, usd_per_gb_month: 0.026,
                  requests_per_s: 3500 }
"#;
        let c = Catalog::from_yaml(text).unwrap();
        assert_eq!(c.vm_types.len(), 2);
        assert_eq!(c.reserve_mb, DEFAULT_RESERVE_MB);
        assert_eq!(c.vm_type("m5.xlarge").unwrap().memory_mb, 16384);
        assert_eq!(c.remote_storage.aggregate_mbps, None);
        assert!((c.vm_types[0].bandwidth_bps() - 93_750_000.0).abs() < 1e-6);
    }

    fn check(text: &str, expect: &[&str]) {
        let err = Catalog::from_yaml(text).unwrap_err().to_string();
        for e in expect {
            assert!(err.contains(e), "{err:?} should contain {e:?}");
        }
    }

    #[test]
    fn refusals() {
        check("vm_types: []\n", &["vm_types", "at least one"]);
        check(
            "vm_types:\n  - { name: a, vcpus: 2, memory_mb: 8192, network_mbps: 750, usd_per_hour: 0.1, gpu: 1 }\n",
            &["gpu", "line 2"],
        );
        check(
            "vm_types:\n  - { name: a, vcpus: 2, memory_mb: 8192, network_mbps: 750, usd_per_hour: 0.1 }\n  - { name: a, vcpus: 2, memory_mb: 8192, network_mbps: 750, usd_per_hour: 0.1 }\n",
            &["vm_types[1].name", "duplicate"],
        );
        check(
            "vm_types:\n  - { name: a, vcpus: 2, memory_mb: 8192, network_mbps: 0, usd_per_hour: 0.1 }\n",
            &["vm_types[0].network_mbps", "positive"],
        );
        check(
            "vm_types:\n  - { name: a, vcpus: 2, memory_mb: 400, network_mbps: 10, usd_per_hour: 0.1 }\n",
            &["vm_types[0].memory_mb", "reserve"],
        );
        check(
            "vm_types:\n  - { name: a, vcpus: 0, memory_mb: 8192, network_mbps: 10, usd_per_hour: 0.1 }\n",
            &["vcpus"],
        );
        check("vm_types:\n  - { name: a, vcpus: two }\n", &["line 2"]);
        check(
            "vm_types:\n  - { name: a, vcpus: 2, memory_mb: 8192, network_mbps: 10, usd_per_hour: 0.1 }\nremote_storage: { write_mbps: 1 }\n",
            &["read_mbps"],
        );
    }
}
