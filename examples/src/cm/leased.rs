//! Posting through the safe layer on a CM connection: the buffers a port lends to
//! its requests, by the `wr_id` each is posted with, and the waits that take them back
//! from the completions.

use super::Conn;
use rdma_safe::qp::{CanRecv, Rts};
use rdma_safe::sys::ibv_wc_opcode;
use rdma_safe::WorkCompletion;
use rdma_safe::{Error, Lease, LeasedQp, MemoryRegion, Result, SendFlags, SendOp};
use std::time::Duration;

/// Registered buffers, each known by the `wr_id` of the requests it is lent to; a
/// buffer is out while a request holds it and back once its completion was handed in.
#[derive(Debug, Default)]
pub struct Lent {
    slots: Vec<(u64, &'static str, Option<MemoryRegion>)>,
}

impl Lent {
    /// Adds `mr`, lent to requests posted with `wr_id`; `what` names it in errors.
    pub fn add(&mut self, wr_id: u64, what: &'static str, mr: MemoryRegion) {
        self.slots.push((wr_id, what, Some(mr)));
    }

    fn slot(&mut self, wr_id: u64) -> Result<&mut (u64, &'static str, Option<MemoryRegion>)> {
        self.slots
            .iter_mut()
            .find(|s| s.0 == wr_id)
            .ok_or_else(|| Error::InvalidArgument(format!("no buffer for wr_id {wr_id}").into()))
    }

    /// The buffer of `wr_id`, if no request holds it.
    pub fn get(&mut self, wr_id: u64) -> Result<&mut MemoryRegion> {
        let (_, what, mr) = self.slot(wr_id)?;
        let what = *what;
        mr.as_mut().ok_or_else(|| lent(what))
    }

    /// True when the buffer of `wr_id` is back.
    pub fn is_back(&self, wr_id: u64) -> bool {
        self.slots.iter().any(|s| s.0 == wr_id && s.2.is_some())
    }

    /// Takes the buffer of `wr_id` out, to lend it to a request.
    pub fn take(&mut self, wr_id: u64) -> Result<MemoryRegion> {
        let (_, what, mr) = self.slot(wr_id)?;
        let what = *what;
        mr.take().ok_or_else(|| lent(what))
    }

    /// Puts back a buffer a completion (or a failed post) released.
    pub fn put(&mut self, wr_id: u64, lease: Lease) {
        if let (Lease::Owned(mr), Ok(slot)) = (lease, self.slot(wr_id)) {
            slot.2 = Some(mr);
        }
    }

    /// Puts back the buffer of a failed post, if the post left it (a request the
    /// device had queued keeps it until its completion, as a posted one does).
    pub fn put_back(&mut self, wr_id: u64, lease: Option<Lease>) {
        if let Some(lease) = lease {
            self.put(wr_id, lease);
        }
    }
}

/// The error of a buffer that a request still holds.
fn lent(what: &str) -> Error {
    Error::InvalidArgument(format!("the {what} buffer is still lent to a request").into())
}

/// Lends the buffer of `wr_id` to a receive of its first `len` bytes (on a queue pair
/// connected or not).
pub fn post_recv<S: CanRecv>(
    qp: &mut LeasedQp<S>,
    bufs: &mut Lent,
    wr_id: u64,
    len: usize,
) -> Result<()> {
    let mr = bufs.take(wr_id)?;
    qp.post_recv(wr_id, mr, 0..len).map_err(|e| {
        bufs.put_back(wr_id, e.lease);
        e.error
    })
}

/// One side of a connected CM connection: the queue pair, posting through the safe
/// layer, and the buffers it lends.
pub struct Side<'a> {
    /// The connection (its completion and event waits).
    pub conn: &'a Conn,
    /// The queue pair.
    pub qp: LeasedQp<Rts>,
    /// The buffers.
    pub bufs: Lent,
}

impl Side<'_> {
    /// The next completion of `want` (as [`Conn::completion_of`]); the buffers the
    /// completions release come back.
    pub fn wait(
        &mut self,
        want: ibv_wc_opcode,
        timeout: Duration,
        what: &str,
    ) -> Result<WorkCompletion> {
        let bufs = &mut self.bufs;
        self.conn
            .leased_completion_of(&mut self.qp, want, timeout, what, &mut |id, lease| {
                bufs.put(id, lease)
            })
    }

    /// The next completion, whatever its opcode (as [`Conn::completion`]); the buffers
    /// it releases come back.
    pub fn next(&mut self, timeout: Duration, what: &str) -> Result<WorkCompletion> {
        let bufs = &mut self.bufs;
        self.conn
            .leased_completion(&mut self.qp, timeout, what, &mut |id, lease| {
                bufs.put(id, lease)
            })
    }

    /// Waits until the buffer of `wr_id` is back from its request, whose completion
    /// has opcode `op`.
    pub fn reclaim(&mut self, wr_id: u64, op: ibv_wc_opcode, timeout: Duration) -> Result<()> {
        while !self.bufs.is_back(wr_id) {
            self.wait(op, timeout, "the completion that gives a buffer back")?;
        }
        Ok(())
    }

    /// Lends the buffer of `wr_id` to a receive of its first `len` bytes.
    pub fn post_recv(&mut self, wr_id: u64, len: usize) -> Result<()> {
        post_recv(&mut self.qp, &mut self.bufs, wr_id, len)
    }

    /// Lends the buffer of `wr_id` to `op` on its first `len` bytes.
    pub fn post(&mut self, wr_id: u64, op: SendOp, len: usize, flags: SendFlags) -> Result<()> {
        let mr = self.bufs.take(wr_id)?;
        self.qp
            .post_send_with(wr_id, op, Lease::Owned(mr), 0..len, flags)
            .map_err(|e| {
                self.bufs.put_back(wr_id, e.lease);
                e.error
            })
    }
}
