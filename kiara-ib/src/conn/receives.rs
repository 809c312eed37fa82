//! Where a session's control messages land: its own slab of receive slots, posted
//! on its queue pair, or the transport's shared receive queue
//! ([`crate::shared_recv`]). Either way the core sees slot numbers `0..credits`.

use super::{recv_slot, Conn};
use crate::error::CloseReason;
use crate::shared_recv::{Mailbox, SharedRecv, Tokens};
use crate::slots::{Slot, SlotSlab};
use rdma_safe::qp::Rts;
use rdma_safe::{QueuePair, WorkCompletion};
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
        /// Where the pool's CQ routes this queue pair's receives.
        mailbox: Arc<Mailbox>,
        /// The queue pair's number, its mailbox's address.
        qpn: u32,
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

    /// Receives into `pool` on queue pair `qpn`, whose mailbox is open, for a peer
    /// holding `credits`.
    pub(crate) fn shared(
        pool: Arc<SharedRecv>,
        qpn: u32,
        mailbox: Arc<Mailbox>,
        credits: u32,
    ) -> Receives {
        Receives::Shared {
            pool,
            tokens: Tokens::new(credits),
            mailbox,
            qpn,
        }
    }

    /// The mailbox the pool's CQ routes to, on the shared queue.
    pub(crate) fn mailbox(&self) -> Option<&Arc<Mailbox>> {
        match self {
            Receives::Own { .. } => None,
            Receives::Shared { mailbox, .. } => Some(mailbox),
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
            Receives::Shared { pool, tokens, .. } => {
                let seen = pool
                    .receive(index, len, read)
                    .map_err(|e| CloseReason::Local(format!("shared receive {e}")))?;
                let token = tokens.take().ok_or_else(crate::session::over_credits)?;
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
        if let Some(index) = recv_slot(wc.wr_id()) {
            self.unhandled_slot(index);
        }
    }

    /// The receive into slot `index` completed and will not be handled.
    pub(crate) fn unhandled_slot(&self, index: u64) {
        if let Receives::Shared { pool, .. } = self {
            // A failure names a slot the pool does not hold: nothing to give back.
            let _ = pool.give_back(index);
        }
    }

    /// After the queue pair is destroyed (nothing more completes for it): on the
    /// shared queue its mailbox closes, giving back the slots of what was routed to
    /// it and not handled; what the pool's CQ still holds for it goes back when
    /// reaped.
    pub(crate) fn drain(&self) {
        if let Receives::Shared {
            pool, mailbox, qpn, ..
        } = self
        {
            pool.close(*qpn, mailbox);
        }
    }
}
