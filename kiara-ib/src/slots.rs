//! The slabs of equal slots each session sends and receives its control messages in.
//!
//! A slab's slots change hands: a slot is either the program's, held as a [`Slot`]
//! (the one value that stands for it), or the device's, from the post that consumed
//! its `Slot` until the completion that hands out a new one. Bytes are only ever seen
//! through a slice over one slot the program holds, never over the whole slab, since
//! the device may be writing (receives) or reading (sends) the other slots meanwhile.

use crate::error::Result;
use rdma_safe::qp::{CanRecv, Rts};
use rdma_safe::{
    Access, MemoryRegion, ProtectionDomain, QueuePair, RecvWr, SendWr, SharedReceiveQueue,
};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Numbers slabs, so that a [`Slot`] of one slab is never taken for one of another.
static NEXT_SLAB: AtomicU32 = AtomicU32::new(1);

/// One slot of a [`SlotSlab`], held by the program: whoever holds it alone may see
/// the slot's bytes, and posting the slot to the device consumes it. Neither `Clone`
/// nor `Copy`: there is at most one per slot, and none while the slot is posted.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    slab: u32,
    index: u32,
}

impl Slot {
    /// The slot's number in its slab (what work request ids carry).
    pub(crate) fn index(&self) -> u32 {
        self.index
    }
}

/// Which slots of a slab the device holds: the bookkeeping behind [`Slot`], apart
/// from the memory so that it can be tested without a device.
#[derive(Debug)]
struct SlotBook {
    id: u32,
    posted: Vec<bool>,
}

impl SlotBook {
    /// A book of `n` slots, none posted, and the one [`Slot`] of each.
    fn new(n: u32) -> (SlotBook, Vec<Slot>) {
        let id = NEXT_SLAB.fetch_add(1, Ordering::Relaxed);
        let slots = (0..n).map(|index| Slot { slab: id, index }).collect();
        let book = SlotBook {
            id,
            posted: vec![false; n as usize],
        };
        (book, slots)
    }

    /// The index of `slot`, checked: it is a slot of this book, and not posted.
    /// (A `Slot` of this book is never posted: posting consumes it. The checks stop
    /// a slot of another slab from being taken for one of this.)
    fn index_of(&self, slot: &Slot) -> usize {
        assert_eq!(slot.slab, self.id, "a slot of another slab");
        let index = slot.index as usize;
        assert!(!self.posted[index], "slot {index} is posted");
        index
    }

    /// `slot` goes to the device: it is marked posted (before the post, so that no
    /// slice over it can be made while the device may hold it) and consumed.
    fn post(&mut self, slot: Slot) -> usize {
        let index = self.index_of(&slot);
        self.posted[index] = true;
        index
    }

    /// The device refused the post of slot `index` (`post` just marked it): the
    /// slot is the program's again, and its `Slot` comes back. Only for a post the
    /// verb refused, which hands the device nothing (its `bad_wr` is the request).
    fn refused(&mut self, index: usize) -> Slot {
        debug_assert!(self.posted[index], "slot {index} was not being posted");
        self.posted[index] = false;
        Slot {
            slab: self.id,
            index: index as u32,
        }
    }

    /// The device gave slot `index` back (its work request completed): its `Slot`,
    /// or an error naming the slot if the device did not hold it.
    fn complete(&mut self, index: u64) -> std::result::Result<Slot, String> {
        match usize::try_from(index)
            .ok()
            .and_then(|i| self.posted.get_mut(i))
        {
            Some(posted) if *posted => {
                *posted = false;
                Ok(Slot {
                    slab: self.id,
                    index: index as u32,
                })
            }
            _ => Err(format!(
                "completion for slot {index}, which is not posted (of {} slots)",
                self.posted.len()
            )),
        }
    }
}

/// A receive the verb failed to post: why, and the slot, which is the program's
/// again if the verb refused it outright; `None` if it may have queued the request
/// before failing ([`rdma_safe::Error::Queued`]): the slot is then the device's
/// until a completion hands it back.
pub(crate) struct Refused {
    /// The verb's error.
    pub(crate) error: rdma_safe::Error,
    /// The slot, to be posted again later, if the device cannot hold it.
    pub(crate) slot: Option<Slot>,
}

/// Equal slots in one region registered for local access only: a session's receive
/// slots (one per credit) or send slots. A slot's bytes are reachable only through
/// the [`Slot`] that stands for it (see the module documentation).
pub(crate) struct SlotSlab {
    mr: MemoryRegion,
    slot_size: usize,
    book: SlotBook,
}

impl SlotSlab {
    /// A slab of `slots` slots of `slot_size` bytes registered in `pd`, and the
    /// [`Slot`] of each (none is posted yet).
    pub(crate) fn new(
        pd: &Arc<ProtectionDomain>,
        slot_size: usize,
        slots: u32,
    ) -> Result<(SlotSlab, Vec<Slot>)> {
        // Local access only: no peer can write (or read) a slot, ever.
        let mr = MemoryRegion::new(pd, slot_size * slots as usize, Access::LOCAL_WRITE)?;
        let (book, handles) = SlotBook::new(slots);
        let slab = SlotSlab {
            mr,
            slot_size,
            book,
        };
        Ok((slab, handles))
    }

    /// Bytes per slot.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// The first `len` bytes of `slot` (at most the slot size).
    pub(crate) fn bytes<'a>(&'a self, slot: &'a Slot, len: usize) -> &'a [u8] {
        let start = self.span(slot, len);
        // SAFETY: `start..start + len` lies inside the region and inside this one slot
        // (`span`). Holding `slot` means the slot is not posted: no receive is writing
        // it and no send reading it, and none can be posted while the slice lives, as
        // posting consumes `slot`, which the slice borrows. No peer can write it (the
        // region is registered for local access only, and grants no windows). The
        // slice covers no other slot, which the device may be using meanwhile. The
        // address came from the region's pointer (exposed by `addr`), and the bytes
        // are initialised (zeroed at registration, or written by the device).
        unsafe { std::slice::from_raw_parts(self.ptr(start), len) }
    }

    /// The first `len` bytes of `slot` (at most the slot size), to be written.
    pub(crate) fn bytes_mut<'a>(&'a self, slot: &'a mut Slot, len: usize) -> &'a mut [u8] {
        let start = self.span(slot, len);
        // SAFETY: as in `bytes`; the slice is the only one over these bytes because it
        // borrows `slot`, the one `Slot` of this slot, exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(start), len) }
    }

    /// Posts a receive into `slot` (all of it), with work request id `wr_id`.
    ///
    /// # Safety
    /// The queue pair must stop using the slab before the slab is dropped: destroy it
    /// first (kiara never resets a session's queue pair: see `Conn`'s `DestroyQp`).
    pub(crate) unsafe fn post_recv(
        &mut self,
        qp: &QueuePair<impl CanRecv>,
        slot: Slot,
        wr_id: u64,
    ) -> rdma_safe::Result<()> {
        // SAFETY: `recv_wr` hands over a slot the program no longer holds; the
        // caller keeps the region registered until the queue pair no longer uses it.
        // A refused slot is dropped: the session closes, and its slab with it.
        self.recv_wr(slot, wr_id, false, |wr| unsafe { qp.post_recv(wr) })
            .map_err(|refused| refused.error)
    }

    /// Posts a receive into `slot` (all of it) to the shared receive queue `srq`,
    /// with work request id `wr_id`. If the verb refuses it, the slot comes back
    /// with the error (see [`Refused`]), to be posted again later.
    ///
    /// # Safety
    /// The slab must outlive the queue's use of it: destroy the queue (and every
    /// queue pair on it) first, or never free the slab.
    pub(crate) unsafe fn post_srq_recv(
        &mut self,
        srq: &SharedReceiveQueue,
        slot: Slot,
        wr_id: u64,
    ) -> std::result::Result<(), Refused> {
        #[cfg(feature = "fault-injection")]
        let refuse = crate::faults::shared_post_fails();
        #[cfg(not(feature = "fault-injection"))]
        let refuse = false;
        // SAFETY: as in `post_recv`, with the queue in place of the queue pair.
        self.recv_wr(slot, wr_id, refuse, |wr| unsafe { srq.post_recv(wr) })
    }

    /// A receive work request over all of `slot`, handed to `post`. The slot's
    /// `Slot` is consumed first, so no slice over it exists or can be made until
    /// its completion hands out a new one: the slot is the device's meanwhile. A
    /// request the verb refused was not taken (a receive is posted alone, so the
    /// refused one is the whole list): its slot comes back with the error. One the
    /// verb may have queued stays the device's.
    ///
    /// With `refused` (fault injection only), the request names the slot twice,
    /// one scatter entry more than kiara's queues take: the device's verb refuses
    /// it, as it refuses any request it cannot take. (Were it taken, the slot would
    /// just be posted: both entries lie in it, and a message fits the first.)
    fn recv_wr(
        &mut self,
        slot: Slot,
        wr_id: u64,
        refused: bool,
        post: impl FnOnce(&mut RecvWr<'_>) -> rdma_safe::Result<()>,
    ) -> std::result::Result<(), Refused> {
        let index = self.book.post(slot);
        let start = index * self.slot_size;
        let range = start..start + self.slot_size;
        let posted = self.mr.local(range.clone()).and_then(|sge| {
            if refused {
                let again = self.mr.local(range)?;
                post(&mut RecvWr::new(wr_id, &mut [sge, again]))
            } else {
                post(&mut RecvWr::new(wr_id, &mut [sge]))
            }
        });
        posted.map_err(|error| Refused {
            slot: (!error.is_queued()).then(|| self.book.refused(index)),
            error,
        })
    }

    /// Posts a signaled SEND of the first `len` bytes of `slot`, inline if `inline`,
    /// with work request id `wr_id`; with `invalidate`, a SEND_WITH_INV of that key.
    ///
    /// # Safety
    /// As for [`Self::post_recv`].
    pub(crate) unsafe fn post_send(
        &mut self,
        qp: &QueuePair<Rts>,
        slot: Slot,
        len: usize,
        wr_id: u64,
        inline: bool,
        invalidate: Option<u32>,
    ) -> rdma_safe::Result<()> {
        let start = self.span(&slot, len);
        self.book.post(slot);
        let mut sge = [self.mr.local(start..start + len)?];
        let wr = match invalidate {
            Some(rkey) => SendWr::send_with_invalidate(wr_id, &mut sge, rkey),
            None => SendWr::send(wr_id, &mut sge),
        };
        let mut wr = wr.signaled();
        if inline {
            wr = wr.inline();
        }
        // SAFETY: as in `post_recv`: the slot is the device's until its completion.
        unsafe { qp.post_send(&mut wr) }
    }

    /// The device is done with slot `index` (its work request completed): its `Slot`,
    /// or an error if the device did not hold it.
    pub(crate) fn complete(&mut self, index: u64) -> std::result::Result<Slot, String> {
        self.book.complete(index)
    }

    /// Where the first `len` bytes of `slot` start in the region (checked: the slot
    /// belongs here, is not posted, and `len` fits in it).
    fn span(&self, slot: &Slot, len: usize) -> usize {
        let index = self.book.index_of(slot);
        assert!(
            len <= self.slot_size,
            "{len} bytes do not fit in a slot of {}",
            self.slot_size
        );
        index * self.slot_size
    }

    /// `n` slots of a book of their own, for unit tests of what is done with slots.
    #[cfg(test)]
    pub(crate) fn loose_slots(n: u32) -> Vec<Slot> {
        SlotBook::new(n).1
    }

    /// A pointer `offset` bytes into the region.
    fn ptr(&self, offset: usize) -> *mut u8 {
        // The region's address is its buffer's pointer, exposed by `addr` (a cast).
        (self.mr.addr() as usize + offset) as *mut u8
    }
}

#[cfg(test)]
mod tests {
    use super::{Slot, SlotBook};

    #[test]
    fn each_slot_is_handed_out_once_and_cannot_be_borrowed_twice() {
        let (mut book, slots) = SlotBook::new(4);
        let indexes: Vec<u32> = slots.iter().map(Slot::index).collect();
        assert_eq!(indexes, [0, 1, 2, 3]);
        // While the program holds a slot, no completion can hand out a second one.
        for i in 0..4 {
            assert!(book.complete(i).is_err(), "slot {i} is not posted");
        }
        // Posting gives the slot to the device; its completion gives it back once.
        let mut slots = slots.into_iter();
        let first = slots.next().unwrap();
        assert_eq!(book.post(first), 0);
        let back = book.complete(0).unwrap();
        assert_eq!(back.index(), 0);
        let err = book.complete(0).unwrap_err();
        assert!(err.contains("slot 0, which is not posted"), "{err}");
        assert_eq!(book.index_of(&back), 0, "the returned slot may be borrowed");
    }

    #[test]
    fn a_refused_post_gives_the_slot_back_once() {
        let (mut book, mut slots) = SlotBook::new(2);
        let index = book.post(slots.pop().unwrap());
        let back = book.refused(index);
        assert_eq!(back.index(), 1);
        // The program holds it again: no completion can hand out a second one, and
        // it may be borrowed and posted again.
        assert!(book.complete(1).is_err(), "a refused slot is not posted");
        assert_eq!(book.index_of(&back), 1);
        assert_eq!(book.post(back), 1);
        assert_eq!(book.complete(1).unwrap().index(), 1);
    }

    #[test]
    fn completions_of_slots_that_do_not_exist_are_errors() {
        let (mut book, _slots) = SlotBook::new(2);
        for index in [2, u64::from(u32::MAX), 1 << 40] {
            assert!(book.complete(index).is_err(), "{index}");
        }
    }

    #[test]
    #[should_panic(expected = "slot 1 is posted")]
    fn a_posted_slot_cannot_be_borrowed() {
        let (mut book, mut slots) = SlotBook::new(2);
        book.post(slots.pop().unwrap());
        // Only this module can forge a second `Slot` of a posted slot; borrowing
        // through it is refused.
        let forged = Slot {
            slab: book.id,
            index: 1,
        };
        book.index_of(&forged);
    }

    #[test]
    #[should_panic(expected = "a slot of another slab")]
    fn a_slot_of_another_slab_cannot_be_borrowed() {
        let (mut a, mut a_slots) = SlotBook::new(1);
        let (b, mut b_slots) = SlotBook::new(1);
        a.post(a_slots.pop().unwrap());
        // Slot 0 of `b` is free, but slot 0 of `a` is posted: `b`'s slot must not
        // open it.
        let of_b = b_slots.pop().unwrap();
        assert_eq!(b.index_of(&of_b), 0);
        a.index_of(&of_b);
    }
}
