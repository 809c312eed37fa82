//! The shared receive queue (`Config::shared_receive_slots`): one pool of receive
//! slots that every session a server accepts receives its control messages into,
//! instead of a slab of `credits` slots per session.
//!
//! What changes with it, and why it stays sound:
//! - **Credits** keep their meaning on the wire: a peer still holds `credits` per
//!   session, and the session core still counts them per slot number. Those slot
//!   numbers are now the session's own tokens (`Tokens`), not slots of memory: a
//!   receive completion takes a token, and a token the core "reposts" is free
//!   again. A peer that sends beyond its credits finds no token and is cut off,
//!   as a peer whose own receive queue is full would have been refused by the
//!   device.
//! - **Memory** is the pool's: a receive completion names a slot of the pool; its
//!   bytes are decoded and copied out at once and the slot goes straight back to
//!   the shared queue. When more messages arrive at once than the queue holds, the
//!   device answers RNR and the sender retries (kiara's queue pairs retry RNR
//!   forever), which costs time, never a message.
//! - **Every slot comes back.** A slot completes on the pool's own CQ, whichever
//!   session consumed it, and the completion is routed to that session by queue
//!   pair number ([`routes`]): successfully, or with an error if the message did
//!   not fit (a slot is shorter than the path MTU, see `Engine::establish`, so a
//!   SEND too long for it fails on its first packet, before the peer can leave it
//!   half written). A closing session gives back what was routed to it; what comes
//!   for its queue pair after that, or for no session at all, goes back at once.
//! - **One CQ sized to the pool.** A peer that ignores its credits can take many
//!   slots before its session sees the first one; the pool's CQ has room for a
//!   completion of every slot, so none is lost to an overflow, and each session's
//!   own CQ holds its sends only.
//! - **A refused repost loses nothing.** Should the device refuse to take a slot
//!   back (`ibv_post_srq_recv` failing, as it does only on a device in trouble),
//!   the slot is kept and posted again before the next one, and by the poller's
//!   sweep should every slot be refused (no receive would come to do it);
//!   meanwhile the queue is short, which senders see as RNR sooner. The sweep logs
//!   the first refusal (outside the receive path's locks). The session whose
//!   message it was goes on: the fault is not its peer's. A post the verb may
//!   have queued before failing leaves its slot to the device.
//! - **Nothing is freed under the device.** The pool (queue and slab) lives as long
//!   as any session holds it, and destroys its queue before its slab goes; the
//!   slab's region is deregistered before its memory is freed in any case.
//!
//! What is not covered: on Soft-RoCE in Linux 6.1, a client that announces one MTU
//! but sends with a smaller one (its own queue pair's path MTU) can start a SEND
//! that fits a slot and never finish it; when that session closes, rxe drops the
//! half-filled receive and its slot is lost, one per such connection (hardware
//! checks packet lengths, and newer rxe does). Likewise, drivers that purge a
//! destroyed queue pair's completions from the CQs it used (mlx4, mlx5) would
//! lose the slots of receives it had completed but kiara had not polled; the cure is the
//! IB spec's drain (error state, `LAST_WQE_REACHED`, poll, then destroy), which
//! kiara does not do yet. Give a shared queue to trusted clients there.

use crate::engine::Log;
use crate::error::Result;
use crate::slots::{Refused, Slot, SlotSlab};
use parking_lot::Mutex;
use rdma_safe::{
    CompletionChannel, CompletionQueue, Context, ProtectionDomain, SharedReceiveQueue,
};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

mod routes;

pub(crate) use routes::Mailbox;

/// Completions the shared receive CQ has room for beyond one per slot.
const CQ_SPARE: u32 = 16;

/// The pool: a shared receive queue, the slab its receives land in, and the
/// completion queue they complete on ([`routes`]).
pub(crate) struct SharedRecv {
    /// Declared first: destroyed before the slab is deregistered and freed.
    srq: Arc<SharedReceiveQueue>,
    slab: Mutex<Slab>,
    /// Every receive into the pool completes here, whichever queue pair took it:
    /// room for one completion per slot, so none is lost to an overflow.
    cq: Arc<CompletionQueue>,
    /// Held while reaping `cq` (with its scratch space): completions are routed in
    /// the order they were polled.
    reaping: Mutex<routes::Reaping>,
    routes: Mutex<routes::Routes>,
    /// `cq`'s notification is armed and its event not yet read.
    armed: AtomicBool,
    /// A reaper that found the reap lock taken wants `cq` armed.
    want_arm: AtomicBool,
    slot_size: usize,
    slots: u32,
    /// Slots posted to the queue or held by the device.
    posted: AtomicU32,
    /// Receives completed so far (each gave its slot back).
    received: AtomicU64,
    /// Slots waiting in the slab's `refused` list (read without its lock).
    refused_now: AtomicU32,
    /// The first refused repost's error, for the sweep to log ([`SharedRecv::look`]).
    first_refusal: OnceLock<String>,
    /// The first refusal was logged.
    told: AtomicBool,
    /// The transport's logger.
    log: Log,
}

/// The slab, and the slots whose repost the device refused: each is posted again
/// with the next slot that comes back.
struct Slab {
    slots: SlotSlab,
    /// At most every slot: room for all of them is made up front.
    refused: Vec<Slot>,
}

impl SharedRecv {
    /// A queue of `slots` receives of `slot_size` bytes each, all posted, whose
    /// completion queue reports to `channel`; a refused repost is told to `log`.
    pub(crate) fn new(
        ctx: &Arc<Context>,
        channel: &Arc<CompletionChannel>,
        pd: &Arc<ProtectionDomain>,
        (slots, slot_size): (u32, usize),
        log: Log,
    ) -> Result<Arc<SharedRecv>> {
        let srq = SharedReceiveQueue::new(pd, slots, 1)?;
        let (slab, handles) = SlotSlab::new(pd, slot_size, slots)?;
        let cq = CompletionQueue::with_channel(ctx, slots + CQ_SPARE, channel, 0)?;
        let pool = SharedRecv {
            srq,
            slab: Mutex::new(Slab {
                slots: slab,
                refused: Vec::with_capacity(slots as usize),
            }),
            cq,
            reaping: Mutex::new(routes::Reaping::new()),
            routes: Mutex::new(routes::Routes::default()),
            armed: AtomicBool::new(false),
            want_arm: AtomicBool::new(false),
            slot_size,
            slots,
            posted: AtomicU32::new(0),
            received: AtomicU64::new(0),
            refused_now: AtomicU32::new(0),
            first_refusal: OnceLock::new(),
            told: AtomicBool::new(false),
            log,
        };
        for slot in handles {
            // A queue that cannot be filled at the start is an error of its own.
            pool.post(&mut pool.slab.lock().slots, slot)
                .map_err(|refused| refused.error)?;
        }
        Ok(Arc::new(pool))
    }

    /// The queue, for the queue pairs created on it.
    pub(crate) fn srq(&self) -> &Arc<SharedReceiveQueue> {
        &self.srq
    }

    /// The completion queue of every receive on the queue, for the queue pairs.
    pub(crate) fn cq(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// Bytes per slot: the largest control message a session on the pool receives.
    pub(crate) fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Slots in the pool.
    pub(crate) fn slots(&self) -> u32 {
        self.slots
    }

    /// Slots handed to the device now (all of them when no message is being
    /// handled; see `SharedReceives::posted`).
    pub(crate) fn posted(&self) -> u32 {
        self.posted.load(Ordering::Acquire)
    }

    /// Slots the device refused back, waiting to be posted again.
    pub(crate) fn refused(&self) -> u32 {
        self.refused_now.load(Ordering::Acquire)
    }

    /// Receives completed so far, successfully or not: one for every SEND a peer
    /// saw succeed, once each has been handled.
    pub(crate) fn received(&self) -> u64 {
        self.received.load(Ordering::Acquire)
    }

    /// A receive into slot `index` completed with `len` bytes: `read` sees them,
    /// then the slot goes back to the queue ([`SharedRecv::put_back`]). An error if
    /// the device did not hold the slot (the caller closes the session).
    pub(crate) fn receive<T>(
        &self,
        index: u64,
        len: usize,
        read: impl FnOnce(&[u8]) -> T,
    ) -> std::result::Result<T, String> {
        let mut slab = self.slab.lock();
        let slot = self.complete(&mut slab.slots, index)?;
        let seen = read(slab.slots.bytes(&slot, len.min(self.slot_size)));
        self.put_back(&mut slab, slot);
        Ok(seen)
    }

    /// A receive into slot `index` completed but its bytes are not wanted (an error
    /// completion, or one polled after its session closed): the slot goes back.
    pub(crate) fn give_back(&self, index: u64) -> std::result::Result<(), String> {
        let mut slab = self.slab.lock();
        let slot = self.complete(&mut slab.slots, index)?;
        self.put_back(&mut slab, slot);
        Ok(())
    }

    /// Posts `slot` again, then the slots refused before ([`repost`]). The first
    /// refusal's error is kept for the sweep to log: this runs under the session's
    /// locks, where no logger is called.
    fn put_back(&self, slab: &mut Slab, slot: Slot) {
        let Slab { slots, refused } = slab;
        let before = refused.len();
        if let Some(error) = repost(refused, slot, |s| self.post(slots, s)) {
            self.first_refusal.get_or_init(|| match error.is_queued() {
                // The device may hold the slot: it is left to it, not kept.
                true => format!("{error}; the slot is left to the device"),
                false => format!("{error}; the slot is kept and posted again"),
            });
        }
        if refused.len() != before {
            self.refused_now
                .store(refused.len() as u32, Ordering::Release);
        }
    }

    /// The poller's sweep: posts the slots refused before, should no receive have
    /// come to (every slot refused leaves none to come), and logs the first refusal.
    pub(crate) fn look(&self) {
        if self.refused_now.load(Ordering::Acquire) > 0 {
            let mut slab = self.slab.lock();
            if let Some(slot) = slab.refused.pop() {
                self.put_back(&mut slab, slot);
            }
            // The pop is not `put_back`'s to see.
            self.refused_now
                .store(slab.refused.len() as u32, Ordering::Release);
        }
        if let Some(error) = self.first_refusal.get() {
            if !self.told.swap(true, Ordering::AcqRel) {
                (self.log)(&format!(
                    "the shared receive queue refused a slot back ({error}); refused \
                     slots wait to be posted again ({} now), and further refusals \
                     are not logged",
                    self.refused()
                ));
            }
        }
    }

    /// The device gave slot `index` back: its handle.
    fn complete(&self, slab: &mut SlotSlab, index: u64) -> std::result::Result<Slot, String> {
        let slot = slab.complete(index)?;
        self.posted.fetch_sub(1, Ordering::AcqRel);
        self.received.fetch_add(1, Ordering::AcqRel);
        Ok(slot)
    }

    /// Posts `slot` to the queue; a refused slot comes back with the error (one the
    /// verb may have queued counts as posted: its completion gives it back).
    fn post(&self, slab: &mut SlotSlab, slot: Slot) -> std::result::Result<(), Refused> {
        let wr_id = crate::conn::recv_wr_id(slot.index());
        // SAFETY: the pool owns the queue and the slab and drops the queue first, after
        // every session (each holds the pool) destroyed its queue pair. Should a queue
        // pair's destruction have failed, keeping the queue alive, the slab's region
        // is still deregistered before its memory is freed (and the memory leaked if
        // that fails), so the device can no longer write it.
        let posted = unsafe { slab.post_srq_recv(&self.srq, slot, wr_id) };
        if posted.as_ref().map_or_else(|r| r.slot.is_none(), |()| true) {
            self.posted.fetch_add(1, Ordering::AcqRel);
        }
        posted
    }
}

/// Posts `slot`, then the slots in `refused`, with `post`, until one fails: that
/// one goes back to `refused` (unless the device may hold it), the rest stay
/// there, and its error is returned.
fn repost(
    refused: &mut Vec<Slot>,
    slot: Slot,
    mut post: impl FnMut(Slot) -> std::result::Result<(), Refused>,
) -> Option<rdma_safe::Error> {
    let mut next = Some(slot);
    while let Some(slot) = next.take().or_else(|| refused.pop()) {
        if let Err(Refused { error, slot }) = post(slot) {
            refused.extend(slot);
            return Some(error);
        }
    }
    None
}

/// A session's receive tokens when it receives into the pool: the slot numbers its
/// core counts credits by. Taken by each receive, given back when the core reposts.
pub(crate) struct Tokens {
    free: Vec<u32>,
}

impl Tokens {
    /// `credits` tokens, all free (the core starts with every slot posted).
    pub(crate) fn new(credits: u32) -> Tokens {
        Tokens {
            free: (0..credits).rev().collect(),
        }
    }

    /// A token for a receive, or `None` if the peer has used every credit.
    pub(crate) fn take(&mut self) -> Option<u32> {
        self.free.pop()
    }

    /// The core reposted `token`.
    pub(crate) fn put(&mut self, token: u32) {
        self.free.push(token);
    }
}

#[cfg(test)]
mod tests {
    use super::{repost, Tokens};
    use crate::slots::{Refused, Slot, SlotSlab};

    fn refusal(slot: Option<Slot>) -> Refused {
        Refused {
            error: rdma_safe::Error::verb("ibv_post_srq_recv", libc::ENOMEM),
            slot,
        }
    }

    fn indexes(slots: &[Slot]) -> Vec<u32> {
        slots.iter().map(Slot::index).collect()
    }

    #[test]
    fn a_repost_posts_the_new_slot_then_those_refused_before() {
        let mut slots = SlotSlab::loose_slots(4);
        let new = slots.pop().unwrap();
        let mut refused = slots;
        let mut posted = Vec::new();
        let error = repost(&mut refused, new, |s| {
            posted.push(s.index());
            Ok(())
        });
        assert!(error.is_none());
        assert_eq!(posted, [3, 2, 1, 0], "the new slot first, then the refused");
        assert!(refused.is_empty());
    }

    #[test]
    fn a_refused_slot_is_kept_with_those_not_tried_yet() {
        // The new slot goes up; the first refused one tried is refused again, and
        // it and the untried one stay, to be tried again later.
        let mut slots = SlotSlab::loose_slots(3);
        let new = slots.pop().unwrap();
        let mut refused = slots;
        let mut calls = 0;
        let error = repost(&mut refused, new, |s| {
            calls += 1;
            if calls == 2 {
                Err(refusal(Some(s)))
            } else {
                Ok(())
            }
        });
        assert!(error.is_some_and(|e| e.to_string().contains("ibv_post_srq_recv")));
        assert_eq!(calls, 2, "tries stop at the refusal");
        let mut kept = indexes(&refused);
        kept.sort_unstable();
        assert_eq!(kept, [0, 1]);
    }

    #[test]
    fn a_slot_the_device_may_hold_is_not_kept() {
        // `Error::Queued`: the request may be on the queue; posting the slot again
        // would give the device two requests over one buffer.
        let mut refused = Vec::new();
        let new = SlotSlab::loose_slots(1).pop().unwrap();
        let error = repost(&mut refused, new, |_| Err(refusal(None)));
        assert!(error.is_some());
        assert!(refused.is_empty());
    }

    #[test]
    fn tokens_run_out_after_the_credits_and_come_back() {
        let mut t = Tokens::new(3);
        let taken: Vec<u32> = (0..3).map(|_| t.take().unwrap()).collect();
        assert_eq!(taken, [0, 1, 2]);
        assert_eq!(t.take(), None, "a fourth SEND has no credit");
        t.put(1);
        assert_eq!(t.take(), Some(1));
        assert_eq!(t.take(), None);
    }
}
