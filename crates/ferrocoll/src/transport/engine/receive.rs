//! The receive path of the core: frames arriving from a peer's stream,
//! acknowledgements, remote-data messages and their reading.

use std::io;
use std::sync::atomic::Ordering;

use super::core::Core;
use super::frames::{Carry, Outbound, RemoteRead, Rx, Target, Unexpected, CRC_PRESENT};
use super::verdict::{Verdict, MAX_CONTROL_BYTES};
use crate::error::Error;
use crate::transport::wire::{padded, Frame, FrameKind, HEADER_BYTES};
use crate::transport::Header;

/// Bytes an unexpected message's buffer starts with; it doubles as more
/// arrives ([`grow_for`]). Allocating and zeroing the whole message up
/// front cost a 2-rank 64 MiB TCP allgather, whose receives are mostly
/// posted a moment after the peer's message starts to arrive, a fresh
/// 32 MiB buffer per call (page faults and zeroing: 10 % of its samples,
/// bench/RESULTS.md, issue 20).
const UNEXPECTED_FIRST: usize = 64 << 10;

/// Grows an unexpected message's buffer (zeroed words) so that it holds
/// at least `need` bytes: to twice its size or more, never beyond the
/// message's `len` bytes (rounded up to whole words) unless it held more
/// already (a reused buffer).
fn grow_for(buf: &mut Vec<u64>, need: usize, len: usize) {
    let need = need.min(len).div_ceil(8);
    if buf.len() < need {
        buf.resize(need.max(2 * buf.len()).min(len.div_ceil(8)), 0);
    }
}

/// Payloads at least this long are read straight into place by
/// [`Core::receive_direct`] (and the frames after them, until a shorter one
/// comes); shorter ones through the channel's staging buffer, which takes
/// many small frames in one read.
const DIRECT_BYTES: usize = 64 << 10;

impl Core {
    /// Consumes a prefix of `bytes` arriving from `peer`; returns how many.
    pub(super) fn handle_bytes(&mut self, peer: usize, bytes: &[u8]) -> usize {
        let mut used = 0;
        loop {
            let rest = &bytes[used..];
            match &mut self.peers[peer].rx {
                Rx::Header { buf, have } => {
                    // Whole 8-byte words, unless this completes the header:
                    // the stream position stays a multiple of 8 between
                    // takes (a direct read may have left `have` anywhere).
                    let mut take = (HEADER_BYTES - *have).min(rest.len());
                    if *have + take < HEADER_BYTES {
                        take = ((*have + take) & !7).saturating_sub(*have);
                    }
                    if take == 0 {
                        return used;
                    }
                    buf[*have..*have + take].copy_from_slice(&rest[..take]);
                    *have += take;
                    used += take;
                    if *have < HEADER_BYTES {
                        return used;
                    }
                    if !self.start_frame(peer) {
                        return bytes.len();
                    }
                }
                Rx::Body {
                    frame,
                    target,
                    got,
                    crc,
                    carry,
                } => {
                    let total = padded(frame.len);
                    let left = total - *got;
                    let mut take = left.min(rest.len());
                    if take < left {
                        // Whole words of the stream (see the header's arm).
                        take = ((*got + take) & !7).saturating_sub(*got);
                    }
                    if take == 0 {
                        return used;
                    }
                    let payload_end = frame.len.min(*got + take);
                    if payload_end > *got {
                        let chunk = &rest[..payload_end - *got];
                        if frame.addr & CRC_PRESENT != 0 {
                            *crc = crc32c::crc32c_append(*crc, chunk);
                        }
                        match target {
                            Target::Posted { call, idx } => {
                                let c = self.calls[*call].as_mut().expect("live call");
                                // The start of a word held back: it goes
                                // with these bytes, which end on a word.
                                let joined;
                                let (at, chunk) = if carry.len > 0 {
                                    joined = [&carry.bytes[..carry.len], chunk].concat();
                                    let at = *got - carry.len;
                                    carry.len = 0;
                                    (at, &joined[..])
                                } else {
                                    (*got, chunk)
                                };
                                // SAFETY: the call is registered, so its sink
                                // is alive and its thread is blocked in
                                // exchange; we hold the mutex (see SinkPtr).
                                unsafe { (*c.sink.0).deliver(*idx, at, chunk) };
                            }
                            Target::Unexpected(buf) | Target::Control(buf) => {
                                grow_for(buf, payload_end, frame.len);
                                let dst: &mut [u8] = bytemuck::cast_slice_mut(buf);
                                dst[*got..payload_end].copy_from_slice(chunk);
                            }
                            Target::Discard => {}
                        }
                    }
                    *got += take;
                    used += take;
                    self.maybe_finish_body(peer);
                }
            }
        }
    }

    /// Lets `read` put the next bytes of `peer`'s stream straight where
    /// they belong, when that is plain memory: the payload of a frame whose
    /// receive stores it unchanged ([`crate::transport::Sink::destination`]),
    /// or that nobody has asked for yet (its unexpected buffer), and, while
    /// large frames arrive so, the padding and the next header. `read`
    /// (the channel's `recv_into`) fills a prefix of the slice it is given
    /// and returns its length. Returns `None` when the next bytes must go
    /// through [`Core::handle_bytes`] instead (they are reduced, dropped, or
    /// small frames' bytes, which a channel reads many at a time).
    ///
    /// This saves a TCP receiver the copy out of its staging buffer; the
    /// core stays sans-IO, since `read` is the driver's.
    pub(super) fn receive_direct(
        &mut self,
        peer: usize,
        read: &mut dyn FnMut(&mut [u8]) -> io::Result<usize>,
    ) -> io::Result<Option<usize>> {
        let p = &mut self.peers[peer];
        match &mut p.rx {
            Rx::Header { buf, have } => {
                if !p.direct {
                    return Ok(None);
                }
                let n = read(&mut buf[*have..])?;
                *have += n;
                if *have == HEADER_BYTES && !self.start_frame(peer) {
                    // A corrupt header: the peer is lost, and with it
                    // whatever follows on its stream.
                    self.peers[peer].direct = false;
                }
                Ok(Some(n))
            }
            Rx::Body {
                frame,
                target,
                got,
                crc,
                carry,
            } => {
                if carry.len > 0 {
                    // The held bytes go with the next ones, as deliveries.
                    return Ok(None);
                }
                if *got >= frame.len {
                    // Only the padding is left: read it here too after a
                    // direct payload, so that a staging read does not take
                    // the next frame's bytes along with it.
                    if !p.direct {
                        return Ok(None);
                    }
                    let mut pad = [0u8; 8];
                    let n = read(&mut pad[..padded(frame.len) - *got])?;
                    *got += n;
                    self.maybe_finish_body(peer);
                    return Ok(Some(n));
                }
                // A small frame's bytes are usually in the staging buffer
                // already, with those of the frames after it.
                if frame.len < DIRECT_BYTES && !p.direct {
                    return Ok(None);
                }
                let (start, end) = (*got, frame.len);
                let dst: &mut [u8] = match target {
                    Target::Posted { call, idx } => {
                        let c = self.calls[*call].as_mut().expect("live call");
                        // SAFETY: the call is registered, so its sink is
                        // alive and its thread is blocked in exchange; we
                        // hold the mutex (see SinkPtr). The slice is used
                        // only by `read` below, before this returns.
                        match unsafe { (*c.sink.0).destination(*idx, start, end - start) } {
                            Some(d) => d,
                            None => {
                                p.direct = false;
                                return Ok(None);
                            }
                        }
                    }
                    Target::Unexpected(buf) | Target::Control(buf) => {
                        grow_for(buf, start + DIRECT_BYTES, end);
                        let have = (buf.len() * 8).min(end);
                        &mut bytemuck::cast_slice_mut::<u64, u8>(buf)[start..have]
                    }
                    Target::Discard => {
                        p.direct = false;
                        return Ok(None);
                    }
                };
                let n = read(dst)?;
                if frame.addr & CRC_PRESENT != 0 {
                    *crc = crc32c::crc32c_append(*crc, &dst[..n]);
                }
                *got += n;
                p.direct = frame.len >= DIRECT_BYTES;
                self.maybe_finish_body(peer);
                Ok(Some(n))
            }
        }
    }

    /// How many more bytes of `peer`'s stream the frame being received
    /// needs before it completes (its header, or its body and padding):
    /// until then, fewer bytes let nothing finish.
    pub(super) fn bytes_awaited(&self, peer: usize) -> usize {
        match &self.peers[peer].rx {
            Rx::Header { have, .. } => HEADER_BYTES - have,
            Rx::Body { frame, got, .. } => padded(frame.len) - got,
        }
    }

    /// The header of the frame arriving from `peer` is complete: decodes
    /// it and handles it (a control frame) or sets up the receipt of its
    /// body. Returns false when the stream is corrupt (the peer is lost).
    fn start_frame(&mut self, peer: usize) -> bool {
        let Rx::Header { buf: header, .. } = self.peers[peer].rx else {
            unreachable!("called once a header is complete")
        };
        let frame = match Frame::decode(&header) {
            Ok(f) => f,
            Err(why) => {
                self.lose(peer, format!("corrupt stream from rank {peer}: {why}"));
                return false;
            }
        };
        if frame.kind == FrameKind::Probe {
            self.probe_arrived(peer, &frame.header);
            self.peers[peer].rx = Rx::next_header();
            return true;
        }
        if matches!(frame.kind, FrameKind::Verdict | FrameKind::Position) {
            if frame.len > MAX_CONTROL_BYTES {
                let why = format!("a control frame of {} bytes", frame.len);
                self.lose(peer, format!("corrupt stream from rank {peer}: {why}"));
                return false;
            }
            self.peers[peer].rx = Rx::Body {
                frame,
                target: Target::Control(vec![0u64; frame.len.div_ceil(8)]),
                got: 0,
                crc: 0,
                carry: Carry::default(),
            };
            self.maybe_finish_body(peer);
            return true;
        }
        if matches!(frame.kind, FrameKind::Lost | FrameKind::Bye) {
            if frame.kind == FrameKind::Bye {
                self.peers[peer].said_bye = true;
            } else {
                let culprit = frame.addr as usize;
                if culprit < self.peers.len() && culprit != self.me {
                    self.loss_reported(peer, culprit);
                }
            }
            self.peers[peer].rx = Rx::next_header();
            return true;
        }
        if frame.kind == FrameKind::Ack {
            self.acknowledged(peer, &frame);
            self.peers[peer].rx = Rx::next_header();
            return true;
        }
        if matches!(frame.kind, FrameKind::Remote | FrameKind::Shared) {
            self.remote_arrived(peer, frame);
            self.peers[peer].rx = Rx::next_header();
            return true;
        }
        if frame.kind == FrameKind::Abort {
            self.aborted.store(true, Ordering::SeqCst);
            self.fail_all(&Error::Aborted);
            self.peers[peer].rx = Rx::next_header();
            return true;
        }
        let target = match self.find_posted(peer, &frame.header) {
            Some((call, idx)) => {
                if self.accept(peer, call, idx, &frame.header, frame.len) {
                    Target::Posted { call, idx }
                } else {
                    Target::Discard
                }
            }
            // Sized for what has arrived, grown as more does
            // ([`grow_for`]): a receive posted while the message arrives
            // takes the rest straight ([`Core::take_arriving`]).
            None => Target::Unexpected(self.unexpected_buffer(frame.len, UNEXPECTED_FIRST)),
        };
        // A rendezvous sender waits until its message is
        // matched: it is, unless it waits to be (unexpected).
        if let Some(token) = rendezvous_token(&frame) {
            if !matches!(target, Target::Unexpected(_)) {
                self.queue_ack(peer, &frame.header, token);
            }
        }
        self.peers[peer].rx = Rx::Body {
            frame,
            target,
            got: 0,
            crc: 0,
            carry: Carry::default(),
        };
        self.maybe_finish_body(peer);
        true
    }

    /// A peer has read one of our remote-data messages.
    fn acknowledged(&mut self, peer: usize, frame: &Frame) {
        let key = frame.header.key();
        let unacked = &mut self.peers[peer].unacked;
        if let Some(at) = unacked.iter().position(|u| u.1 == key && u.2 == frame.addr) {
            let (call, _, _) = unacked.swap_remove(at);
            if let Some(c) = self.calls[call].as_mut() {
                c.pending_sends -= 1;
            }
        }
    }

    /// A remote-data message arrived: match it like a data message, but
    /// leave the bytes where they are until they are read.
    fn remote_arrived(&mut self, peer: usize, frame: Frame) {
        let posted = self.find_posted_in_order(peer, &frame.header);
        match posted {
            Some((call, idx)) => {
                if self.accept(peer, call, idx, &frame.header, frame.len) {
                    self.peers[peer].to_read.push_back(RemoteRead {
                        header: frame.header,
                        call,
                        idx,
                        addr: frame.addr,
                        len: frame.len,
                        region: (frame.kind == FrameKind::Shared).then_some(frame.region),
                    });
                } else {
                    // Rejected: release the sender anyway.
                    self.queue_ack(peer, &frame.header, frame.addr);
                }
            }
            None => {
                if self.late_mismatch(peer, &frame.header) {
                    // Release the sender of a message nobody will read.
                    self.queue_ack(peer, &frame.header, frame.addr);
                } else {
                    self.peers[peer].unexpected.push_back(Unexpected {
                        header: frame.header,
                        len: frame.len,
                        data: Vec::new(),
                        corrupt: false,
                        ack: None,
                        remote: Some((
                            frame.addr,
                            (frame.kind == FrameKind::Shared).then_some(frame.region),
                        )),
                    });
                }
            }
        }
    }

    /// Removes the first unexpected message under `key` (peers in order)
    /// and returns it with its sender, acknowledging a remote one so that
    /// its sender may reuse the buffer.
    pub(super) fn take_unexpected(&mut self, key: (u64, u64)) -> Option<(usize, Unexpected)> {
        for peer in 0..self.peers.len() {
            let Some(msg) = self.peers[peer].unexpected.take_first(key) else {
                continue;
            };
            if let Some((addr, _)) = msg.remote {
                self.queue_ack(peer, &msg.header, addr);
            }
            if let Some(token) = msg.ack {
                self.queue_ack(peer, &msg.header, token);
            }
            return Some((peer, msg));
        }
        None
    }

    pub(super) fn queue_ack(&mut self, peer: usize, header: &Header, addr: u64) {
        let ack = Frame {
            kind: FrameKind::Ack,
            header: *header,
            len: 0,
            addr,
            region: 0,
        };
        self.peers[peer]
            .sendq
            .push_back(Outbound::header_only(None, ack.encode().to_vec(), None));
    }

    /// Completes the frame being received from `peer` if all of it is in.
    fn maybe_finish_body(&mut self, peer: usize) {
        let Rx::Body { frame, got, .. } = &self.peers[peer].rx else {
            return;
        };
        if *got < padded(frame.len) {
            return;
        }
        let rx = std::mem::replace(&mut self.peers[peer].rx, Rx::next_header());
        let Rx::Body {
            frame, target, crc, ..
        } = rx
        else {
            unreachable!("matched above")
        };
        let corrupt = frame.addr & CRC_PRESENT != 0 && frame.addr as u32 != crc;
        if corrupt {
            if let Target::Posted { call, .. } = target {
                let c = self.calls[call].as_mut().expect("live call");
                c.error.get_or_insert(Error::Corrupted {
                    rank: self.me,
                    peer,
                    collective: c.header.sig.to_string(),
                });
            }
        }
        match target {
            Target::Posted { call, idx } => self.finish_recv(call, idx),
            Target::Unexpected(data) => {
                // A call may have posted the receive while the message was
                // arriving.
                let posted = self.find_posted_in_order(peer, &frame.header);
                let token = rendezvous_token(&frame);
                if let (Some(token), Some(_)) = (token, posted) {
                    self.queue_ack(peer, &frame.header, token);
                }
                match posted {
                    Some((call, idx)) => {
                        if self.accept(peer, call, idx, &frame.header, frame.len) {
                            let c = self.calls[call].as_mut().expect("live call");
                            if corrupt {
                                c.error.get_or_insert(Error::Corrupted {
                                    rank: self.me,
                                    peer,
                                    collective: c.header.sig.to_string(),
                                });
                            }
                            let bytes: &[u8] = bytemuck::cast_slice(&data);
                            // SAFETY: the call is registered (see SinkPtr).
                            unsafe { (*c.sink.0).deliver(idx, 0, &bytes[..frame.len]) };
                            self.finish_recv(call, idx);
                        }
                        self.recycle(data);
                    }
                    None => {
                        if !self.late_mismatch(peer, &frame.header) {
                            self.peers[peer].unexpected.push_back(Unexpected {
                                header: frame.header,
                                len: frame.len,
                                data,
                                remote: None,
                                corrupt,
                                ack: token,
                            });
                        } else if let Some(token) = token {
                            // Release the sender of a message nobody will take.
                            self.queue_ack(peer, &frame.header, token);
                        }
                    }
                }
            }
            Target::Control(data) => {
                let bytes: &[u8] = bytemuck::cast_slice(&data);
                let payload = &bytes[..frame.len];
                let handled = if frame.kind == FrameKind::Verdict {
                    Verdict::decode(frame.header, payload).map(|v| self.verdict_arrived(peer, v))
                } else {
                    String::from_utf8(payload.to_vec())
                        .map(|text| self.position_arrived(peer, &frame.header, text))
                        .map_err(|_| "a position that is not UTF-8".to_string())
                };
                if let Err(why) = handled {
                    self.lose(peer, format!("corrupt stream from rank {peer}: {why}"));
                }
            }
            Target::Discard => {}
        }
    }

    /// The next matched remote-data message from `peer` to read, which the
    /// driver reads (from `peer`'s memory or its shared buffer) and hands
    /// back with [`Core::deliver_remote`] and [`Core::remote_read_done`].
    pub(super) fn poll_remote_read(&mut self, peer: usize) -> Option<RemoteRead> {
        self.peers[peer].to_read.pop_front()
    }

    /// Whether the call of remote read `r` still waits for its bytes (a
    /// call that failed and left has nobody to deliver to).
    pub(super) fn remote_read_wanted(&self, r: &RemoteRead) -> bool {
        self.calls[r.call].is_some()
    }

    /// Where remote read `r`'s bytes are stored unchanged, if they are (a
    /// plain copy, not a reduction): the driver then reads the sender's
    /// memory straight into place, one copy instead of two (into a bounce
    /// buffer, then out of it).
    pub(super) fn remote_destination(&mut self, r: &RemoteRead) -> Option<&mut [u8]> {
        let c = self.calls[r.call].as_mut()?;
        // SAFETY: the call is registered, so its sink is alive and its
        // thread keeps it for the core (see `Core::add_call`); the slice
        // borrows `self`, so the driver holds it only while it holds the
        // core, under the engine's mutex.
        unsafe { (*c.sink.0).destination(r.idx, 0, r.len) }
    }

    /// Bytes `offset..offset + bytes.len()` of remote read `r`.
    pub(super) fn deliver_remote(&mut self, r: &RemoteRead, offset: usize, bytes: &[u8]) {
        if let Some(c) = self.calls[r.call].as_mut() {
            // SAFETY: the call is registered, so its sink is alive and its
            // thread keeps it for the core (see `Core::add_call`).
            unsafe { (*c.sink.0).deliver(r.idx, offset, bytes) };
        }
    }

    /// Remote read `r` from `peer` is over (all of it delivered, or its
    /// call gone): completes the receive and acknowledges it, so that the
    /// sender may reuse its buffer.
    pub(super) fn remote_read_done(&mut self, peer: usize, r: RemoteRead, delivered: bool) {
        if delivered {
            self.finish_recv(r.call, r.idx);
        }
        self.queue_ack(peer, &r.header, r.addr);
    }
}

/// The token a rendezvous data frame asks to have acknowledged once it is
/// matched (`TransportConfig::eager_bytes`); `None` for every other frame.
pub(super) fn rendezvous_token(frame: &Frame) -> Option<u64> {
    (frame.kind == FrameKind::Data && frame.region != 0).then_some(frame.region)
}
