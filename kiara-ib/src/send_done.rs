//! How a read message's sender learns its end: a [`SendDone`] record per message
//! in flight, and [`DoneRecords`], which lends finished records out again so that
//! the steady path allocates none (issue #15: no allocation per message).
//!
//! A record is shared by the session (until the core finishes the message) and the
//! sender's handle (until it is dropped). It is lent again only when neither holds
//! it any more, so a handle never sees another message's result.

use crate::error::CloseReason;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The end of a read send: `Ok` once the peer has the message, else why not.
#[derive(Default)]
pub(crate) struct SendDone {
    result: Mutex<Option<Result<(), CloseReason>>>,
    cond: Condvar,
}

impl SendDone {
    /// Records the end (the first one only) and wakes the waiters.
    pub(crate) fn finish(&self, result: Result<(), CloseReason>) {
        let mut r = self.result.lock();
        if r.is_none() {
            *r = Some(result);
            self.cond.notify_all();
        }
    }

    /// True once finished, either way.
    pub(crate) fn is_finished(&self) -> bool {
        self.result.lock().is_some()
    }

    /// Waits up to `timeout` (forever if `None`); `None` if still running.
    pub(crate) fn wait(&self, timeout: Option<Duration>) -> Option<Result<(), CloseReason>> {
        let mut r = self.result.lock();
        // The clock is read only when the result is not there yet.
        let deadline = if r.is_none() {
            // A timeout too long for the clock (`Duration::MAX`) waits for good.
            timeout.and_then(|t| Instant::now().checked_add(t))
        } else {
            None
        };
        while r.is_none() {
            match deadline {
                None => self.cond.wait(&mut r),
                Some(d) => {
                    if self.cond.wait_until(&mut r, d).timed_out() {
                        break;
                    }
                }
            }
        }
        r.clone()
    }
}

/// Finished records kept for the next read messages: at most `keep` of them.
pub(crate) struct DoneRecords {
    spare: Vec<Arc<SendDone>>,
    keep: usize,
}

impl DoneRecords {
    /// Keeps up to `keep` finished records (room for 16 at first: the list grows
    /// only while more messages are in flight at once than ever before).
    pub(crate) fn new(keep: usize) -> Self {
        DoneRecords {
            spare: Vec::with_capacity(keep.min(16)),
            keep,
        }
    }

    /// A record for a new message: a kept one that no handle holds any more, reset,
    /// or else a new one.
    pub(crate) fn lend(&mut self) -> Arc<SendDone> {
        // A kept record's only other holders are handles: none can be made from it
        // meanwhile (we hold the only other copy), so a count of one stays one.
        if let Some(i) = self.spare.iter().position(|r| Arc::strong_count(r) == 1) {
            let record = self.spare.swap_remove(i);
            *record.result.lock() = None;
            return record;
        }
        Arc::new(SendDone::default())
    }

    /// Takes back a finished message's record (a handle may still hold it: it is not
    /// lent again until that handle is gone). Beyond `keep`, the record is let go.
    pub(crate) fn give_back(&mut self, record: Arc<SendDone>) {
        if self.spare.len() < self.keep {
            self.spare.push(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_too_long_for_the_clock_waits_for_the_end() {
        let done = Arc::new(SendDone::default());
        let finisher = done.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            finisher.finish(Ok(()));
        });
        // `Duration::MAX` overflowed the deadline (a panic) before.
        assert_eq!(done.wait(Some(Duration::MAX)), Some(Ok(())));
        t.join().unwrap();
    }

    #[test]
    fn a_record_no_handle_holds_is_lent_again_reset() {
        let mut records = DoneRecords::new(4);
        let first = records.lend();
        first.finish(Err(CloseReason::PeerRefused(7)));
        let ptr = Arc::as_ptr(&first);
        records.give_back(first);
        let again = records.lend();
        assert_eq!(Arc::as_ptr(&again), ptr, "the same record, not a new one");
        assert!(!again.is_finished(), "and its old result is gone");
        assert_eq!(again.wait(Some(Duration::ZERO)), None);
    }

    #[test]
    fn a_record_a_handle_still_holds_keeps_its_result() {
        let mut records = DoneRecords::new(4);
        let record = records.lend();
        let handle = record.clone();
        record.finish(Err(CloseReason::PeerRefused(3)));
        records.give_back(record);
        let other = records.lend();
        assert!(!Arc::ptr_eq(&other, &handle), "a held record is not lent");
        assert!(matches!(
            handle.wait(None),
            Some(Err(CloseReason::PeerRefused(3)))
        ));
        let ptr = Arc::as_ptr(&handle);
        drop(handle);
        assert_eq!(
            Arc::as_ptr(&records.lend()),
            ptr,
            "lent once the handle is gone"
        );
    }

    #[test]
    fn no_more_than_keep_records_are_kept() {
        let mut records = DoneRecords::new(2);
        for _ in 0..5 {
            let r = records.lend();
            r.finish(Ok(()));
            records.give_back(r);
        }
        let held: Vec<_> = (0..5).map(|_| records.lend()).collect();
        for r in held {
            records.give_back(r);
        }
        assert_eq!(records.spare.len(), 2);
    }
}
