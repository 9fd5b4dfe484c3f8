//! What a finished run reports: every group's [`Trace`] (finish time,
//! per-link traffic and busy time, timeline) and its [`CriticalPath`].

use super::state::Engine;
use super::trace::{CriticalPath, Trace};

impl Engine<'_> {
    /// The traces of every group once the event queue is empty; `events`
    /// is the whole run's count.
    pub(super) fn traces(&self, events: u64) -> Vec<Trace> {
        let groups = self.group_first.len() - 1;
        let links = self.net.links.len();
        let sizes: Vec<usize> = (0..self.net.classes.len())
            .map(|c| self.net.class_size(c))
            .collect();
        (0..groups)
            .map(|g| {
                let ranks = self.group_first[g]..self.group_first[g + 1];
                let time_s = self.finish[ranks].iter().copied().fold(0.0, f64::max);
                // Every link reports its queue's figures (in the
                // aggregated mode, its orbit representative's).
                let per_link = |v: &[u64]| -> Vec<u64> {
                    (0..links)
                        .map(|l| v[g * links + self.queue(l as u32)])
                        .collect()
                };
                let busy = (0..links)
                    .map(|l| self.link_busy[g * links + self.queue(l as u32)])
                    .collect();
                Trace {
                    time_s,
                    link_bytes: per_link(&self.link_bytes),
                    link_busy: busy,
                    events,
                    timeline: self.hist[g].finish(time_s, &sizes),
                    critical_path: self.critical_path(g),
                }
            })
            .collect()
    }

    /// The critical path of group `g` (see [`CriticalPath`]).
    fn critical_path(&self, g: usize) -> CriticalPath {
        let (lo, hi) = (self.group_first[g], self.group_first[g + 1]);
        let mut cp = CriticalPath::default();
        // The first of the ranks that finished last.
        let Some(mut x) = (lo..hi).reduce(|a, b| {
            if self.finish[b] > self.finish[a] {
                b
            } else {
                a
            }
        }) else {
            return cp;
        };
        cp.end_rank = (x - lo) as u64;
        let mut seen = vec![false; hi - lo];
        // Invariant: round k - 1 of rank x ended at `end`.
        let mut k = self.first_round[x + 1];
        let mut end = self.finish[x];
        loop {
            if !std::mem::replace(&mut seen[x - lo], true) {
                cp.ranks += 1;
            }
            if k == self.first_round[x] {
                cp.start_s = end;
                return cp;
            }
            let round = &self.rounds[k - 1];
            // Where the round's communication began, and the round (of x,
            // or of the peer x waited for) whose local part came before.
            let (mut from, mut at) = (round.posted, (x, k - 1));
            if round.last != u32::MAX {
                let id = round.last;
                let m = &self.msgs[id as usize];
                cp.messages += 1;
                // A received reduction finishes after the arrival.
                cp.compute_s += end - m.done;
                let path = self
                    .net
                    .path(self.phys[m.src as usize] as usize, m.to as usize);
                let (mut lat, mut bw) = (0.0f64, f64::INFINITY);
                for &l in path.links() {
                    lat += self.net.links[l as usize].lat;
                    bw = bw.min(self.net.links[l as usize].bw);
                }
                // The round moves max(sent, received) through this rank's
                // port, as the alpha-beta model charges it: that much is
                // transmission, even when this message waited behind the
                // rank's own others.
                let sent: u64 = self.sends(k - 1).map(|i| self.msgs[i as usize].bytes).sum();
                let received: u64 = self
                    .recvs(k - 1)
                    .map(|i| self.msgs[self.recv_ids[i as usize] as usize].bytes)
                    .sum();
                let net = m.done - m.started;
                let lat = lat.min(net);
                let tx = (sent.max(received) as f64 / bw).min(net - lat);
                cp.latency_s += lat;
                cp.transmission_s += tx;
                cp.queueing_s += net - lat - tx;
                let (peer, peer_round) = if x == m.src as usize {
                    let r = self.round_of_recv(m.dst as usize, m.recv_slot);
                    (m.dst as usize, r)
                } else {
                    (m.src as usize, self.round_of_send(m.src as usize, id))
                };
                // The message started when its later end posted.
                from = m.started;
                if self.rounds[peer_round].posted > round.posted {
                    at = (peer, peer_round);
                }
            }
            let entered = self.rounds[at.1].entered;
            cp.compute_s += from - entered;
            end = entered;
            x = at.0;
            k = at.1;
        }
    }
}
