//! CM ids (`rdma_cm_id`): the RDMA counterpart of a socket.

use super::addr::{from_raw, RawAddr};
use super::channel::EventChannel;
use super::EventKind;
use crate::context::Context;
use crate::error::{check, Error, Result};
use crate::pd::ProtectionDomain;
use crate::qp::{Init, QpConfig, QpOwner, QueuePair, Rts, TransitionError};
use rdma_verbs_sys as sys;
use std::net::SocketAddr;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// The port space of an id: which transport the CM speaks for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortSpace {
    /// Reliable connected (RC QPs), ports like TCP's: what rping and most programs use.
    Tcp,
    /// Unreliable datagram (UD QPs).
    Udp,
    /// InfiniBand port space (any QP type).
    Ib,
}

impl PortSpace {
    pub(crate) fn raw(self) -> sys::rdma_port_space {
        match self {
            PortSpace::Tcp => sys::rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => sys::rdma_port_space::RDMA_PS_UDP,
            PortSpace::Ib => sys::rdma_port_space::RDMA_PS_IB,
        }
    }
}

/// Connection parameters of `connect` and `accept` (`struct rdma_conn_param`).
#[derive(Clone, Debug)]
pub struct ConnParam {
    /// Private data for the peer: at most 56 bytes with a connect, 196 with an accept
    /// (IB CM limits on the TCP port space).
    pub private_data: Vec<u8>,
    /// RDMA READs/atomics the peer may have outstanding against us.
    pub responder_resources: u8,
    /// RDMA READs/atomics we may have outstanding against the peer.
    pub initiator_depth: u8,
    /// Whether the hardware does end-to-end flow control (usually 1 or ignored).
    pub flow_control: u8,
    /// Transport retries (0..7).
    pub retry_count: u8,
    /// RNR retries (7 = forever).
    pub rnr_retry_count: u8,
}

impl Default for ConnParam {
    /// One outstanding READ each way, 7 retries, RNR retry forever (as rping).
    fn default() -> Self {
        ConnParam {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            flow_control: 1,
            retry_count: 7,
            rnr_retry_count: 7,
        }
    }
}

impl ConnParam {
    fn to_raw(&self, max: usize) -> Result<sys::rdma_conn_param> {
        if self.private_data.len() > max {
            return Err(Error::InvalidArgument(
                format!(
                    "{} bytes of private data, at most {max} fit",
                    self.private_data.len()
                )
                .into(),
            ));
        }
        Ok(sys::rdma_conn_param {
            private_data: if self.private_data.is_empty() {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: self.private_data.len() as u8,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// The device contexts librdmacm opened for its ids, wrapped. librdmacm closes a
/// device's context once no id uses it and the device has left the system (rdma-core
/// 31 on); each context seen here is pinned first ([`pin_device`]) so that it never
/// does, and these wrappers live in a static that is never dropped, so
/// `ibv_close_device` is never called on them by us either. A PD or region made on
/// such a context thus never outlives it, and no freed context's address can come
/// back as another.
static CONTEXTS: Mutex<Vec<Arc<Context>>> = Mutex::new(Vec::new());

fn context_of(raw: *mut sys::ibv_context) -> Option<Arc<Context>> {
    let raw = NonNull::new(raw)?;
    let mut all = CONTEXTS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = all.iter().find(|c| c.as_raw() == raw.as_ptr()) {
        return Some(c.clone());
    }
    if !pin_device(raw.as_ptr()) {
        return None;
    }
    // SAFETY: librdmacm's open context, pinned open for the life of the process;
    // the wrapper is kept in the static forever, so it never closes it.
    let ctx = Arc::new(unsafe { Context::from_raw(raw) });
    all.push(ctx.clone());
    Some(ctx)
}

/// Counts a use of every device librdmacm has open (`rdma_get_devices`), never given
/// back (the list is never freed with `rdma_free_devices`): librdmacm then never
/// closes their contexts. True if `raw` is among them; a device gone meanwhile is
/// not, and its id has no usable context.
fn pin_device(raw: *mut sys::ibv_context) -> bool {
    let mut n: std::os::raw::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the list returned is leaked on purpose.
    let list = unsafe { sys::rdma_get_devices(&mut n) };
    if list.is_null() {
        return false;
    }
    // SAFETY: librdmacm returns `n` valid entries.
    let devices = unsafe { std::slice::from_raw_parts(list, usize::try_from(n).unwrap_or(0)) };
    let found = devices.contains(&raw);
    if !found {
        // Not kept: this list pins nothing we wrap (and a retry would leak another).
        // SAFETY: returned by `rdma_get_devices` above, freed once.
        unsafe { sys::rdma_free_devices(list) };
    }
    found
}

/// The owner of one `rdma_cm_id`, destroyed with `rdma_destroy_id` when the last
/// handle (id, event, queue pair) goes.
pub(crate) struct IdInner {
    raw: NonNull<sys::rdma_cm_id>,
    /// The channel the id reports to (`None`: synchronous id of the endpoint API).
    channel: Mutex<Option<Arc<EventChannel>>>,
    /// What `raw->context` points to: a weak handle to `self`, so events find us.
    context: *mut Weak<IdInner>,
    /// Events fetched for this id and not yet acknowledged.
    pending: AtomicUsize,
    /// Held (with the channel's event lock, see [`IdInner::locked`]) by every call
    /// that reads or writes the id's fields (its addresses, device, port and queue
    /// pair): librdmacm writes them without a lock of its own.
    lock: Mutex<()>,
}

// SAFETY: librdmacm ids may be used from any thread; what librdmacm writes in the
// id without a lock of its own (addresses, device, port, `qp`) is read and written
// only under `IdInner::locked`, which excludes the channel's event processing too.
unsafe impl Send for IdInner {}
// SAFETY: as above.
unsafe impl Sync for IdInner {}

impl IdInner {
    /// Takes ownership of `raw`, pointing its context at the new owner.
    ///
    /// # Safety
    /// `raw` is null or a live id nothing else destroys, reporting to `channel`.
    pub(crate) unsafe fn adopt(
        raw: Option<NonNull<sys::rdma_cm_id>>,
        channel: Option<Arc<EventChannel>>,
    ) -> Option<Arc<IdInner>> {
        let raw = raw?;
        let inner = Arc::new_cyclic(|weak| IdInner {
            raw,
            channel: Mutex::new(channel),
            context: Box::into_raw(Box::new(weak.clone())),
            pending: AtomicUsize::new(0),
            lock: Mutex::new(()),
        });
        // SAFETY: the id is live and ours; `context` lives until after rdma_destroy_id.
        unsafe { (*raw.as_ptr()).context = inner.context.cast() };
        Some(inner)
    }

    /// The owner of `raw`, found through its context; `None` when it is being
    /// destroyed or the id is not one of ours.
    ///
    /// # Safety
    /// `raw` is null or an id with an unacknowledged event (so not yet destroyed).
    pub(crate) unsafe fn from_context(raw: *mut sys::rdma_cm_id) -> Option<Arc<IdInner>> {
        if raw.is_null() {
            return None;
        }
        // SAFETY: the id is alive (an event of it is unacknowledged), so its owner's
        // `rdma_destroy_id` has not returned and the boxed weak handle is alive.
        let ctx = unsafe { (*raw).context } as *const Weak<IdInner>;
        if ctx.is_null() {
            return None;
        }
        // SAFETY: as above.
        unsafe { (*ctx).upgrade() }
    }

    pub(crate) fn event_taken(&self) {
        self.pending.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn event_acked(&self) {
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }

    pub(crate) fn raw(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// Runs `f` while no other call of this id and no event processing of its
    /// channel runs: librdmacm writes the id's addresses, device and port while it
    /// fetches an event (`rdma_get_cm_event`, under the channel's event lock), and
    /// its address calls, queue pair calls and `rdma_destroy_qp` (under `lock`)
    /// read or write them and `id->qp` without a lock of their own.
    /// The channel slot is held throughout, so that a `migrate` cannot move the id
    /// to another channel meanwhile. Lock order: the channel slot, the channel's
    /// event lock, the id's lock (`migrate` takes them in the same order).
    pub(crate) fn locked<R>(&self, f: impl FnOnce() -> R) -> R {
        let channel = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        let _events = channel.as_ref().map(|c| c.event_lock());
        let _id = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        f()
    }
}

impl QpOwner for IdInner {
    unsafe fn destroy_qp(&self, qp: *mut sys::ibv_qp) -> i32 {
        // Under the id's and its channel's locks: a connect response being processed
        // (`rdma_get_cm_event`) or a disconnect on another thread uses `id->qp`.
        let mut ret = 0;
        self.locked(|| {
            // SAFETY: the id is alive (the QP holds it); `qp` is the QP created on it.
            // What `rdma_destroy_qp` does (its CQs are the caller's, so it destroys
            // none), but with the result: `id->qp` is cleared whatever it is, so
            // librdmacm never uses the QP again (a QP whose destroy failed is reset
            // by the caller).
            unsafe {
                ret = sys::ibv_destroy_qp(qp);
                if (*self.raw()).qp == qp {
                    (*self.raw()).qp = std::ptr::null_mut();
                }
            }
        });
        ret
    }

    fn serialized(&self, f: &mut dyn FnMut()) {
        // librdmacm modifies the QP under these locks: in event processing (a
        // connect response), `rdma_accept`, `rdma_disconnect`.
        self.locked(f)
    }
}

impl Drop for IdInner {
    fn drop(&mut self) {
        // SAFETY: the last handle is gone: no QP (it holds us) and no unacknowledged
        // event (events hold us), so rdma_destroy_id does not wait; destroyed once.
        let ret = unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
        if ret != 0 {
            // The id lives on in librdmacm, which may still hand out its context
            // and report to its channel: both leaked, not freed (a panic here would
            // abort an unwinding thread).
            let channel = self.channel.get_mut().unwrap_or_else(|e| e.into_inner());
            std::mem::forget(channel.take());
            return;
        }
        // SAFETY: created by Box::into_raw in `adopt`; the id is destroyed, so
        // librdmacm no longer reads it.
        drop(unsafe { Box::from_raw(self.context) });
    }
}

/// An RDMA CM id: resolves addresses, listens, connects, accepts and rejects.
///
/// Cloning gives another handle to the same id; the id is destroyed
/// (`rdma_destroy_id`) when the last handle, event or queue pair of it drops, and
/// its channel after it.
#[derive(Clone)]
pub struct CmId {
    inner: Arc<IdInner>,
}

impl CmId {
    /// Creates an id reporting to `channel` (`rdma_create_id`).
    pub fn new(channel: &Arc<EventChannel>, ps: PortSpace) -> Result<CmId> {
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is alive; `raw` is a valid out-pointer.
        check("rdma_create_id", unsafe {
            sys::rdma_create_id(channel.as_raw(), &mut raw, ptr::null_mut(), ps.raw())
        })?;
        // SAFETY: just created, owned by nobody else, on `channel`.
        let inner = unsafe { IdInner::adopt(NonNull::new(raw), Some(channel.clone())) }
            .ok_or_else(|| Error::verb("rdma_create_id", libc::ENOMEM))?;
        Ok(CmId { inner })
    }

    pub(crate) fn from_inner(inner: Arc<IdInner>) -> CmId {
        CmId { inner }
    }

    pub(crate) fn inner(&self) -> &Arc<IdInner> {
        &self.inner
    }

    /// The raw id; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::rdma_cm_id {
        self.inner.raw()
    }

    /// The channel the id reports to (`None` for a synchronous endpoint id).
    pub fn channel(&self) -> Option<Arc<EventChannel>> {
        self.inner
            .channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Binds to a local address and port (`rdma_bind_addr`); port 0 picks one.
    pub fn bind_addr(&self, addr: SocketAddr) -> Result<()> {
        let mut raw = RawAddr::new(addr);
        // SAFETY: the id is alive; `raw` is a valid sockaddr for the call.
        let ret = self
            .inner
            .locked(|| unsafe { sys::rdma_bind_addr(self.as_raw(), raw.as_mut_ptr()) });
        check("rdma_bind_addr", ret).map_err(|e| match e.errno() {
            Some(libc::EADDRINUSE) => e.with_hint(format!("port {} is taken", addr.port())),
            Some(libc::EADDRNOTAVAIL | libc::ENODEV) => e.with_hint(format!(
                "{} is not an address of an interface with an RDMA device",
                addr.ip()
            )),
            _ => e,
        })
    }

    /// Starts resolving `dst` (and `src`, if given) to a device and port
    /// (`rdma_resolve_addr`); `AddrResolved` or `AddrError` follows on the channel.
    pub fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let mut src = src.map(RawAddr::new);
        let mut dst_raw = RawAddr::new(dst);
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: the id is alive; the addresses are valid for the call.
        let ret = self.inner.locked(|| unsafe {
            sys::rdma_resolve_addr(
                self.as_raw(),
                src.as_mut().map_or(ptr::null_mut(), |s| s.as_mut_ptr()),
                dst_raw.as_mut_ptr(),
                ms,
            )
        });
        check("rdma_resolve_addr", ret)
            .map_err(|e| e.with_hint(format!("cannot resolve {dst} to an RDMA device")))
    }

    /// Starts resolving the route to the resolved address (`rdma_resolve_route`);
    /// `RouteResolved` or `RouteError` follows.
    pub fn resolve_route(&self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: the id is alive.
        let ret = self
            .inner
            .locked(|| unsafe { sys::rdma_resolve_route(self.as_raw(), ms) });
        check("rdma_resolve_route", ret)
    }

    /// Resolves address and route, waiting for both events on the id's channel, which
    /// must not be shared with other ids (their events would be taken here).
    pub fn resolve(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let channel = self.require_channel()?;
        self.resolve_addr(src, dst, timeout)?;
        // librdmacm's own timeout reports an error event; ours covers a silent CM.
        let wait = timeout + Duration::from_secs(2);
        channel.expect(EventKind::AddrResolved, "rdma_resolve_addr", wait)?;
        self.resolve_route(timeout)?;
        channel.expect(EventKind::RouteResolved, "rdma_resolve_route", wait)?;
        Ok(())
    }

    /// Listens for connect requests (`rdma_listen`); bind first. Each request comes as
    /// a `ConnectRequest` event carrying a new id.
    pub fn listen(&self, backlog: i32) -> Result<()> {
        // SAFETY: the id is alive.
        let ret = self
            .inner
            .locked(|| unsafe { sys::rdma_listen(self.as_raw(), backlog) });
        check("rdma_listen", ret)
    }

    /// Asks the peer to connect (`rdma_connect`); `Established`, `Rejected`,
    /// `Unreachable` or `ConnectError` follows.
    ///
    /// An id with no device yet (its address not resolved, or a listener on a
    /// wildcard address) is refused: librdmacm would read its missing device.
    pub fn connect(&self, param: &ConnParam) -> Result<()> {
        let mut raw = param.to_raw(56)?;
        let ret = self.inner.locked(|| {
            self.require_device("rdma_connect")?;
            // SAFETY: the id is alive and has its device (checked under the same
            // locks); `raw` and its private data live across the call (librdmacm
            // copies them); its QP, if any, is not destroyed meanwhile (locked).
            Ok::<_, Error>(unsafe { sys::rdma_connect(self.as_raw(), &mut raw) })
        })?;
        check("rdma_connect", ret).map_err(|e| e.with_hint("resolve the address and route first"))
    }

    /// Accepts the connection of a `ConnectRequest` id (`rdma_accept`). Refused, as
    /// `connect` is, for an id with no device (a listener is not a request).
    pub fn accept(&self, param: &ConnParam) -> Result<()> {
        let mut raw = param.to_raw(196)?;
        let ret = self.inner.locked(|| {
            self.require_device("rdma_accept")?;
            // SAFETY: as in `connect`.
            Ok::<_, Error>(unsafe { sys::rdma_accept(self.as_raw(), &mut raw) })
        })?;
        check("rdma_accept", ret)
    }

    /// That the id is bound to a device (`id->verbs`), which librdmacm's connect and
    /// accept read without a check: it sets the device when an address resolves or
    /// a bind names a device's address, and a connect request's id has one. Call
    /// under the id's locks (event processing sets it).
    fn require_device(&self, verb: &'static str) -> Result<()> {
        // SAFETY: the id is alive; its fields are read under its locks.
        let verbs = unsafe { (*self.as_raw()).verbs };
        if verbs.is_null() {
            return Err(Error::InvalidArgument(
                format!(
                    "{verb}: the id has no device yet: resolve the address and route \
                     first (wait for RouteResolved), or accept the id of a ConnectRequest \
                     event, not the listener"
                )
                .into(),
            ));
        }
        Ok(())
    }

    /// Refuses the connection of a `ConnectRequest` id, telling the peer why in
    /// `private_data` (at most 148 bytes) (`rdma_reject`).
    pub fn reject(&self, private_data: &[u8]) -> Result<()> {
        if private_data.len() > 148 {
            return Err(Error::InvalidArgument(
                "at most 148 bytes of private data fit in a reject".into(),
            ));
        }
        let ptr = if private_data.is_empty() {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: the id is alive; the data lives across the call.
        let ret = self
            .inner
            .locked(|| unsafe { sys::rdma_reject(self.as_raw(), ptr, private_data.len() as u8) });
        check("rdma_reject", ret)
    }

    /// Closes the connection (`rdma_disconnect`): the QP goes to the error state,
    /// outstanding work requests are flushed, both sides get `Disconnected`.
    pub fn disconnect(&self) -> Result<()> {
        // SAFETY: the id is alive; any QP on it is alive or was cleared from the id,
        // and is not destroyed during the call (locked).
        let ret = self
            .inner
            .locked(|| unsafe { sys::rdma_disconnect(self.as_raw()) });
        check("rdma_disconnect", ret)
    }

    /// Moves the id to another channel (`rdma_migrate_id`), e.g. one per connection
    /// thread. Fails instead of blocking while an event of the id is unacknowledged
    /// (for a listener: a connect request it received, which librdmacm counts
    /// against the listener, not the new id).
    pub fn migrate(&self, channel: &Arc<EventChannel>) -> Result<()> {
        let mut slot = self.inner.channel.lock().unwrap_or_else(|e| e.into_inner());
        // Both channels' event locks. The old one's: no event of this id can be
        // fetched (and not yet counted in `pending`) while the count is checked and
        // the id moves, so `rdma_migrate_id` never waits for an acknowledgement. The
        // new one's: its events are processed with the id's channel read from the
        // id, which `rdma_migrate_id` sets only after the kernel moved them.
        let old = slot.clone();
        let _events = EventChannel::event_locks(old.as_ref(), channel);
        if self.inner.pending.load(Ordering::Acquire) != 0 {
            return Err(Error::InvalidArgument(
                "drop the events of this id before migrating it (rdma_migrate_id would wait \
                 for their acknowledgement)"
                    .into(),
            ));
        }
        let _id = self.inner.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: the id and both channels are alive; the old channel stays alive
        // until after the call (held in `slot`).
        check("rdma_migrate_id", unsafe {
            sys::rdma_migrate_id(self.as_raw(), channel.as_raw())
        })?;
        *slot = Some(channel.clone());
        Ok(())
    }

    /// The device context the id is bound to (after address resolution, binding to a
    /// device's address, or for a connect request's id).
    pub fn context(&self) -> Result<Arc<Context>> {
        // SAFETY: the id is alive; its device is not written meanwhile (locked).
        let verbs = self.inner.locked(|| unsafe { (*self.as_raw()).verbs });
        if verbs.is_null() {
            return Err(Error::InvalidArgument(
                "the id has no device yet: resolve the address or bind to an RDMA \
                 interface's address first"
                    .into(),
            ));
        }
        context_of(verbs).ok_or_else(|| {
            Error::InvalidArgument(
                "the id's device is not among librdmacm's devices any more (removed?): \
                 create a new id"
                    .into(),
            )
        })
    }

    /// The port number of the device the id is bound to.
    pub fn port_num(&self) -> u8 {
        // SAFETY: the id is alive; its port is not written meanwhile (locked).
        self.inner.locked(|| unsafe { (*self.as_raw()).port_num })
    }

    /// The local address (`rdma_get_local_addr`).
    pub fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is alive; the address lives in it and is read (copied
        // out) while nothing writes it (locked).
        self.inner
            .locked(|| unsafe { from_raw(sys::rdma_get_local_addr(self.as_raw())) })
    }

    /// The peer's address (`rdma_get_peer_addr`).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        self.inner
            .locked(|| unsafe { from_raw(sys::rdma_get_peer_addr(self.as_raw())) })
    }

    /// Creates the id's queue pair (`rdma_create_qp`) on `pd` (of the id's device)
    /// with `config`'s CQs and sizes. The CM brings it to INIT (a UDP id's all the
    /// way to RTS, which the type then understates: it allows less, never more), so
    /// receives can be posted before `connect`/`accept`; after `Established` turn it into a
    /// `QueuePair<Rts>` with [`established`]. The QP is destroyed (as
    /// `rdma_destroy_qp` does) when dropped, before the id.
    pub fn create_qp(
        &self,
        pd: &Arc<ProtectionDomain>,
        config: &QpConfig,
    ) -> Result<QueuePair<Init>> {
        self.inner.locked(|| self.create_qp_locked(pd, config))
    }

    /// [`CmId::create_qp`], under the id's locks.
    fn create_qp_locked(
        &self,
        pd: &Arc<ProtectionDomain>,
        config: &QpConfig,
    ) -> Result<QueuePair<Init>> {
        crate::context::check_provider_locks()?;
        config.check_context(pd, "rdma_create_qp")?;
        let mut init = config.to_raw();
        // SAFETY: the id is alive.
        if !unsafe { (*self.as_raw()).qp }.is_null() {
            return Err(Error::InvalidArgument(
                "the id already has a queue pair".into(),
            ));
        }
        // SAFETY: the id, PD and CQs are alive, the CQs of the PD's context
        // (checked; librdmacm checks the PD's against the id's); `init` is fully
        // initialised.
        check("rdma_create_qp", unsafe {
            sys::rdma_create_qp(self.as_raw(), pd.as_raw(), &mut init)
        })
        .map_err(|e| match e.errno() {
            Some(libc::EINVAL) => e.with_hint(
                "the PD must belong to the id's device (CmId::context) and the id must \
                 have resolved its address",
            ),
            _ => e.with_hint("are the queue depths within the device's limits?"),
        })?;
        // SAFETY: rdma_create_qp succeeded and stored the QP in the id.
        let raw = NonNull::new(unsafe { (*self.as_raw()).qp })
            .ok_or_else(|| Error::verb("rdma_create_qp", libc::EIO))?;
        // SAFETY: the QP is alive; its user context was ours to give (null).
        if !unsafe { (*raw.as_ptr()).qp_context }.is_null() {
            // SAFETY: created just above, not wrapped: destroyed here, once.
            unsafe { sys::rdma_destroy_qp(self.as_raw()) };
            return Err(Error::verb("rdma_create_qp", libc::EINVAL)
                .with_hint("librdmacm set the QP's user context, which rdma-safe needs"));
        }
        let owner: Arc<dyn QpOwner> = self.inner.clone();
        // SAFETY: the CM created the QP on `pd` with these CQs and moved it to INIT
        // (its connected-QP setup); the id destroys it through `owner`.
        let qp: QueuePair<Init> =
            unsafe { QueuePair::from_owner(raw, pd, config, init.cap, owner) };
        Ok(qp)
    }
}

/// Turns the queue pair of a connected id into `QueuePair<Rts>` once the CM has moved
/// it there (after `Established` on the active side, after `accept` on the passive
/// side). The state is checked with `ibv_query_qp`; a QP that is not in RTS comes
/// back unchanged with the error.
pub fn established(
    qp: QueuePair<Init>,
) -> std::result::Result<QueuePair<Rts>, TransitionError<QueuePair<Init>>> {
    match qp.query_state() {
        Ok(sys::ibv_qp_state::IBV_QPS_RTS) => Ok(qp.retype()),
        Ok(state) => Err(TransitionError {
            qp,
            error: Error::InvalidArgument(
                format!("the CM has not connected this queue pair yet (state {state:?})").into(),
            ),
        }),
        Err(error) => Err(TransitionError { qp, error }),
    }
}

impl CmId {
    fn require_channel(&self) -> Result<Arc<EventChannel>> {
        self.channel().ok_or_else(|| {
            Error::InvalidArgument("a synchronous id has no event channel to wait on".into())
        })
    }
}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr())
            .field("peer", &self.peer_addr())
            .finish()
    }
}
