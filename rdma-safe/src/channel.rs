//! Completion channels (`ibv_create_comp_channel`): sleep until a completion queue has
//! something, instead of spinning on `ibv_poll_cq`.
//!
//! The usual loop, which never loses a wake-up:
//! 1. `cq.req_notify(false)`;
//! 2. poll the CQ empty (completions that arrived before the request are there);
//! 3. `cq.wait(timeout)`, then go to 1.
//!
//! The channel's file descriptor is non-blocking and exposed through [`AsFd`], so
//! epoll, mio or tokio can wait on it instead of [`CompletionQueue::wait`].

use crate::context::Context;
use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A completion channel. CQs created on it hold it alive.
pub struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    ctx: Arc<Context>,
}

// SAFETY: the channel is a file descriptor wrapper; libibverbs allows any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: as above.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// Creates a channel; its descriptor is made non-blocking.
    pub fn new(ctx: &Arc<Context>) -> Result<Arc<Self>> {
        // SAFETY: the context is open.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx.as_raw()) };
        let raw = NonNull::new(raw).ok_or_else(|| Error::last("ibv_create_comp_channel"))?;
        let channel = CompletionChannel {
            raw,
            ctx: ctx.clone(),
        };
        set_nonblocking(channel.as_raw_fd())?;
        Ok(Arc::new(channel))
    }

    /// The device context.
    pub fn context(&self) -> &Arc<Context> {
        &self.ctx
    }

    /// The raw channel; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::ibv_comp_channel {
        self.raw.as_ptr()
    }

    /// Reads one event, acknowledging it at once; for channels shared by several CQs.
    /// Returns the raw CQ it is for (compare with [`CompletionQueue::as_raw`]), or
    /// `None` when `timeout` passed first.
    pub fn get_event(&self, timeout: Option<Duration>) -> Result<Option<*mut sys::ibv_cq>> {
        let Some(cq) = self.read_event(&mut Deadline::after(timeout))? else {
            return Ok(None);
        };
        // SAFETY: the kernel reported this event for `cq`, so `ibv_destroy_cq` of it
        // waits for this acknowledgement: the pointer is valid here.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        Ok(Some(cq))
    }

    /// Waits until `deadline` and reads one event.
    pub(crate) fn read_event(&self, deadline: &mut Deadline) -> Result<Option<*mut sys::ibv_cq>> {
        loop {
            if !wait_readable(self.as_raw_fd(), deadline)? {
                return Ok(None);
            }
            let mut cq = ptr::null_mut();
            let mut user = ptr::null_mut();
            // SAFETY: the channel is alive; both out-pointers are valid.
            let ret = unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut user) };
            if ret == 0 {
                return Ok(Some(cq));
            }
            let err = std::io::Error::last_os_error();
            // Another thread took the event first: wait again.
            if err.raw_os_error() != Some(libc::EAGAIN) {
                return Err(Error::last("ibv_get_cq_event"));
            }
        }
    }
}

impl AsFd for CompletionChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is open as long as the channel lives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is alive.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on this channel holds an Arc to it, so none is left.
        let ret = unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
        debug_assert_eq!(ret, 0, "ibv_destroy_comp_channel failed");
    }
}

impl std::fmt::Debug for CompletionChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}

/// Makes `fd` non-blocking.
pub(crate) fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; no pointers involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(Error::last("fcntl(O_NONBLOCK)"));
    }
    Ok(())
}

/// A wait's time limit. The clock is read only where it must be: never for an
/// unlimited or zero timeout, and once for any other wait whose first `poll` ends
/// it (on some machines, a virtual one with an emulated HPET for instance, every
/// clock read is a system call of about a microsecond).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    timeout: Option<Duration>,
    start: Option<Instant>,
    /// No `poll` has waited yet: the whole timeout is left.
    fresh: bool,
}

impl Deadline {
    /// Starts a wait of at most `timeout` (`None`: no limit).
    pub(crate) fn after(timeout: Option<Duration>) -> Self {
        let start = match timeout {
            Some(t) if !t.is_zero() => Some(Instant::now()),
            _ => None,
        };
        Deadline {
            timeout,
            start,
            fresh: true,
        }
    }

    /// What is left, as `poll`'s timeout in milliseconds (-1: no limit), rounded up
    /// so that a sub-millisecond remainder still waits.
    fn poll_ms(&mut self) -> i32 {
        let left = match (self.timeout, self.start) {
            (None, _) => return -1,
            (Some(_), None) => return 0,
            (Some(t), Some(_)) if self.fresh => t,
            (Some(t), Some(s)) => t.saturating_sub(s.elapsed()),
        };
        self.fresh = false;
        left.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    }
}

/// Waits until `fd` is readable (`true`) or the deadline passes (`false`). Retries
/// on EINTR.
pub(crate) fn wait_readable(fd: RawFd, deadline: &mut Deadline) -> Result<bool> {
    loop {
        let ms = deadline.poll_ms();
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n > 0 {
            return Ok(true);
        }
        if n == 0 {
            return Ok(false);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::last("poll"));
        }
    }
}

/// Waits until one of `fds` is readable (or hung up), for at most `timeout`
/// (`None`: no limit); returns which are, all `false` when the time passed or a
/// signal interrupted the wait. The one `poll` wrapper for programs that wait on
/// a completion channel, an RDMA CM event channel and a socket together.
///
/// ```
/// use std::os::fd::AsRawFd;
/// let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
/// let ready = rdma_safe::poll_readable([a.as_raw_fd()], Some(std::time::Duration::ZERO));
/// assert_eq!(ready.unwrap(), [false]);
/// ```
pub fn poll_readable<const N: usize>(
    fds: [RawFd; N],
    timeout: Option<Duration>,
) -> Result<[bool; N]> {
    let mut pfds = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let ms = timeout.map_or(-1, |t| {
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    });
    // SAFETY: `pfds` is an array of `N` valid pollfd entries.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), N as libc::nfds_t, ms) };
    if n < 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::io("poll", err));
        }
        return Ok([false; N]);
    }
    Ok(pfds.map(|p| p.revents != 0))
}

/// Events acknowledged together (`ibv_ack_cq_events` takes a lock; batching saves it).
pub(crate) const ACK_BATCH: u32 = 16;

impl CompletionQueue {
    /// Asks for an event on the CQ's channel at the next completion
    /// (`solicited_only`: only at the next solicited one or error).
    pub fn req_notify(&self, solicited_only: bool) -> Result<()> {
        if self.channel().is_none() {
            return Err(Error::InvalidArgument(
                "this completion queue has no completion channel".into(),
            ));
        }
        // SAFETY: the CQ is alive.
        let ret = unsafe { sys::ibv_req_notify_cq(self.as_raw(), solicited_only as i32) };
        crate::error::check("ibv_req_notify_cq", ret)
    }

    /// Sleeps until this CQ's channel reports an event for it, or `timeout` passes
    /// (`Ok(false)`). Acknowledgements are batched and completed on drop. Use one
    /// waiter per channel; a channel shared by several CQs wants
    /// [`CompletionChannel::get_event`].
    pub fn wait(&self, timeout: Option<Duration>) -> Result<bool> {
        let channel = self.channel().ok_or_else(|| {
            Error::InvalidArgument("this completion queue has no completion channel".into())
        })?;
        let mut deadline = Deadline::after(timeout);
        loop {
            let Some(cq) = channel.read_event(&mut deadline)? else {
                return Ok(false);
            };
            if cq == self.as_raw() {
                self.count_event();
                return Ok(true);
            }
            // An event of another CQ on a shared channel: acknowledge it right away.
            // SAFETY: the kernel reported it, so that CQ is not destroyed before this.
            unsafe { sys::ibv_ack_cq_events(cq, 1) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Deadline;
    use std::time::Duration;

    #[test]
    fn deadlines_give_poll_what_is_left() {
        assert_eq!(Deadline::after(None).poll_ms(), -1, "no limit");
        assert_eq!(Deadline::after(Some(Duration::ZERO)).poll_ms(), 0);
        let mut d = Deadline::after(Some(Duration::from_micros(2500)));
        assert_eq!(d.poll_ms(), 3, "the whole timeout, rounded up");
        std::thread::sleep(Duration::from_millis(3));
        assert_eq!(d.poll_ms(), 0, "nothing left after it passed");
        let mut d = Deadline::after(Some(Duration::from_secs(60)));
        d.poll_ms();
        let left = d.poll_ms();
        assert!((59_000..=60_000).contains(&left), "{left}");
    }
}
