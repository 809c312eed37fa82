//! Completions that safe code cannot forge: [`CompletionQueue::poll_completions`]
//! hands each polled completion out once, as a [`Completion`] that remembers its
//! queue. Only such a value releases buffers in [`crate::lease::LeasedQp::complete`].
//!
//! [`WorkCompletion`] is plain data (`Copy`, `Default`, public fields) so that it can
//! be read freely; that also means anyone can make one up, or keep a copy and hand it
//! in twice. A `Completion` is neither `Copy` nor `Clone`, has no public constructor,
//! and carries the [`CompletionQueue::id`] of the queue it was polled from, which is
//! never reused within a process, and its number among the completions that queue
//! handed out: a completion kept for long cannot pass for that of a later request
//! that happens to have the same work request id.
//!
//! ```no_run
//! # use rdma_safe::*;
//! # fn demo(cq: &CompletionQueue, conn: &mut lease::LeasedQp) -> Result<()> {
//! let mut scratch = [WorkCompletion::default(); 16];
//! for completion in cq.poll_completions(&mut scratch)? {
//!     completion.result()?; // reads go through `Deref<Target = WorkCompletion>`
//!     for (wr_id, lease) in conn.complete(completion)? {
//!         println!("request {wr_id} done, {} bytes back", lease.region().len());
//!     }
//! }
//! # Ok(()) }
//! ```

use crate::cq::{CompletionQueue, WorkCompletion};
use crate::error::Result;

/// One completion, polled from a known queue and handed out exactly once.
#[derive(Debug)]
pub struct Completion {
    wc: WorkCompletion,
    cq: u64,
    /// Its number among the completions its queue handed out (from 1).
    seq: u64,
}

impl Completion {
    /// The [`CompletionQueue::id`] of the queue it was polled from.
    pub fn cq_id(&self) -> u64 {
        self.cq
    }

    /// Its number among the completions its queue handed out, from 1: a request
    /// posted after this was handed out completes with a higher one.
    pub(crate) fn seq(&self) -> u64 {
        self.seq
    }

    /// The completion's fields, as a plain copy (which releases nothing).
    pub fn work_completion(&self) -> WorkCompletion {
        self.wc
    }
}

impl std::ops::Deref for Completion {
    type Target = WorkCompletion;

    fn deref(&self) -> &WorkCompletion {
        &self.wc
    }
}

/// The completions of one poll, in the order the queue reported them.
///
/// Hand every one to its owner: a completion dropped unhandled keeps the buffers it
/// would have released leased until their queue pair is dropped (nothing is freed
/// early; the buffers are only held longer).
#[derive(Debug)]
pub struct Completions<'a> {
    polled: std::slice::Iter<'a, WorkCompletion>,
    cq: u64,
    /// The number of the last completion handed out.
    seq: u64,
}

impl Iterator for Completions<'_> {
    type Item = Completion;

    fn next(&mut self) -> Option<Completion> {
        let wc = self.polled.next()?;
        self.seq += 1;
        Some(Completion {
            wc: *wc,
            cq: self.cq,
            seq: self.seq,
        })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.polled.size_hint()
    }
}

impl ExactSizeIterator for Completions<'_> {}

impl CompletionQueue {
    /// Polls up to `scratch.len()` completions (as [`CompletionQueue::poll`], no
    /// allocation) and hands each out once as a [`Completion`].
    pub fn poll_completions<'a>(
        &self,
        scratch: &'a mut [WorkCompletion],
    ) -> Result<Completions<'a>> {
        let n = self.poll(&mut *scratch)?.len();
        let scratch: &'a [WorkCompletion] = scratch;
        Ok(Completions {
            polled: scratch[..n].iter(),
            cq: self.id(),
            // Numbered after the poll: a request's completion is polled after its post,
            // so it gets a higher number than any handed out before the post. An
            // empty poll (a busy loop's usual one) hands out nothing and counts
            // nothing: no atomic write on the queue's shared count.
            seq: if n == 0 { 0 } else { self.hand_out(n) },
        })
    }
}
