//! The plan walk: the event loop, and every rank's progress through its
//! rounds (enter, reduce locally, post, complete), with the reductions of
//! received messages on the rank's reduction unit.

use super::events::Kind;
use super::state::Engine;
use super::trace::Trace;

impl Engine<'_> {
    /// Runs every rank's plan to its end: one [`Trace`] per group, or the
    /// deadlock that stopped a rank.
    pub(super) fn run(&mut self) -> Result<Vec<Trace>, String> {
        let n = self.first_round.len() - 1;
        for rank in 0..n {
            self.enter_round(rank, self.start_at[rank]);
        }
        let mut events = 0u64;
        while let Some(ev) = self.events.pop() {
            events += 1;
            let now = ev.time;
            match ev.kind {
                Kind::Post { rank } => self.post(rank as usize, now),
                Kind::Start { msg } => self.start(msg, now),
                Kind::Hop {
                    msg,
                    hop,
                    chunk,
                    bytes,
                    prev_end,
                } => {
                    if hop == 1 {
                        // The next chunk follows this one on the port.
                        self.release_chunk(msg, chunk + 1, prev_end);
                    }
                    self.hop(
                        msg,
                        usize::from(hop),
                        chunk,
                        u64::from(bytes),
                        prev_end,
                        now,
                    )
                }
                Kind::Delivered { msg } => {
                    let (src, dst, bytes, reduce) = {
                        let m = &self.msgs[msg as usize];
                        (m.src as usize, m.dst as usize, m.bytes, m.reduce)
                    };
                    self.msgs[msg as usize].done = now;
                    self.complete_one(src, now, msg);
                    let (gamma, unit) = (self.gamma[dst], self.phys[dst] as usize);
                    if reduce && gamma > 0.0 && bytes > 0 {
                        let start = now.max(self.compute_free[unit]);
                        let end = start + gamma * bytes as f64;
                        self.compute_free[unit] = end;
                        self.events.push(end, Kind::Reduced { msg });
                    } else {
                        self.complete_one(dst, now, msg);
                    }
                }
                Kind::Reduced { msg } => {
                    let dst = self.msgs[msg as usize].dst as usize;
                    self.complete_one(dst, now, msg);
                }
            }
        }
        let groups = self.group_first.len() - 1;
        if let Some(rank) = (0..n).find(|&r| self.cur[r] < self.first_round[r + 1]) {
            let g = self.group_of[rank] as usize;
            let prefix = if groups == 1 {
                String::new()
            } else {
                format!("group {g} ")
            };
            return Err(format!(
                "deadlock: {prefix}rank {} never finishes round {} of its plan",
                rank - self.group_first[g],
                self.cur[rank] - self.first_round[rank]
            ));
        }
        Ok(self.traces(events))
    }

    /// The message ids round `k` sends.
    pub(super) fn sends(&self, k: usize) -> std::ops::Range<u32> {
        self.rounds[k].sends..self.rounds[k + 1].sends
    }

    /// The slots in the receive id list of round `k`'s receives.
    pub(super) fn recvs(&self, k: usize) -> std::ops::Range<u32> {
        self.rounds[k].recvs..self.rounds[k + 1].recvs
    }

    /// The round of `rank` that sends message `id`.
    pub(super) fn round_of_send(&self, rank: usize, id: u32) -> usize {
        let rounds = &self.rounds[self.first_round[rank]..self.first_round[rank + 1]];
        self.first_round[rank] + rounds.partition_point(|r| r.sends <= id) - 1
    }

    /// The round of `rank` whose receive has slot `slot`.
    pub(super) fn round_of_recv(&self, rank: usize, slot: u32) -> usize {
        let rounds = &self.rounds[self.first_round[rank]..self.first_round[rank + 1]];
        self.first_round[rank] + rounds.partition_point(|r| r.recvs <= slot) - 1
    }

    /// Rank `rank` starts round `self.cur[rank]` (or finishes) at `now`.
    fn enter_round(&mut self, rank: usize, now: f64) {
        let k = self.cur[rank];
        if k == self.first_round[rank + 1] {
            self.finish[rank] = now;
            return;
        }
        self.rounds[k].entered = now;
        let local = self.rounds[k].local_reduce;
        let (gamma, unit) = (self.gamma[rank], self.phys[rank] as usize);
        let mut t = now;
        if local > 0 && gamma > 0.0 {
            t = now.max(self.compute_free[unit]) + gamma * local as f64;
            self.compute_free[unit] = t;
        }
        self.events.push(t, Kind::Post { rank: rank as u32 });
    }

    fn post(&mut self, rank: usize, now: f64) {
        let k = self.cur[rank];
        self.rounds[k].posted = now;
        let (sends, recvs) = (self.sends(k), self.recvs(k));
        self.pending[rank] = sends.len() as u32 + recvs.len() as u32;
        if self.pending[rank] == 0 {
            self.cur[rank] += 1;
            self.enter_round(rank, now);
            return;
        }
        for id in sends {
            self.post_end(id, now);
        }
        for i in recvs {
            let id = self.recv_ids[i as usize];
            self.post_end(id, now);
        }
    }

    fn post_end(&mut self, id: u32, now: f64) {
        let m = &mut self.msgs[id as usize];
        m.posted += 1;
        if m.posted == 2 {
            m.started = now;
            self.events.push(now, Kind::Start { msg: id });
        }
    }

    /// Message `msg`, one of `rank`'s outstanding messages of the current
    /// round, is done.
    fn complete_one(&mut self, rank: usize, now: f64, msg: u32) {
        self.pending[rank] -= 1;
        if self.pending[rank] == 0 {
            self.rounds[self.cur[rank]].last = msg;
            self.cur[rank] += 1;
            self.enter_round(rank, now);
        }
    }
}
