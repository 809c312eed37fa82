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
use std::sync::atomic::{AtomicU64, Ordering};

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
        // Numbered after the poll: a request's completion is polled after its post,
        // so it gets a higher number than any handed out before the post. Between
        // the two the poll is marked under way, and a post waits for it (see
        // `Numbering`).
        self.check_outside_callback("poll_completions")?;
        // Not under way while a `poll_ex` runs (see `polling`); only an extended
        // queue has one.
        let _polling = self
            .ex_raw()
            .map(|_| self.polling.lock().unwrap_or_else(|e| e.into_inner()));
        let under_way = self.numbering.begin();
        let n = self.poll_outside_callback(&mut *scratch)?.len();
        let seq = under_way.hand_out(n);
        let scratch: &'a [WorkCompletion] = scratch;
        Ok(Completions {
            polled: scratch[..n].iter(),
            cq: self.id(),
            seq,
        })
    }
}

/// A queue's count of the completions it handed out, and of its polls under way.
///
/// A post records the count (`after`) and its completion must come with a higher
/// number. A completion a poll has taken off the queue but not numbered yet would
/// get its number late, after a post that did not count it: if it belonged to the
/// request whose slot and tag that post reuses (2^20 posts later, with the
/// polling thread preempted meanwhile), it would release the new request's buffer
/// while the device still uses it. So a poll is marked under way from before it
/// takes completions until they are numbered, and [`Numbering::settled`] (the
/// post's reading) waits until none is.
#[derive(Debug, Default)]
pub(crate) struct Numbering {
    handed: AtomicU64,
    /// Polls between taking completions and numbering them.
    under_way: AtomicU64,
}

/// A poll under way on a [`Numbering`]; ends when dropped.
pub(crate) struct UnderWay<'a>(&'a Numbering);

impl Numbering {
    /// Marks a poll under way until the guard is dropped.
    pub(crate) fn begin(&self) -> UnderWay<'_> {
        self.under_way.fetch_add(1, Ordering::SeqCst);
        UnderWay(self)
    }

    /// The completions handed out so far, read once no poll is under way: every
    /// completion taken off the queue before this returns is counted in it.
    pub(crate) fn settled(&self) -> u64 {
        let mut looks = 0u32;
        while self.under_way.load(Ordering::SeqCst) != 0 {
            looks = looks.wrapping_add(1);
            if looks % 64 == 0 {
                // A poller that was preempted mid-poll needs a core to finish.
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
        self.handed.load(Ordering::SeqCst)
    }
}

impl UnderWay<'_> {
    /// Numbers the poll's `n` completions and ends it: returns the count before
    /// them. An empty poll writes nothing to the shared count.
    pub(crate) fn hand_out(self, n: usize) -> u64 {
        match n {
            0 => 0,
            n => self.0.handed.fetch_add(n as u64, Ordering::SeqCst),
        }
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.under_way.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    #[test]
    fn a_post_does_not_read_the_count_while_a_poll_has_unnumbered_completions() {
        let numbering = Numbering::default();
        let read = AtomicBool::new(false);
        std::thread::scope(|s| {
            // A poller took three completions and is held up before numbering them.
            let under_way = numbering.begin();
            let post = s.spawn(|| {
                let after = numbering.settled();
                read.store(true, Ordering::SeqCst);
                after
            });
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                !read.load(Ordering::SeqCst),
                "the post read the count mid-poll"
            );
            assert_eq!(under_way.hand_out(3), 0);
            // The post counts them: their numbers (1 to 3) are not above its own.
            assert_eq!(post.join().unwrap(), 3);
        });
    }

    #[test]
    fn empty_and_failed_polls_end_without_counting() {
        let numbering = Numbering::default();
        assert_eq!(numbering.begin().hand_out(0), 0);
        // A poll that failed drops its guard without numbering.
        drop(numbering.begin());
        assert_eq!(numbering.begin().hand_out(2), 0);
        assert_eq!(numbering.begin().hand_out(1), 2);
        assert_eq!(numbering.settled(), 3);
    }
}
