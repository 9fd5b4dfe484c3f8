//! Handles that frameworks on top of ferrocoll need:
//!
//! - [`Communicator::subgroup`]: a communicator over chosen ranks, made by
//!   those ranks alone (MPI_Comm_create_group), for frameworks whose groups
//!   are created only on their members (`torch.distributed.new_group` never
//!   calls the backend on a rank outside the group, so a collective
//!   [`Communicator::split`] over the parent cannot be used).
//! - [`Communicator::reserve_next_call`]: a call issued now and run later on
//!   another thread (a progress worker) keeps its place in the order of
//!   calls, as the `i*` forms do.

use std::collections::HashSet;

use super::{mix, Communicator};
use crate::error::{Error, Result};

impl Communicator {
    /// A handle for exactly one collective, which takes the sequence number
    /// this communicator would give its next call now. A caller that queues
    /// calls for a worker thread reserves in program order (every rank the
    /// same) and may then run them on any thread, in any order: each still
    /// meets the same call on every other rank. Use the handle for one
    /// collective only (a second would reuse the number and be refused as a
    /// mismatch by the peers).
    pub fn reserve_next_call(&self) -> Communicator {
        let mut handle = self.clone();
        handle.reserved_seq = Some(self.next_seq());
        handle
    }

    /// A communicator over `ranks` (this communicator's rank numbers; the
    /// new group's rank `i` is `ranks[i]`), made without talking to any
    /// rank: every member computes the same identifier from `tag` and the
    /// list, and non-members do nothing. Every member must call it with the
    /// same list and tag (as MPI_Comm_create_group); members that disagree
    /// never meet and their first call times out. Give two groups over the
    /// same ranks different tags.
    ///
    /// Fails when this rank is not in `ranks`, a rank repeats or is out of
    /// range.
    pub fn subgroup(&self, ranks: &[usize], tag: u64) -> Result<Communicator> {
        let size = self.size();
        let mut seen = HashSet::new();
        for &r in ranks {
            if r >= size {
                return Err(Error::invalid(format!(
                    "subgroup: rank {r} is out of range for a communicator of {size} ranks"
                )));
            }
            if !seen.insert(r) {
                return Err(Error::invalid(format!(
                    "subgroup: rank {r} appears twice in {ranks:?}"
                )));
            }
        }
        let Some(rank) = ranks.iter().position(|&r| r == self.rank()) else {
            return Err(Error::invalid(format!(
                "subgroup: this rank ({}) is not in {ranks:?}; only members create a subgroup",
                self.rank()
            )));
        };
        // Distinct from split's identifiers (another constant) and from any
        // other member list or tag.
        let id = ranks.iter().fold(
            mix(self.shared.id ^ 0x5bd1_e995_c2b2_ae35) ^ mix(tag),
            |h, &r| mix(h ^ r as u64),
        );
        Ok(self.child(ranks, rank, mix(id)))
    }
}

#[cfg(test)]
mod tests {
    use crate::{local, ReduceOp};

    #[test]
    fn members_alone_make_a_subgroup_and_it_reduces_over_them() {
        let out = local::run(5, |comm| {
            let members = [4usize, 1, 3];
            if !members.contains(&comm.rank()) {
                // Non-members carry on with the parent; a parent call after
                // the subgroup's calls must still match.
                assert!(comm.subgroup(&members, 7).is_err());
                let g = comm.subgroup(&[0, 2], 9)?;
                let mut v = [comm.rank() as u32];
                g.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
                return Ok((usize::MAX, v[0]));
            }
            let g = comm.subgroup(&members, 7)?;
            let mut v = [comm.rank() as u32 + 1];
            g.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            Ok::<_, crate::Error>((g.rank(), v[0]))
        })
        .unwrap();
        let got: Vec<(usize, u32)> = out.into_iter().map(|r| r.unwrap()).collect();
        assert_eq!(got[4], (0, 5 + 2 + 4));
        assert_eq!(got[1], (1, 11));
        assert_eq!(got[3], (2, 11));
        assert_eq!(got[0], (usize::MAX, 2));
        assert_eq!(got[2], (usize::MAX, 2));
    }

    #[test]
    fn calls_reserved_in_order_match_when_run_in_reverse() {
        let out = local::run(3, |comm| {
            let first = comm.reserve_next_call();
            let second = comm.reserve_next_call();
            // Run the second call first, on another thread.
            let late = std::thread::spawn(move || {
                let mut v = [10u64];
                second.all_reduce_in_place(&mut v, ReduceOp::Max)?;
                Ok::<_, crate::Error>(v[0])
            });
            let mut v = [comm.rank() as u64];
            first.all_reduce_in_place(&mut v, ReduceOp::Sum)?;
            Ok::<_, crate::Error>((v[0], late.join().unwrap()?))
        })
        .unwrap();
        for r in out {
            assert_eq!(r.unwrap(), (3, 10));
        }
    }

    #[test]
    fn bad_member_lists_are_refused() {
        let out = local::run(2, |comm| {
            let dup = comm.subgroup(&[0, 0, 1], 1).unwrap_err().to_string();
            let range = comm.subgroup(&[0, 1, 2], 1).unwrap_err().to_string();
            Ok::<_, crate::Error>((dup, range))
        })
        .unwrap();
        let (dup, range) = out[0].as_ref().unwrap();
        assert!(dup.contains("appears twice"), "{dup}");
        assert!(range.contains("out of range"), "{range}");
    }
}
