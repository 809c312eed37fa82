//! The servers that take many clients (`rping -P`, `rdma-server`): each
//! connection request is served on a thread and an event channel of its own, and
//! what fails for one request fails that request alone.
//!
//! A client that opens connections and leaves them idle uses up the server's file
//! descriptors (two a connection: its event channel and its completion channel)
//! or threads. Making the next request's channel, moving its id there or starting
//! its thread then fails: that request is rejected with a line on stderr, and the
//! server goes on serving the others. At most [`Workers::max`] connections are
//! served at once; requests beyond are rejected the same way.

use rdma_safe::cm::{CmId, EventChannel};
use rdma_safe::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// The connections a server is serving, each on its own thread.
#[derive(Debug)]
pub struct Workers {
    program: &'static str,
    max: usize,
    live: Arc<AtomicUsize>,
}

/// Counts a connection as live until its thread ends (or it never started).
struct Live(Arc<AtomicUsize>);

impl Drop for Live {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Workers {
    /// Connections of `program` (named in its lines), at most `max` at once.
    pub fn new(program: &'static str, max: usize) -> Workers {
        Workers {
            program,
            max,
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The most connections served at once.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Connections being served now.
    pub fn live(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    /// Serves the request of `id` with `serve(id, its own event channel)` on a
    /// thread of its own. A request beyond [`Workers::max`], or one whose channel,
    /// move or thread cannot be made, is rejected and said on stderr; the caller
    /// goes on accepting. Returns whether it is being served.
    pub fn serve<F>(&self, id: CmId, serve: F) -> bool
    where
        F: FnOnce(CmId, Arc<EventChannel>) + Send + 'static,
    {
        let live = Live(self.live.clone());
        if self.live.fetch_add(1, Ordering::AcqRel) >= self.max {
            return self.refuse(
                &id,
                &format!("{} connections are being served already", self.max),
            );
        }
        let own = match hand_over(&id) {
            Ok(own) => own,
            Err(e) => return self.refuse(&id, &format!("{e}")),
        };
        let started = std::thread::Builder::new().spawn(move || {
            let _live = live;
            serve(id, own)
        });
        match started {
            Ok(_) => true,
            // The id went into the closure, which the failed spawn dropped: the
            // peer's request ends with the id's destruction (a reject, to the peer).
            Err(e) => {
                eprintln!(
                    "{}: a connection request refused: cannot start its thread: {e}",
                    self.program
                );
                false
            }
        }
    }

    /// Rejects `id`'s request and says why.
    fn refuse(&self, id: &CmId, why: &str) -> bool {
        eprintln!("{}: a connection request refused: {why}", self.program);
        if let Err(e) = id.reject(&[]) {
            eprintln!("{}: rejecting it failed too: {e}", self.program);
        }
        false
    }
}

/// `id` moved to an event channel of its own.
fn hand_over(id: &CmId) -> Result<Arc<EventChannel>> {
    let own = EventChannel::new()?;
    id.migrate(&own)?;
    Ok(own)
}
