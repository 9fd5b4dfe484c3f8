//! How messages cross the network: the ideal mode's two ports per message,
//! the contention mode's chunks hop by hop through FIFO link queues, the
//! charging of traffic and busy time to links, and the check that no
//! message needs a failed link.

use super::events::Kind;
use super::options::Mode;
use super::state::Engine;

impl Engine<'_> {
    /// Fails naming the first failed link (in message order) that a
    /// message needs.
    pub(super) fn check_failed(&self, failed: &[bool]) -> Result<(), String> {
        for m in &self.msgs {
            let (a, b) = (self.phys[m.src as usize], m.to);
            let path = self.net.path(a as usize, b as usize);
            if let Some(&l) = path.links().iter().find(|&&l| failed[l as usize]) {
                return Err(format!(
                    "link {} has failed: rank {a} sends {} bytes to rank {b} across it",
                    self.net.link_name(l as usize),
                    m.bytes
                ));
            }
        }
        Ok(())
    }

    /// Charges `busy` seconds and `bytes` on link `link` from `start` to
    /// the group of engine rank `rank`.
    ///
    /// In the aggregated mode the charge goes to the link's representative
    /// and counts `weight` times in the timeline (the orbit's links are all
    /// busy alike).
    fn account(&mut self, rank: usize, link: usize, start: f64, busy: f64, bytes: u64) {
        let g = self.group_of[rank] as usize;
        let i = g * self.net.links.len() + self.queue(link as u32);
        self.link_bytes[i] += bytes;
        self.link_busy[i] += busy;
        let class = self.net.links[link].class;
        self.hist[g].add(class, start, start + busy, self.weight);
    }

    /// What a message pays on `link`, its sender's port, before its bytes.
    fn overhead_of(&self, link: u32) -> f64 {
        self.overhead.get(link as usize).copied().unwrap_or(0.0)
    }

    /// The queue of link `link` (itself, or its orbit's representative).
    pub(super) fn queue(&self, link: u32) -> usize {
        match &self.queue_of {
            None => link as usize,
            Some(q) => q[link as usize] as usize,
        }
    }

    /// Both ends of message `id` are posted: it starts moving at `now`.
    pub(super) fn start(&mut self, id: u32, now: f64) {
        let (src, to, bytes) = {
            let m = &self.msgs[id as usize];
            (m.src as usize, m.to as usize, m.bytes)
        };
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        if links.is_empty() {
            self.events.push(now, Kind::Delivered { msg: id });
            return;
        }
        match self.mode {
            Mode::Ideal => {
                let mut bw = f64::INFINITY;
                let mut lat = 0.0;
                for &l in links {
                    let link = &self.net.links[l as usize];
                    bw = bw.min(link.bw);
                    lat += link.lat;
                }
                let dur = bytes as f64 / bw;
                let (first, last) = (self.queue(links[0]), self.queue(links[links.len() - 1]));
                // The per-message overhead holds the sender's port first.
                let end_out = now.max(self.link_free[first]) + self.overhead_of(links[0]) + dur;
                self.link_free[first] = end_out;
                // A one-link path (neighbours on a ring) has one queue.
                let end_in = if last == first {
                    end_out
                } else {
                    now.max(self.link_free[last]) + dur
                };
                self.link_free[last] = end_in;
                let mid = end_out.max(end_in) - dur;
                for (k, &l) in links.iter().enumerate() {
                    let at = if k == 0 {
                        end_out - dur
                    } else if k + 1 == links.len() {
                        end_in - dur
                    } else {
                        mid
                    };
                    let busy = bytes as f64 / self.net.links[l as usize].bw;
                    self.account(src, l as usize, at, busy, bytes);
                }
                self.events
                    .push(end_out.max(end_in) + lat, Kind::Delivered { msg: id });
            }
            Mode::Contention => {
                let chunk = self.chunk_bytes;
                let nchunks = bytes.div_ceil(chunk).max(1);
                {
                    let m = &mut self.msgs[id as usize];
                    m.chunks_left = u32::try_from(nchunks).unwrap_or(u32::MAX);
                    m.done = now;
                }
                // The first link is the sender's own port: its queue only
                // ever receives this rank's messages, in the order they
                // become ready, so the chunks are laid out on it at once,
                // back to back. Their events on the next hop are released
                // one at a time (`release_chunk`), each when the previous
                // one gets there: the heap then holds a few events per
                // message in flight rather than one per chunk, which at
                // 16,384 ranks of 1,024 chunks each is what made every heap
                // operation a cache miss.
                let q0 = self.queue(links[0]);
                let bw = self.net.links[links[0] as usize].bw;
                // The per-message overhead holds the port before the bytes.
                let start = now.max(self.link_free[q0]) + self.overhead_of(links[0]);
                self.link_free[q0] = start + bytes as f64 / bw;
                self.account(src, links[0] as usize, start, bytes as f64 / bw, bytes);
                if links.len() == 1 {
                    // Its last chunk arrives last.
                    let lat = self.net.links[links[0] as usize].lat;
                    self.msgs[id as usize].chunks_left = 1;
                    self.arrive(id, start + bytes as f64 / bw + lat);
                } else if links.len() == 2 && self.alone_on(id, links[1]) {
                    self.lay_out(id, start, links[0], links[1]);
                } else {
                    self.release_chunk(id, 0, start);
                }
            }
        }
    }

    /// Whether message `id` will be the only traffic on `link`, its path's
    /// last, while it crosses it: `link` is its receiver's port
    /// ([`Network::is_receiver_port`]), which carries only what that rank
    /// (in the aggregated mode, that representative) receives, and the
    /// receiver's round has no other receive. Messages of the receiver's
    /// other rounds cannot overlap this one: the earlier ones arrived
    /// before the round began, the later ones cannot start before it ends.
    /// Off for several groups at once, which may share a physical rank.
    ///
    /// [`Network::is_receiver_port`]: crate::network::Network::is_receiver_port
    fn alone_on(&self, id: u32, link: u32) -> bool {
        if !self.lay_out || !self.net.is_receiver_port(link as usize) {
            return false;
        }
        let m = &self.msgs[id as usize];
        let k = self.round_of_recv(m.dst as usize, m.recv_slot);
        self.recvs(k).len() == 1
    }

    /// Message `id`, alone on `l1` ([`Engine::alone_on`]), is on its
    /// sender's port `l0` from `start`: computes every chunk's passage
    /// over `l1` at once instead of one event per chunk, with the very
    /// arithmetic [`Engine::release_chunk`] and [`Engine::hop`] do (so the
    /// times are the same to the bit), and schedules the delivery. The
    /// timeline gets the chunks' busy intervals joined where they abut.
    /// Per chunk this is arithmetic instead of a heap push and pop: what
    /// makes a 100,000-rank butterfly of 256 MB (4.5 G chunks) feasible.
    fn lay_out(&mut self, id: u32, start: f64, l0: u32, l1: u32) {
        let chunk = self.chunk_bytes;
        let (src, bytes) = {
            let m = &self.msgs[id as usize];
            (m.src as usize, m.bytes)
        };
        let nchunks = bytes.div_ceil(chunk).max(1);
        let (bw0, lat0) = (
            self.net.links[l0 as usize].bw,
            self.net.links[l0 as usize].lat,
        );
        let (bw1, lat1) = (
            self.net.links[l1 as usize].bw,
            self.net.links[l1 as usize].lat,
        );
        let q = self.queue(l1);
        let g = self.group_of[src] as usize;
        let i = g * self.net.links.len() + q;
        let class = self.net.links[l1 as usize].class;
        let mut free = self.link_free[q];
        let mut done = self.msgs[id as usize].done;
        let mut s = start;
        // The timeline interval being joined: [open, close].
        let (mut open, mut close) = (f64::NAN, f64::NAN);
        for c in 0..nchunks {
            let cb = chunk.min(bytes - (c * chunk).min(bytes));
            // On the port, as release_chunk lays it.
            let e = s + cb as f64 / bw0;
            let ready = (s + lat0).max(e + lat0 - cb as f64 / bw1);
            // On the receiver's port, as hop takes it.
            let st = ready.max(free);
            let busy = cb as f64 / bw1;
            let en = (st + busy).max(e + lat0);
            free = en;
            self.link_bytes[i] += cb;
            self.link_busy[i] += busy;
            if st == close {
                close = st + busy;
            } else {
                if open.is_finite() {
                    self.hist[g].add(class, open, close, self.weight);
                }
                (open, close) = (st, st + busy);
            }
            done = done.max(en + lat1);
            s = e;
        }
        self.hist[g].add(class, open, close, self.weight);
        self.link_free[q] = free;
        let m = &mut self.msgs[id as usize];
        m.chunks_left = 0;
        m.done = done;
        self.events.push(done, Kind::Delivered { msg: id });
    }

    /// Chunk `c` of message `id`, whose path has two links or more, is on
    /// the sender's port from `start` (laid out by [`Engine::start`]):
    /// schedules its arrival at the next hop. Nothing when the message has
    /// fewer chunks.
    pub(super) fn release_chunk(&mut self, id: u32, c: u32, start: f64) {
        let chunk = self.chunk_bytes;
        let m = &self.msgs[id as usize];
        let (src, to, bytes) = (m.src as usize, m.to as usize, m.bytes);
        let nchunks = bytes.div_ceil(chunk).max(1);
        if u64::from(c) >= nchunks {
            return;
        }
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        let link = &self.net.links[links[0] as usize];
        let (bw, lat) = (link.bw, link.lat);
        let c = u64::from(c);
        let cb = chunk.min(bytes - (c * chunk).min(bytes));
        let end = start + cb as f64 / bw;
        let next = self.ready_on(links[1], cb, start, end, lat);
        self.events.push(
            next,
            Kind::Hop {
                msg: id,
                hop: 1,
                chunk: c as u32,
                bytes: cb as u32,
                prev_end: end,
            },
        );
    }

    /// Chunk `chunk` (of `bytes`) of message `id` reaches hop `hop` at
    /// `now`.
    pub(super) fn hop(
        &mut self,
        id: u32,
        hop: usize,
        chunk: u32,
        bytes: u64,
        prev_end: f64,
        now: f64,
    ) {
        let src = self.msgs[id as usize].src as usize;
        let to = self.msgs[id as usize].to as usize;
        let path = self.net.path(self.phys[src] as usize, to);
        let links = path.links();
        let (prev, l) = (links[hop - 1] as usize, links[hop] as usize);
        let q = self.queue(links[hop]);
        let link = &self.net.links[l];
        let (bw, lat) = (link.bw, link.lat);
        let start = now.max(self.link_free[q]);
        // Cut-through: the tail cannot leave before it has come in.
        let end = (start + bytes as f64 / bw).max(prev_end + self.net.links[prev].lat);
        self.link_free[q] = end;
        self.account(src, l, start, bytes as f64 / bw, bytes);
        if hop + 1 == links.len() {
            self.arrive(id, end + lat);
        } else {
            let next = self.ready_on(links[hop + 1], bytes, start, end, lat);
            self.events.push(
                next,
                Kind::Hop {
                    msg: id,
                    hop: (hop + 1) as u8,
                    chunk,
                    bytes: bytes as u32,
                    prev_end: end,
                },
            );
        }
    }

    /// When a chunk of `bytes` that occupies a link over `[start, end]`,
    /// whose latency is `lat`, can start on the next link `next`: its head
    /// is there at `start + lat` (cut-through), but a faster next link only
    /// starts once it can send the whole chunk at its own rate without
    /// running out of data (the tail reaches it at `end + lat`). Otherwise a
    /// chunk trickling in from a slow link would hold a fast one (a leaf's
    /// aggregate uplink) for the slow link's time.
    fn ready_on(&self, next: u32, bytes: u64, start: f64, end: f64, lat: f64) -> f64 {
        let bw = self.net.links[next as usize].bw;
        (start + lat).max(end + lat - bytes as f64 / bw)
    }

    /// A chunk of message `id` has arrived at `t`.
    fn arrive(&mut self, id: u32, t: f64) {
        let m = &mut self.msgs[id as usize];
        m.done = m.done.max(t);
        m.chunks_left -= 1;
        if m.chunks_left == 0 {
            let done = m.done;
            self.events.push(done, Kind::Delivered { msg: id });
        }
    }
}
