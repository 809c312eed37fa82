//! READ targets registered off the drain path. A peer's read message needs a
//! registered buffer to be read into; when the pool's cache has none of its
//! class, registering one (zeroing and pinning up to `max_message` bytes) takes
//! long, and a peer chooses when that happens. Done by the thread that drains the
//! session, it held that thread (on two cores the only callback runner, so every
//! session's callbacks) and, on the shared receive queue, the queue's reaping. So
//! the drain only asks here ([`Registrar::ask`]), the core holds the message's
//! READs ([`crate::session::Session::awaiting_target`]), and the poller, woken
//! through an eventfd, registers the targets and lets the READs go
//! (`Conn::register_targets`).

use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// The sessions waiting for READ targets, and the poller's wake-up.
pub(crate) struct Registrar {
    /// An eventfd in the poller's set; `None` if none could be made (then the
    /// poller finds the requests on its next round, within 50 ms).
    wake: Option<OwnedFd>,
    /// Ids of the sessions that asked since the poller last looked.
    asking: Mutex<Vec<u64>>,
    /// `asking` is not empty (looked at without the lock, every poller round).
    asked: AtomicBool,
}

impl Registrar {
    pub(crate) fn new() -> Registrar {
        // SAFETY: a plain system call; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        Registrar {
            // SAFETY: a fresh descriptor nothing else owns.
            wake: (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) }),
            asking: Mutex::new(Vec::new()),
            asked: AtomicBool::new(false),
        }
    }

    /// Session `id` has READ targets to register: the poller is woken for them.
    pub(crate) fn ask(&self, id: u64) {
        self.asking.lock().push(id);
        self.asked.store(true, Ordering::Release);
        if let Some(fd) = &self.wake {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from a live buffer to an eventfd. A full
            // counter (never, at one a request) would only fail the write: the
            // poller then finds the request on its next round.
            let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// The descriptor the poller waits on with the completion channel (-1, which
    /// `poll` skips, if there is none).
    pub(crate) fn fd(&self) -> RawFd {
        self.wake.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// Reads the wake-up's counter back to zero (after `poll` said it was set).
    pub(crate) fn consume_wake(&self) {
        if let Some(fd) = &self.wake {
            let mut count = [0u8; 8];
            // SAFETY: reads 8 bytes into a live buffer; non-blocking, so an empty
            // counter fails at once (nothing to consume).
            let _ = unsafe { libc::read(fd.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        }
    }

    /// The sessions that asked since the last call, into `ids`.
    pub(crate) fn take(&self, ids: &mut Vec<u64>) {
        let mut asking = self.asking.lock();
        self.asked.store(false, Ordering::Release);
        ids.extend(asking.drain(..));
    }

    /// Whether a session asked since the last [`Registrar::take`].
    pub(crate) fn asked(&self) -> bool {
        self.asked.load(Ordering::Acquire)
    }
}
