//! The ring of a queue's outstanding requests, in posting order, and the part of
//! a `LeasedQp`'s work request ids it owns: the slot and its generation (the
//! bits above them, `LeasedQp`'s own, name the kind of queue and the owner).

use super::{DeviceRegion, Lease};
use crate::mr::MemoryRegion;

/// Bits 20..40 the generation, bits 0..20 the slot.
pub(super) const SLOT_BITS: u32 = 20;
/// The largest value of the slot and generation fields.
pub(super) const FIELD_MASK: u64 = (1 << SLOT_BITS) - 1;

/// One outstanding request: the verbs `wr_id` it was posted with, the caller's id
/// and the buffer.
struct Slot<T> {
    tag: u64,
    wr_id: u64,
    lease: T,
    /// Completions its queue had handed out when it was posted: its own comes later.
    after: u64,
}

/// What the ring holds for one request.
pub(super) enum Held {
    /// A lease, handed back by `complete`.
    Lease(Lease),
    /// One hold on a region shared by many requests; dropped by `complete`.
    Device(DeviceRegion),
}

impl Held {
    /// The region the request uses.
    pub(super) fn region(&self) -> &MemoryRegion {
        match self {
            Held::Lease(lease) => lease.region(),
            Held::Device(buffer) => buffer.region(),
        }
    }

    /// The lease to hand back, if it is one (a hold on a shared region is dropped).
    pub(super) fn into_lease(self) -> Option<Lease> {
        match self {
            Held::Lease(lease) => Some(lease),
            Held::Device(_) => None,
        }
    }
}

/// Slots of outstanding requests, in posting order (a ring).
pub(super) struct Ring<T = Held> {
    slots: Box<[Option<Slot<T>>]>,
    /// Oldest outstanding slot.
    head: usize,
    /// Outstanding requests.
    len: usize,
    /// Requests ever posted: the generation part of the next tag.
    posted: u64,
}

impl<T> Ring<T> {
    /// A ring of `capacity` slots (at least one), none outstanding.
    pub(super) fn new(capacity: usize) -> Self {
        Ring {
            slots: (0..capacity.max(1)).map(|_| None).collect(),
            head: 0,
            len: 0,
            posted: 0,
        }
    }

    /// Slots free for a post.
    pub(super) fn free(&self) -> usize {
        self.slots.len() - self.len
    }

    /// Requests outstanding.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Takes the oldest outstanding request out of the ring (it is released): the
    /// caller's `wr_id` and what it held, `None` for a slot found empty (`push`
    /// fills every slot it counts). Only called with a request outstanding (`len`
    /// above zero): [`Ring::count_through`] counts no more than there are.
    pub(super) fn pop_oldest(&mut self) -> Option<(u64, T)> {
        let item = self.slots[self.head].take();
        self.head = (self.head + 1) % self.slots.len();
        self.len -= 1;
        item.map(|s| (s.wr_id, s.lease))
    }

    fn next_slot(&self) -> usize {
        (self.head + self.len) % self.slots.len()
    }

    /// The verbs `wr_id` of the next post: `base` (lease bit, kind bit, owner tag),
    /// the generation and the slot.
    pub(super) fn next_tag(&self, base: u64) -> u64 {
        let generation = self.posted & FIELD_MASK;
        base | generation << SLOT_BITS | self.next_slot() as u64
    }

    /// Records a request posted with `tag` (from [`Ring::next_tag`]) in the next
    /// slot: the caller's `wr_id`, what it holds, and the completions its queue had
    /// handed out when it was posted (`after`).
    pub(super) fn push(&mut self, tag: u64, wr_id: u64, lease: T, after: u64) {
        let slot = self.next_slot();
        self.slots[slot] = Some(Slot {
            tag,
            wr_id,
            lease,
            after,
        });
        self.len += 1;
        self.posted += 1;
    }

    /// Number of slots from the head up to and including the one `tag` names, if
    /// that slot is outstanding and was posted with exactly this tag, before the
    /// completion numbered `seq` (where known) was handed out.
    pub(super) fn count_through(&self, tag: u64, seq: Option<u64>) -> Option<usize> {
        let slot = (tag & FIELD_MASK) as usize;
        let posted = self.slots.get(slot)?.as_ref()?;
        // The generation in the tag wraps: a completion kept long enough would name
        // a later request in its slot; its number tells it apart.
        if posted.tag != tag || seq.is_some_and(|seq| seq <= posted.after) {
            return None;
        }
        let n = (slot + self.slots.len() - self.head) % self.slots.len() + 1;
        (n <= self.len).then_some(n)
    }

    /// The caller's `wr_id` of the outstanding slot `tag` names (checked by
    /// `count_through`).
    pub(super) fn wr_id_of(&self, tag: u64) -> u64 {
        let slot = (tag & FIELD_MASK) as usize;
        self.slots[slot].as_ref().map_or(0, |s| s.wr_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LEASED_BIT, OWNER_SHIFT};

    #[test]
    fn ring_counts_through_wrapping_slots_with_exact_tags() {
        let mut r = Ring::<()>::new(4);
        let base = LEASED_BIT | 5 << OWNER_SHIFT;
        let mut tags = Vec::new();
        for i in 0..3 {
            let tag = r.next_tag(base);
            tags.push(tag);
            r.push(tag, i, (), 0);
        }
        assert_eq!(r.count_through(tags[0], None), Some(1));
        assert_eq!(r.count_through(tags[2], None), Some(3));
        assert_eq!(
            r.count_through(tags[2] ^ 1 << SLOT_BITS, None),
            None,
            "another generation"
        );
        assert_eq!(r.count_through(base | 3, None), None, "slot 3 is free");
        assert_eq!(r.count_through(base | 9, None), None, "out of range");
        // Release two, then wrap: slot 0 comes round again with a new generation.
        assert_eq!(r.pop_oldest(), Some((0, ())));
        assert_eq!(r.pop_oldest(), Some((1, ())));
        assert_eq!(r.len(), 1);
        let t3 = r.next_tag(base);
        r.push(t3, 3, (), 0);
        let t4 = r.next_tag(base);
        r.push(t4, 4, (), 0);
        assert_eq!(t4 & FIELD_MASK, 0, "slot 0 again");
        assert_ne!(t4, tags[0], "a new generation");
        assert_eq!(
            r.count_through(tags[0], None),
            None,
            "the stale tag of slot 0"
        );
        assert_eq!(r.count_through(t4, None), Some(3));
        assert_eq!(r.free(), 1);
    }

    #[test]
    fn a_completion_handed_out_before_the_post_is_not_its() {
        let mut r = Ring::<()>::new(4);
        let base = LEASED_BIT | 5 << OWNER_SHIFT;
        let tag = r.next_tag(base);
        // The queue had handed out 7 completions when this request was posted.
        r.push(tag, 1, (), 7);
        assert_eq!(
            r.count_through(tag, Some(7)),
            None,
            "kept from before the post"
        );
        assert_eq!(
            r.count_through(tag, Some(3)),
            None,
            "kept from before the post"
        );
        assert_eq!(r.count_through(tag, Some(8)), Some(1));
        assert_eq!(r.count_through(tag, None), Some(1), "an extended queue's");
    }
}
