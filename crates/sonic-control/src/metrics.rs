//! A small counter registry rendered in the Prometheus text format (`GET /metrics`).
//!
//! Hand-rolled because the control plane needs one counter family and a few gauges; the `metrics`
//! crates would add a recorder, a global and their dependencies for that.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// Request counters, by method, route template and status.
#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), u64>>,
}

/// Values read at scrape time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gauges {
    pub dags: u64,
    pub agents_alive: u64,
    pub agents_dead: u64,
}

/// The content type of the text format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

impl Metrics {
    /// Counts one answered request. `route` must be a route template (or a fixed word), never the
    /// raw path: raw paths would grow one series per URL a client invents.
    pub fn count_request(&self, method: &str, route: &str, status: u16) {
        let mut map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        *map.entry((method.to_owned(), route.to_owned(), status))
            .or_default() += 1;
    }

    /// How many requests were counted for this method, route and status.
    pub fn requests(&self, method: &str, route: &str, status: u16) -> u64 {
        let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
        map.get(&(method.to_owned(), route.to_owned(), status))
            .copied()
            .unwrap_or(0)
    }

    /// The whole exposition.
    pub fn render(&self, gauges: Gauges) -> String {
        let mut out = String::new();
        out.push_str("# HELP sonic_http_requests_total HTTP requests answered, by method, route and status.\n");
        out.push_str("# TYPE sonic_http_requests_total counter\n");
        {
            let map = self.requests.lock().unwrap_or_else(|p| p.into_inner());
            for ((method, route, status), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "sonic_http_requests_total{{method=\"{}\",route=\"{}\",status=\"{status}\"}} {n}",
                    escape(method),
                    escape(route)
                );
            }
        }
        out.push_str("# HELP sonic_dags DAGs registered.\n# TYPE sonic_dags gauge\n");
        let _ = writeln!(out, "sonic_dags {}", gauges.dags);
        out.push_str(
            "# HELP sonic_agents Agents registered, by liveness.\n# TYPE sonic_agents gauge\n",
        );
        let _ = writeln!(
            out,
            "sonic_agents{{state=\"alive\"}} {}",
            gauges.agents_alive
        );
        let _ = writeln!(out, "sonic_agents{{state=\"dead\"}} {}", gauges.agents_dead);
        out
    }
}

/// Escapes a label value as the text format requires.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_and_gauges() {
        let m = Metrics::default();
        m.count_request("GET", "/v1/dags", 200);
        m.count_request("GET", "/v1/dags", 200);
        m.count_request("PUT", "/v1/dags", 400);
        m.count_request("GET", "a\"b\\c\nd", 404);
        assert_eq!(m.requests("GET", "/v1/dags", 200), 2);
        let text = m.render(Gauges {
            dags: 3,
            agents_alive: 1,
            agents_dead: 2,
        });
        assert!(text.contains(
            "sonic_http_requests_total{method=\"GET\",route=\"/v1/dags\",status=\"200\"} 2\n"
        ));
        assert!(text.contains(
            "sonic_http_requests_total{method=\"PUT\",route=\"/v1/dags\",status=\"400\"} 1\n"
        ));
        assert!(text.contains("route=\"a\\\"b\\\\c\\nd\""));
        assert!(text.contains("sonic_dags 3\n"));
        assert!(text.contains("sonic_agents{state=\"dead\"} 2\n"));
        // Every sample line is `name{labels} value` or `name value`.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let value = line.rsplit(' ').next().unwrap_or("");
            assert!(value.parse::<f64>().is_ok(), "bad sample line {line:?}");
        }
    }
}
