//! The network as a fluid model: links with capacities (bytes/s), flows that cross up to three
//! links, and max-min fair rates (progressive filling), recomputed whenever the set of active
//! flows changes. A flow's rate is constant between two such changes, so the simulator can jump
//! from one completion to the next.

/// Most links one flow crosses: NIC egress + store write connection + store aggregate, or the
/// reverse for a download, or egress + ingress for a direct copy, or egress + the memory tier's
/// node (the reverse for a download).
pub(crate) const MAX_HOPS: usize = 3;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Flow<T> {
    pub remaining: f64,
    pub rate: f64,
    links: [u32; MAX_HOPS],
    hops: u8,
    pub tag: T,
}

impl<T> Flow<T> {
    pub fn links(&self) -> &[u32] {
        &self.links[..self.hops as usize]
    }
}

/// Links and the active flows over them.
#[derive(Debug)]
pub(crate) struct Net<T> {
    caps: Vec<f64>,
    /// Active flows by id; `None` once finished (ids are never reused, so order is stable).
    flows: Vec<Option<Flow<T>>>,
    active: Vec<usize>,
    dirty: bool,
    // Scratch for the rate computation.
    cap_left: Vec<f64>,
    unfrozen: Vec<u32>,
    on_link: Vec<Vec<usize>>,
    touched: Vec<usize>,
    frozen: Vec<bool>,
}

impl<T: Copy> Net<T> {
    pub fn new(caps: Vec<f64>) -> Self {
        let n = caps.len();
        Net {
            caps,
            flows: Vec::new(),
            active: Vec::new(),
            dirty: false,
            cap_left: vec![0.0; n],
            unfrozen: vec![0; n],
            on_link: vec![Vec::new(); n],
            touched: Vec::new(),
            frozen: Vec::new(),
        }
    }

    /// Starts a flow of `bytes` over `links` now; returns its id.
    pub fn start(&mut self, bytes: f64, links: &[u32], tag: T) -> usize {
        let mut l = [0u32; MAX_HOPS];
        l[..links.len()].copy_from_slice(links);
        let id = self.flows.len();
        self.flows.push(Some(Flow {
            remaining: bytes.max(0.0),
            rate: 0.0,
            links: l,
            hops: links.len() as u8,
            tag,
        }));
        self.active.push(id);
        self.dirty = true;
        id
    }

    pub fn started(&self) -> usize {
        self.flows.len()
    }

    /// Recomputes rates if flows came or went since the last time.
    pub fn update_rates(&mut self) {
        if !self.dirty {
            return;
        }
        self.dirty = false;
        for &l in &self.touched {
            self.on_link[l].clear();
        }
        self.touched.clear();
        self.frozen.clear();
        self.frozen.resize(self.flows.len(), true);
        for &id in &self.active {
            let Some(f) = &self.flows[id] else { continue };
            self.frozen[id] = false;
            for &l in f.links() {
                let l = l as usize;
                if self.on_link[l].is_empty() {
                    self.touched.push(l);
                    self.cap_left[l] = self.caps[l];
                    self.unfrozen[l] = 0;
                }
                self.on_link[l].push(id);
                self.unfrozen[l] += 1;
            }
        }
        // Progressive filling: the link offering the least fair share fixes the rate of every
        // flow still unfixed on it; they consume that share on their other links too.
        loop {
            let mut best: Option<(usize, f64)> = None;
            for &l in &self.touched {
                if self.unfrozen[l] == 0 {
                    continue;
                }
                let share = self.cap_left[l].max(0.0) / f64::from(self.unfrozen[l]);
                if best.is_none_or(|(_, s)| share < s) {
                    best = Some((l, share));
                }
            }
            let Some((l, share)) = best else { break };
            for i in 0..self.on_link[l].len() {
                let id = self.on_link[l][i];
                if self.frozen[id] {
                    continue;
                }
                self.frozen[id] = true;
                if let Some(f) = self.flows[id].as_mut() {
                    f.rate = share;
                    for &l2 in f.links() {
                        let l2 = l2 as usize;
                        self.cap_left[l2] -= share;
                        self.unfrozen[l2] -= 1;
                    }
                }
            }
        }
    }

    /// When the first active flow finishes at the current rates, from `now`.
    pub fn next_finish(&self, now: f64) -> Option<f64> {
        self.active
            .iter()
            .filter_map(|&id| self.flows[id].as_ref())
            .map(|f| finish_time(now, f.remaining, f.rate))
            .min_by(f64::total_cmp)
    }

    /// Moves every active flow forward by `dt`; returns the ids (ascending) of those whose
    /// finish time is at most `until` (they are removed, their remaining bytes set to 0).
    pub fn advance(&mut self, now: f64, until: f64) -> Vec<(usize, T)> {
        let dt = until - now;
        let mut done = Vec::new();
        for &id in &self.active {
            if let Some(f) = self.flows[id].as_mut() {
                if finish_time(now, f.remaining, f.rate) <= until + time_tolerance(until) {
                    f.remaining = 0.0;
                    done.push((id, f.tag));
                } else {
                    f.remaining -= f.rate * dt;
                }
            }
        }
        if !done.is_empty() {
            for (id, _) in &done {
                self.flows[*id] = None;
            }
            self.active.retain(|&id| self.flows[id].is_some());
            self.dirty = true;
        }
        done
    }

    #[cfg(test)]
    fn rate(&self, id: usize) -> f64 {
        self.flows[id].as_ref().map_or(0.0, |f| f.rate)
    }
}

/// When a task of `remaining` work at `rate` per second finishes, from `now`.
pub(crate) fn finish_time(now: f64, remaining: f64, rate: f64) -> f64 {
    if remaining <= 0.0 {
        now
    } else if rate > 0.0 {
        now + remaining / rate
    } else {
        f64::INFINITY
    }
}

/// Two finish times this close are the same instant (float noise of `now + x / r`).
pub(crate) fn time_tolerance(t: f64) -> f64 {
    1e-9 * t.abs().max(1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * a.abs().max(b.abs()).max(1.0)
    }

    #[test]
    fn one_link_is_shared_equally() {
        let mut n: Net<u8> = Net::new(vec![100.0]);
        let a = n.start(100.0, &[0], 0);
        let b = n.start(300.0, &[0], 1);
        n.update_rates();
        assert!(close(n.rate(a), 50.0) && close(n.rate(b), 50.0));
        // a finishes at t = 2; then b has 200 left alone at 100/s: t = 4.
        let t = n.next_finish(0.0).unwrap();
        assert!(close(t, 2.0));
        let done = n.advance(0.0, t);
        assert_eq!(done, vec![(a, 0)]);
        n.update_rates();
        assert!(close(n.rate(b), 100.0));
        assert!(close(n.next_finish(t).unwrap(), 4.0));
    }

    #[test]
    fn max_min_gives_leftovers_to_unconstrained_flows() {
        // Link 0 cap 10 shared by x (also on link 1, cap 1) and y: x gets 1, y gets 9.
        let mut n: Net<u8> = Net::new(vec![10.0, 1.0]);
        let x = n.start(1e9, &[0, 1], 0);
        let y = n.start(1e9, &[0], 1);
        n.update_rates();
        assert!(close(n.rate(x), 1.0), "{}", n.rate(x));
        assert!(close(n.rate(y), 9.0), "{}", n.rate(y));
    }

    #[test]
    fn broadcast_out_of_one_nic_matches_the_model() {
        // Sender egress 90 (link 0), three receivers' ingress 50 each: each copy gets 30.
        let mut n: Net<u8> = Net::new(vec![90.0, 50.0, 50.0, 50.0]);
        let ids: Vec<usize> = (1..4).map(|r| n.start(60.0, &[0, r], 0)).collect();
        n.update_rates();
        for id in ids {
            assert!(close(n.rate(id), 30.0));
        }
        // max(F * n_r / BW_s, F / BW_r) = max(2, 1.2) = 2.
        assert!(close(n.next_finish(0.0).unwrap(), 2.0));
    }
}
