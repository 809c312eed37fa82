//! Where a session's control messages land: its own slab of receive slots, posted
//! on its queue pair, or the transport's shared receive queue
//! ([`crate::shared_recv`]). Either way the core sees slot numbers `0..credits`.

use super::{Conn, TAG_RECV, TAG_SHIFT, VALUE_MASK};
use crate::error::CloseReason;
use crate::shared_recv::{SharedRecv, Tokens};
use crate::slots::{Slot, SlotSlab};
use rdma_safe::qp::Rts;
use rdma_safe::{CompletionQueue, QueuePair, WorkCompletion};
use std::sync::Arc;

/// A session's receives.
pub(crate) enum Receives {
    /// Its own slab, one slot per credit, posted on its queue pair.
    Own {
        slab: SlotSlab,
        /// Slots whose receive completed, by index, until the core reposts them.
        held: Vec<Option<Slot>>,
    },
    /// The transport's shared receive queue; the core's slot numbers are tokens.
    Shared {
        pool: Arc<SharedRecv>,
        tokens: Tokens,
    },
}

impl Receives {
    /// Receives into `slab`, whose `credits` slots are all posted.
    pub(crate) fn own(slab: SlotSlab, credits: u32) -> Receives {
        Receives::Own {
            slab,
            held: (0..credits).map(|_| None).collect(),
        }
    }

    /// Receives into `pool`, for a peer holding `credits`.
    pub(crate) fn shared(pool: Arc<SharedRecv>, credits: u32) -> Receives {
        Receives::Shared {
            pool,
            tokens: Tokens::new(credits),
        }
    }

    /// A receive into slot `index` completed with `len` bytes: `read` sees them
    /// (at most the slot), and the core's slot number for it comes back with what
    /// `read` made of them. An error closes the session.
    pub(crate) fn arrive<T>(
        &mut self,
        index: u64,
        len: usize,
        read: impl FnOnce(&[u8]) -> T,
    ) -> Result<(u32, T), CloseReason> {
        match self {
            Receives::Own { slab, held } => {
                let slot = slab
                    .complete(index)
                    .map_err(|e| CloseReason::Local(format!("receive {e}")))?;
                let seen = read(slab.bytes(&slot, len.min(slab.slot_size())));
                let number = slot.index();
                held[number as usize] = Some(slot);
                Ok((number, seen))
            }
            Receives::Shared { pool, tokens } => {
                let seen = pool
                    .receive(index, len, read)
                    .map_err(|e| CloseReason::Local(format!("shared receive {e}")))?;
                let token = tokens.take().ok_or_else(|| {
                    CloseReason::Protocol(
                        "the peer sent more control messages than its credits".into(),
                    )
                })?;
                Ok((token, seen))
            }
        }
    }

    /// The core reposts its slot `number`.
    pub(crate) fn repost(
        &mut self,
        qp: Option<&QueuePair<Rts>>,
        number: u32,
    ) -> Result<(), CloseReason> {
        match self {
            Receives::Own { slab, held } => {
                let slot = held
                    .get_mut(number as usize)
                    .and_then(Option::take)
                    .ok_or_else(|| {
                        CloseReason::Local(format!(
                            "repost of receive slot {number}, which is not held"
                        ))
                    })?;
                let qp = qp.ok_or_else(super::no_qp)?;
                Conn::post_recv_slot(qp, slab, slot).map_err(|e| CloseReason::Local(e.to_string()))
            }
            Receives::Shared { tokens, .. } => {
                tokens.put(number);
                Ok(())
            }
        }
    }

    /// Bytes per slot: the largest control message the peer may send.
    pub(crate) fn slot_size(&self) -> usize {
        match self {
            Receives::Own { slab, .. } => slab.slot_size(),
            Receives::Shared { pool, .. } => pool.slot_size(),
        }
    }

    /// A completion that will not be handled (an error, or one polled after the
    /// session closed): a receive into the shared queue gives its slot back. (A
    /// session's own slots need nothing: they go with the session.)
    pub(crate) fn unhandled(&self, wc: &WorkCompletion) {
        if wc.wr_id() >> TAG_SHIFT == TAG_RECV {
            self.unhandled_slot(wc.wr_id() & VALUE_MASK);
        }
    }

    /// The receive into slot `index` completed and will not be handled.
    pub(crate) fn unhandled_slot(&self, index: u64) {
        if let Receives::Shared { pool, .. } = self {
            // A failure names a slot the pool does not hold: nothing to give back.
            let _ = pool.give_back(index);
        }
    }

    /// After the queue pair is destroyed: the completions left on `cq` give their
    /// shared slots back (nothing can complete any more, so none is lost).
    pub(crate) fn drain(&self, cq: &CompletionQueue) {
        if !matches!(self, Receives::Shared { .. }) {
            return;
        }
        let mut wcs = [WorkCompletion::default(); 16];
        while let Ok(done) = cq.poll(&mut wcs) {
            if done.is_empty() {
                break;
            }
            for wc in done.iter() {
                self.unhandled(wc);
            }
        }
    }
}
