//! Event channels (`rdma_create_event_channel`): where the CM reports what happened to
//! the ids created on it.

use super::event::CmEvent;
use super::id::{CmId, IdInner};
use crate::channel::{set_nonblocking, wait_readable, Deadline};
use crate::error::{Error, Result};
use rdma_verbs_sys as sys;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// An RDMA CM event channel. Ids created on it hold it alive (`Arc`), so it is
/// destroyed after the last of them.
///
/// Its descriptor is non-blocking and exposed through [`AsFd`]: epoll, mio or tokio
/// can wait for readability and then call [`EventChannel::get_event`] with a zero
/// timeout.
pub struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
    /// Held while librdmacm fetches an event (`rdma_get_cm_event`): it then writes
    /// the fields of the event's id (addresses, device, port) and, for a connect
    /// response, moves the id's queue pair, with no lock of its own. The id's own
    /// calls take it too ([`IdInner::locked`]).
    events: Mutex<()>,
}

// SAFETY: the channel is a file descriptor; librdmacm allows any thread to read it.
unsafe impl Send for EventChannel {}
// SAFETY: as above; concurrent readers each get whole events.
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Opens a channel (`rdma_create_event_channel`; librdmacm opens every device
    /// on its first). Refused while `MLX5_SINGLE_THREADED` is `1`, as
    /// [`crate::Device::open`] is.
    pub fn new() -> Result<Arc<Self>> {
        crate::context::check_provider_locks()?;
        // SAFETY: no arguments; returns null with errno on failure.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let raw = NonNull::new(raw).ok_or_else(|| {
            let e = Error::last("rdma_create_event_channel");
            match e.errno() {
                Some(libc::EMFILE | libc::ENFILE) => e.with_hint(
                    "the process (or the system) has no file descriptor left: close some, \
                     or raise the limit (ulimit -n)",
                ),
                _ => e.with_hint("is the rdma_ucm kernel module loaded (/dev/infiniband/rdma_cm)?"),
            }
        })?;
        let channel = EventChannel {
            raw,
            events: Mutex::new(()),
        };
        set_nonblocking(channel.as_raw_fd())?;
        Ok(Arc::new(channel))
    }

    /// The raw channel; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// The lock librdmacm's event processing runs under (see `events`).
    pub(crate) fn event_lock(&self) -> MutexGuard<'_, ()> {
        self.events.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The event locks of `a` (if any) and `b`, each once, in address order (so that
    /// two threads taking both never wait on each other).
    pub(crate) fn event_locks<'a>(
        a: Option<&'a Arc<EventChannel>>,
        b: &'a Arc<EventChannel>,
    ) -> Vec<MutexGuard<'a, ()>> {
        let mut channels: Vec<&'a Arc<EventChannel>> = a.into_iter().chain([b]).collect();
        channels.sort_by_key(|c| Arc::as_ptr(c));
        channels.dedup_by(|x, y| Arc::ptr_eq(x, y));
        channels.into_iter().map(|c| c.event_lock()).collect()
    }

    /// Waits up to `timeout` (forever if `None`) for the next event of any id on this
    /// channel. `Ok(None)` when the time passed. The event is acknowledged
    /// (`rdma_ack_cm_event`) when it is dropped.
    ///
    /// Events of ids that are being destroyed are acknowledged and skipped.
    pub fn get_event(self: &Arc<Self>, timeout: Option<Duration>) -> Result<Option<CmEvent>> {
        let mut deadline = Deadline::after(timeout);
        loop {
            if !wait_readable(self.as_raw_fd(), &mut deadline)? {
                return Ok(None);
            }
            let mut raw = ptr::null_mut();
            // Non-blocking (the descriptor is): the lock is held only while an
            // event that is there is fetched, processed and counted as its id's
            // (`wrap_event`), so `migrate` sees every event fetched for its id.
            let events = self.event_lock();
            // SAFETY: the channel is alive; `raw` is a valid out-pointer.
            let ret = unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut raw) };
            if ret != 0 {
                let err = Error::last("rdma_get_cm_event");
                if err.errno() == Some(libc::EAGAIN) {
                    continue; // another thread took it
                }
                return Err(err);
            }
            let Some(raw) = NonNull::new(raw) else {
                continue;
            };
            // SAFETY: `raw` is an event just returned and not yet acknowledged.
            let event = unsafe { self.wrap_event(raw) };
            drop(events);
            if let Some(event) = event {
                return Ok(Some(event));
            }
        }
    }

    /// Waits up to `timeout` for the next event and requires it to be `wanted` with a
    /// zero status; anything else becomes an error naming what came instead (the
    /// failing `verb`'s name is used in it). For a channel used by one id.
    pub fn expect(
        self: &Arc<Self>,
        wanted: super::EventKind,
        verb: &'static str,
        timeout: Duration,
    ) -> Result<CmEvent> {
        match self.get_event(Some(timeout))? {
            None => Err(Error::verb(verb, libc::ETIMEDOUT).with_hint(format!(
                "no {wanted:?} event within {timeout:?}: is the peer alive and reachable?"
            ))),
            Some(ev) if ev.kind() == wanted && ev.status() == 0 => Ok(ev),
            Some(ev) => Err(ev.to_error(verb)),
        }
    }

    /// Wraps a fetched event, or acknowledges it and returns `None` when its id is
    /// gone (being destroyed) or not ours.
    ///
    /// # Safety
    /// `raw` is an unacknowledged event fetched from this channel.
    unsafe fn wrap_event(self: &Arc<Self>, raw: NonNull<sys::rdma_cm_event>) -> Option<CmEvent> {
        // SAFETY: the event is valid until acknowledged.
        let ev = unsafe { raw.as_ref() };
        let kind = super::EventKind::from_raw(ev.event);
        let ids = if kind == super::EventKind::ConnectRequest {
            // A new id for the incoming connection, on this channel; its context
            // is still the listener's, which we read first.
            // SAFETY: listen_id is the live listener this request came to.
            let listener = unsafe { IdInner::from_context(ev.listen_id) };
            // SAFETY: `ev.id` is the new id librdmacm created for this request; we
            // take ownership of it (rdma_destroy_id when the last handle goes).
            let child = unsafe { IdInner::adopt(NonNull::new(ev.id), Some(self.clone())) };
            match (listener, child) {
                (Some(l), Some(c)) => Some((CmId::from_inner(c), Some(CmId::from_inner(l)))),
                (l, c) => {
                    // The listener is being destroyed (or the request has no id): the
                    // event is acknowledged first, then the handles go, since
                    // `rdma_destroy_id` of either would wait for this event.
                    // SAFETY: the event is ours to acknowledge, once.
                    unsafe { sys::rdma_ack_cm_event(raw.as_ptr()) };
                    drop((l, c));
                    return None;
                }
            }
        } else {
            // SAFETY: `ev.id` is an id on this channel; its context is ours or null.
            unsafe { IdInner::from_context(ev.id) }.map(|i| (CmId::from_inner(i), None))
        };
        match ids {
            // SAFETY: `raw` is unacknowledged; the event takes it over.
            Some((id, listener)) => Some(unsafe { CmEvent::new(raw, kind, id, listener) }),
            None => {
                // SAFETY: the event is ours to acknowledge, once.
                unsafe { sys::rdma_ack_cm_event(raw.as_ptr()) };
                None
            }
        }
    }
}

impl AsFd for EventChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: the descriptor is open as long as the channel lives.
        unsafe { BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is alive.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc to it, so none is left;
        // destroyed once.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) };
    }
}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.as_raw_fd())
            .finish()
    }
}
