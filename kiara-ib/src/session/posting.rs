//! The session core's side that sends: what goes on the send queue next (READs,
//! credit returns, acknowledgements, queued messages), as credits, send slots,
//! read depth and windows allow.

use super::{Action, Pending, Session, ACK_BATCH, ACK_DELIVERED, ACK_HOLD_BYTES, DATA_RESERVE};
use crate::protocol::{Control, Kind};

impl Session {
    /// Credits of taken messages go to `to_return`, except as many as slots still
    /// wait for their repost: a credit never goes back before its slot is posted.
    fn fold_taken(&mut self) {
        let unposted = self.to_repost.len() as u32;
        if self.taken > unposted {
            self.to_return += self.taken - unposted;
            self.taken = unposted;
        }
    }

    /// Owed credits from which a CREDIT goes out on its own.
    pub(super) fn credit_threshold(&self) -> u32 {
        (self.p.credits / 4).max(2)
    }

    /// Posts what credits, slots and read depth allow.
    pub(super) fn flush(&mut self) {
        if self.closed.is_some() || self.nothing_to_post() {
            return;
        }
        self.start_reads();
        // A credit return may use the last credit, ahead of everything else, so that
        // the two sides can never both wait for credits.
        self.fold_taken();
        if self.to_return >= self.credit_threshold()
            && self.send_credits >= 1
            && !self.free_slots.is_empty()
        {
            self.post(Kind::Credit, Control::default(), 0);
        }
        self.post_acks();
        self.post_pending();
    }

    /// Nothing is queued to post and no credit return is due (the case after most
    /// events of a request/reply exchange; `flush` runs after every event).
    fn nothing_to_post(&self) -> bool {
        self.reads.is_empty()
            && self.acks.is_empty()
            && self.pending.is_empty()
            && self.to_return + self.taken < self.credit_threshold()
    }

    /// Posts the queued READs the read depth allows.
    fn start_reads(&mut self) {
        while self.reads_in_flight < self.p.reads_in_flight {
            let Some(job) = self.reads.pop_front() else {
                break;
            };
            self.reads_in_flight += 1;
            self.actions.push_back(Action::Read {
                id: job.id,
                offset: job.offset,
                len: job.len,
                addr: job.addr,
                rkey: job.rkey,
            });
        }
    }

    /// Posts the acknowledgements due. They keep one credit for credit returns and
    /// pass queued messages. A run of "delivered" ones goes as one, its last (they
    /// are cumulative), and waits while the next is on its way (`hold_acks`).
    fn post_acks(&mut self) {
        while self.send_credits >= 2 && !self.free_slots.is_empty() && !self.hold_acks() {
            let Some((mut msg_id, code, mut rkey)) = self.acks.pop_front() else {
                break;
            };
            if code == ACK_DELIVERED {
                while let Some(&(next, ACK_DELIVERED, key)) = self.acks.front() {
                    self.acks.pop_front();
                    (msg_id, rkey) = (next, key);
                }
            }
            let h = Control {
                msg_id,
                len: code,
                rkey,
                ..Default::default()
            };
            self.post(Kind::Ack, h, 0);
        }
    }

    /// Posts queued messages and the goodbye, in order, while credits, slots and
    /// windows allow. Messages keep [`DATA_RESERVE`] credits for acknowledgements
    /// and credit returns.
    fn post_pending(&mut self) {
        while let Some(&next) = self.pending.front() {
            let need = if next == Pending::Bye {
                2
            } else {
                DATA_RESERVE + 1
            };
            if self.send_credits < need || self.free_slots.is_empty() {
                break;
            }
            if matches!(next, Pending::Data(_)) && self.bound >= self.p.windows {
                break;
            }
            self.pending.pop_front();
            match next {
                Pending::Eager { id, len } => {
                    let h = Control {
                        msg_id: id,
                        len,
                        ..Default::default()
                    };
                    self.post(Kind::Eager, h, id);
                }
                Pending::Data(id) => self.post_data(id),
                Pending::Bye => {
                    self.post(Kind::Bye, Control::default(), 0);
                }
            }
        }
    }

    /// Binds our read message `id`'s window and posts its descriptor; its
    /// acknowledgement is timed from the core's clock (corrected by the next
    /// `tick`).
    fn post_data(&mut self, id: u64) {
        let out = self.outgoing.get_mut(&id).expect("queued DATA is outgoing");
        out.posted = Some(self.now);
        out.since_tick = true;
        let h = Control {
            msg_id: id,
            len: out.len,
            ..Default::default()
        };
        self.bound += 1;
        self.actions.push_back(Action::Bind(id));
        self.post(Kind::Data, h, 0);
    }

    /// Whether the queued acknowledgements wait: all say "delivered", fewer than
    /// [`ACK_BATCH`], and the next message to deliver is at most [`ACK_HOLD_BYTES`]
    /// with every READ it still needs in flight, so its own acknowledgement (which
    /// covers these) follows within those READs. (READs complete in order, and that
    /// message's are the oldest.) Never behind a goodbye: it goes after them.
    fn hold_acks(&self) -> bool {
        if self.acks.is_empty()
            || self.acks.len() >= ACK_BATCH
            || self.acks.iter().any(|&(_, code, _)| code != ACK_DELIVERED)
        {
            return false;
        }
        let next = self.arrival.front().and_then(|id| self.incoming.get(id));
        next.is_some_and(|i| {
            i.needs_ack
                && i.charged <= ACK_HOLD_BYTES
                && i.reads_left > 0
                && i.reads_left <= self.reads_in_flight
        }) && !self.pending.contains(&Pending::Bye)
    }

    /// Takes a send slot and a credit for a control message and queues its `Post`;
    /// `eager`: the eager message it carries (0: none).
    /// Queues a control message into a free send slot; returns the slot.
    pub(super) fn post(&mut self, kind: Kind, header: Control, eager: u64) -> u32 {
        let (slot, header) = self.claim(kind, header, eager);
        self.actions.push_back(Action::Post { slot, kind, header });
        slot
    }

    /// [`Session::post`] without queueing: the slot and the finished header.
    pub(super) fn claim(&mut self, kind: Kind, mut header: Control, eager: u64) -> (u32, Control) {
        let slot = self
            .free_slots
            .pop()
            .expect("callers check for a free slot");
        self.sends_posted.push_back(self.now);
        self.sends_unstamped += 1;
        self.fold_taken();
        header.kind = Some(kind);
        header.credits = std::mem::take(&mut self.to_return);
        self.granted += header.credits;
        if kind == Kind::Eager {
            // Posted in id order (`pending` is, and the fast path runs only when
            // nothing is queued).
            self.eager_posted = eager;
        }
        // The low 32 bits: the peer widens them (see `on_seen`).
        header.seen = self.received_upto as u32;
        self.send_credits -= 1;
        self.spent += 1;
        self.slot_busy[slot as usize] = true;
        self.slot_msg[slot as usize] = eager;
        (slot, header)
    }
}
