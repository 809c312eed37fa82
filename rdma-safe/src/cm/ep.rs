//! The synchronous endpoint API of `rdma_verbs.h`: `rdma_getaddrinfo`,
//! `rdma_create_ep`, listen / `get_request` / accept or connect, `rdma_reg_msgs`,
//! `rdma_post_send/recv/read/write` and `rdma_get_send_comp`/`rdma_get_recv_comp`.
//!
//! Differences from C, all so that nothing blocks forever:
//! - `rdma_create_ep` makes a synchronous id; [`Endpoint::create`] moves it to an
//!   event channel of its own (`rdma_migrate_id`), and every wait (`get_request`,
//!   `connect`, `accept`, completions) takes a timeout.
//! - The QP, its PD and its two CQs (each with a completion channel, as
//!   `rdma_create_ep` makes them) are rdma-safe objects; the C `rdma_get_*_comp`
//!   poll the CQs librdmacm created itself, so [`Endpoint::get_send_comp`] and
//!   [`Endpoint::get_recv_comp`] do the same poll / notify / poll / wait on ours.
//! - Posting goes through the C `rdma_post_*` (on the id's QP) and is `unsafe` with
//!   the crate's rule: the buffer stays alive and untouched until its completion.
//!
//! ```no_run
//! use rdma_safe::cm::ep::{AddrInfo, EpConfig, Endpoint};
//! use std::time::Duration;
//! let t = Duration::from_secs(5);
//! let info = AddrInfo::new(Some("198.18.0.1"), "7471", false)?; // active side
//! let mut ep = Endpoint::create(&info, &EpConfig::default())?;
//! let msg = ep.reg_msgs(16)?;
//! // SAFETY: `msg` outlives the receive's completion, polled below, and is not
//! // read before it.
//! unsafe { ep.post_recv(1, &msg, 0..16)? };
//! ep.connect(&Default::default(), t)?;
//! let mut send = ep.reg_msgs(16)?;
//! send.as_mut_slice()?.fill(b'x'); // local-only memory: a plain slice
//! // SAFETY: `send` is untouched until its completion, polled below.
//! unsafe { ep.post_send(2, &send, 0..16, true)? };
//! ep.get_send_comp(t)?;
//! ep.get_recv_comp(t)?;
//! println!("{:?}", msg.as_slice()?); // the receive is complete
//! ep.disconnect()?;
//! # Ok::<(), rdma_safe::Error>(())
//! ```

use super::addr::from_raw;
use super::id::{CmId, ConnParam, IdInner};
use super::{established, EventChannel, EventKind};
use crate::access::Access;
use crate::channel::CompletionChannel;
use crate::cq::{CompletionQueue, WorkCompletion};
use crate::error::{check, Error, Result};
use crate::mr::MemoryRegion;
use crate::pd::ProtectionDomain;
use crate::qp::{Init, QpConfig, QueuePair, Rts, TransitionError};
use rdma_verbs_sys as sys;
use std::ffi::CString;
use std::net::SocketAddr;
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The result of `rdma_getaddrinfo`, freed with `rdma_freeaddrinfo`.
pub struct AddrInfo {
    raw: NonNull<sys::rdma_addrinfo>,
}

// SAFETY: read-only data owned by this value.
unsafe impl Send for AddrInfo {}
// SAFETY: as above.
unsafe impl Sync for AddrInfo {}

impl AddrInfo {
    /// Resolves `node` and `service` (a port number) for the TCP port space and RC
    /// QPs: `passive` for a server (`RAI_PASSIVE`; `node` may be `None` for any
    /// address), else for a client.
    pub fn new(node: Option<&str>, service: &str, passive: bool) -> Result<AddrInfo> {
        // librdmacm starts up here (older builds opened every device then).
        crate::context::check_provider_locks()?;
        let node_c = node
            .map(CString::new)
            .transpose()
            .map_err(|_| Error::InvalidArgument("NUL in the node name".into()))?;
        let service_c = CString::new(service)
            .map_err(|_| Error::InvalidArgument("NUL in the service".into()))?;
        // SAFETY: all-zero is a valid `rdma_addrinfo` hint (null pointers, zero sizes).
        let mut hints: sys::rdma_addrinfo = unsafe { std::mem::zeroed() };
        if passive {
            hints.ai_flags = sys::RAI_PASSIVE as i32;
        }
        hints.ai_port_space = sys::rdma_port_space::RDMA_PS_TCP.0 as i32;
        hints.ai_qp_type = sys::ibv_qp_type::IBV_QPT_RC.0 as i32;
        let mut res = ptr::null_mut();
        // SAFETY: the strings and hints live across the call; `res` is an out-pointer.
        let ret = unsafe {
            sys::rdma_getaddrinfo(
                node_c.as_ref().map_or(ptr::null(), |c| c.as_ptr()),
                service_c.as_ptr(),
                &hints,
                &mut res,
            )
        };
        check("rdma_getaddrinfo", ret).map_err(|e| {
            e.with_hint(format!(
                "cannot resolve {}:{service} for RDMA",
                node.unwrap_or("*")
            ))
        })?;
        let raw = NonNull::new(res).ok_or_else(|| Error::verb("rdma_getaddrinfo", libc::ENOENT))?;
        Ok(AddrInfo { raw })
    }

    /// The source address, if any (the bound address of a passive result).
    pub fn src_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the result is alive; the address is null or valid.
        unsafe { from_raw((*self.raw.as_ptr()).ai_src_addr) }
    }

    /// The destination address, if any.
    pub fn dst_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as above.
        unsafe { from_raw((*self.raw.as_ptr()).ai_dst_addr) }
    }

    /// The raw list; it stays owned by `self`.
    pub fn as_raw(&self) -> *mut sys::rdma_addrinfo {
        self.raw.as_ptr()
    }
}

impl Drop for AddrInfo {
    fn drop(&mut self) {
        // SAFETY: returned by rdma_getaddrinfo, freed once.
        unsafe { sys::rdma_freeaddrinfo(self.raw.as_ptr()) };
    }
}

/// Queue sizes of an endpoint's QP (as `struct ibv_qp_init_attr` of `rdma_create_ep`).
#[derive(Clone, Copy, Debug)]
pub struct EpConfig {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Bytes that may be sent inline.
    pub max_inline_data: u32,
    /// Signal every send.
    pub sq_sig_all: bool,
}

impl Default for EpConfig {
    /// One send, one receive, 16 bytes inline (what rdmacm's `rdma_client` asks for).
    fn default() -> Self {
        EpConfig {
            max_send_wr: 1,
            max_recv_wr: 1,
            max_inline_data: 16,
            sq_sig_all: true,
        }
    }
}

enum Qp {
    None,
    Init(QueuePair<Init>),
    Rts(QueuePair<Rts>),
}

/// An endpoint: a CM id with its own event channel and, once it has a device, a PD,
/// send and receive CQs with completion channels, and an RC QP.
pub struct Endpoint {
    id: CmId,
    events: Arc<EventChannel>,
    config: EpConfig,
    pd: Option<Arc<ProtectionDomain>>,
    send_cq: Option<Arc<CompletionQueue>>,
    recv_cq: Option<Arc<CompletionQueue>>,
    qp: Qp,
    /// The peer's `Disconnected` arrived: completions already under way are still
    /// returned for a short grace period, then waits fail.
    gone: AtomicBool,
}

/// How long completions are still awaited after the peer disconnected (its last
/// message and our acknowledgements may trail the CM's event).
const GRACE: Duration = Duration::from_millis(500);

impl Endpoint {
    /// `rdma_create_ep` on the first result of `info`: a passive result gives a bound
    /// id to [`listen`](Self::listen) on; an active one an id with its address and
    /// route resolved, and its QP (in INIT: post receives before connecting).
    pub fn create(info: &AddrInfo, config: &EpConfig) -> Result<Endpoint> {
        crate::context::check_provider_locks()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `info` is alive; no PD and no QP attributes (created below).
        check("rdma_create_ep", unsafe {
            sys::rdma_create_ep(&mut raw, info.as_raw(), ptr::null_mut(), ptr::null_mut())
        })
        .map_err(|e| {
            e.with_hint("is the address on an interface with an RDMA device (and reachable)?")
        })?;
        // SAFETY: a new synchronous id nobody else destroys.
        let inner = unsafe { IdInner::adopt(NonNull::new(raw), None) }
            .ok_or_else(|| Error::verb("rdma_create_ep", libc::ENOMEM))?;
        let id = CmId::from_inner(inner);
        let events = EventChannel::new()?;
        id.migrate(&events)?;
        Self::with_id(id, events, *config)
    }

    fn with_id(id: CmId, events: Arc<EventChannel>, config: EpConfig) -> Result<Endpoint> {
        let mut ep = Endpoint {
            id,
            events,
            config,
            pd: None,
            send_cq: None,
            recv_cq: None,
            qp: Qp::None,
            gone: AtomicBool::new(false),
        };
        let raw = ep.id.as_raw();
        // SAFETY: the id is alive; its device is not written meanwhile (locked).
        let verbs = ep.id.inner().locked(|| unsafe { (*raw).verbs });
        if !verbs.is_null() {
            ep.create_qp()?;
        }
        Ok(ep)
    }

    fn create_qp(&mut self) -> Result<()> {
        let ctx = self.id.context()?;
        let pd = ProtectionDomain::new(&ctx)?;
        let cq = |depth: u32| -> Result<Arc<CompletionQueue>> {
            let channel = CompletionChannel::new(&ctx)?;
            CompletionQueue::with_channel(&ctx, depth.max(1), &channel, 0)
        };
        let send_cq = cq(self.config.max_send_wr)?;
        let recv_cq = cq(self.config.max_recv_wr)?;
        let mut qc = QpConfig::rc(&send_cq);
        qc.recv_cq = recv_cq.clone();
        qc.max_send_wr = self.config.max_send_wr;
        qc.max_recv_wr = self.config.max_recv_wr;
        qc.max_inline_data = self.config.max_inline_data;
        qc.sq_sig_all = self.config.sq_sig_all;
        self.qp = Qp::Init(self.id.create_qp(&pd, &qc)?);
        self.pd = Some(pd);
        self.send_cq = Some(send_cq);
        self.recv_cq = Some(recv_cq);
        Ok(())
    }

    /// The connected queue pair (`None` before the connection is established), for
    /// posting with the crate's own work requests.
    pub fn qp(&self) -> Option<&QueuePair<Rts>> {
        match &self.qp {
            Qp::Rts(qp) => Some(qp),
            _ => None,
        }
    }

    /// The CM id.
    pub fn id(&self) -> &CmId {
        &self.id
    }

    /// The endpoint's protection domain (after it has a device).
    pub fn pd(&self) -> Result<&Arc<ProtectionDomain>> {
        self.pd
            .as_ref()
            .ok_or_else(|| Error::InvalidArgument("a listening endpoint has no PD".into()))
    }

    /// Listens for connections (`rdma_listen`).
    pub fn listen(&self, backlog: i32) -> Result<()> {
        self.id.listen(backlog)
    }

    /// Waits up to `timeout` for a connection request (`rdma_get_request`): the new
    /// endpoint has its QP in INIT, ready for receives before [`accept`](Self::accept).
    pub fn get_request(&self, timeout: Duration) -> Result<Endpoint> {
        let deadline = crate::deadline::instant_after(timeout);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let Some(ev) = self.events.get_event(Some(left))? else {
                return Err(Error::verb("rdma_get_request", libc::ETIMEDOUT)
                    .with_hint(format!("no connection request within {timeout:?}")));
            };
            if ev.kind() != EventKind::ConnectRequest {
                continue;
            }
            let id = ev.id().clone();
            drop(ev);
            let own = EventChannel::new()?;
            id.migrate(&own)?;
            return Self::with_id(id, own, self.config);
        }
    }

    fn wait_established(&mut self, verb: &'static str, timeout: Duration) -> Result<()> {
        let ev = self.events.get_event(Some(timeout))?.ok_or_else(|| {
            Error::verb(verb, libc::ETIMEDOUT).with_hint(format!(
                "the connection was not established within {timeout:?}"
            ))
        })?;
        if ev.kind() != EventKind::Established {
            return Err(ev.to_error(verb));
        }
        drop(ev);
        self.qp = match std::mem::replace(&mut self.qp, Qp::None) {
            Qp::Init(qp) => match established(qp) {
                Ok(qp) => Qp::Rts(qp),
                // The queue pair stays the endpoint's (in Init): dropping it here
                // would leave the endpoint without one for good.
                Err(TransitionError { qp, error }) => {
                    self.qp = Qp::Init(qp);
                    return Err(error);
                }
            },
            other => other,
        };
        Ok(())
    }

    /// Connects (`rdma_connect`) and waits for the connection.
    pub fn connect(&mut self, param: &ConnParam, timeout: Duration) -> Result<()> {
        self.id.connect(param)?;
        self.wait_established("rdma_connect", timeout)
    }

    /// Accepts a requested connection (`rdma_accept`) and waits for it.
    pub fn accept(&mut self, param: &ConnParam, timeout: Duration) -> Result<()> {
        self.id.accept(param)?;
        self.wait_established("rdma_accept", timeout)
    }

    /// Disconnects (`rdma_disconnect`).
    pub fn disconnect(&self) -> Result<()> {
        self.id.disconnect()
    }

    /// Registers a message buffer for sends and receives (`rdma_reg_msgs`).
    pub fn reg_msgs(&self, len: usize) -> Result<MemoryRegion> {
        MemoryRegion::new(self.pd()?, len, Access::LOCAL_WRITE)
    }

    /// Registers a buffer the peer may RDMA READ (`rdma_reg_read`).
    pub fn reg_read(&self, len: usize) -> Result<MemoryRegion> {
        MemoryRegion::new(self.pd()?, len, Access::LOCAL_WRITE | Access::REMOTE_READ)
    }

    /// Registers a buffer the peer may RDMA WRITE (`rdma_reg_write`).
    pub fn reg_write(&self, len: usize) -> Result<MemoryRegion> {
        MemoryRegion::new(self.pd()?, len, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
    }

    /// The address of `range` of `mr`, for a post's one entry. An empty range, or
    /// one of 2 GiB or more, is refused (see [what a posted request may
    /// touch](crate::wr#what-a-posted-request-may-touch)).
    fn buffer(mr: &MemoryRegion, range: &Range<usize>) -> Result<*mut std::ffi::c_void> {
        if range.is_empty() {
            return Err(Error::InvalidArgument(
                format!(
                    "{range:?} is empty: a zero length in a scatter/gather entry means \
                     2 GiB to some devices; post at least one byte"
                )
                .into(),
            ));
        }
        // Within the region and under 2 GiB: what any scatter/gather entry is held to.
        let entry = mr.local(range.clone())?;
        Ok(entry.addr() as usize as *mut std::ffi::c_void)
    }

    fn rts(&self) -> Result<()> {
        match self.qp {
            Qp::Rts(_) => Ok(()),
            _ => Err(Error::InvalidArgument(
                "not connected: sends need an established connection".into(),
            )),
        }
    }

    /// Posts a receive of `range` of `mr` (`rdma_post_recv`).
    ///
    /// # Safety
    /// `mr` stays alive and the range unread and unwritten until the receive's
    /// completion has been returned by [`get_recv_comp`](Self::get_recv_comp), or
    /// the endpoint is dropped: also when this fails, since librdmacm does not say
    /// whether the provider had queued the request first (as Soft-RoCE does before
    /// a doorbell that can fail; [`Error::Queued`]). An empty range, or one of 2 GiB
    /// or more, is refused: see [what a posted request may
    /// touch](crate::wr#what-a-posted-request-may-touch).
    pub unsafe fn post_recv(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        range: Range<usize>,
    ) -> Result<()> {
        if matches!(self.qp, Qp::None) {
            return Err(Error::InvalidArgument("the endpoint has no QP".into()));
        }
        let addr = Self::buffer(mr, &range)?;
        // SAFETY: the id's QP is ours and alive; the caller keeps the buffer alive.
        check("rdma_post_recv", unsafe {
            sys::rdma_post_recv(self.id.as_raw(), wr_id as _, addr, range.len(), mr.as_raw())
        })
    }

    /// SENDs `range` of `mr` (`rdma_post_send`); `signaled` asks for a completion.
    ///
    /// # Safety
    /// `mr` stays alive and the range untouched until the send's completion (or
    /// that of a later signaled send) has been returned, or the endpoint is
    /// dropped: also when this fails, as for [`post_recv`](Self::post_recv).
    pub unsafe fn post_send(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        range: Range<usize>,
        signaled: bool,
    ) -> Result<()> {
        self.rts()?;
        let addr = Self::buffer(mr, &range)?;
        let flags = if signaled {
            sys::ibv_send_flags::IBV_SEND_SIGNALED.0 as i32
        } else {
            0
        };
        // SAFETY: as in `post_recv`.
        check("rdma_post_send", unsafe {
            sys::rdma_post_send(
                self.id.as_raw(),
                wr_id as _,
                addr,
                range.len(),
                mr.as_raw(),
                flags,
            )
        })
    }

    /// RDMA-READs `remote` into `range` of `mr` (`rdma_post_read`), signaled.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send); the range is written by the device.
    pub unsafe fn post_read(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        range: Range<usize>,
        remote: crate::mr::RemoteSlice,
    ) -> Result<()> {
        self.rts()?;
        let addr = Self::buffer(mr, &range)?;
        let flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0 as i32;
        // SAFETY: as in `post_recv`.
        check("rdma_post_read", unsafe {
            sys::rdma_post_read(
                self.id.as_raw(),
                wr_id as _,
                addr,
                range.len(),
                mr.as_raw(),
                flags,
                remote.addr,
                remote.rkey,
            )
        })
    }

    /// RDMA-WRITEs `range` of `mr` to `remote` (`rdma_post_write`), signaled.
    ///
    /// # Safety
    /// As [`post_send`](Self::post_send).
    pub unsafe fn post_write(
        &self,
        wr_id: u64,
        mr: &MemoryRegion,
        range: Range<usize>,
        remote: crate::mr::RemoteSlice,
    ) -> Result<()> {
        self.rts()?;
        let addr = Self::buffer(mr, &range)?;
        let flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0 as i32;
        // SAFETY: as in `post_recv`.
        check("rdma_post_write", unsafe {
            sys::rdma_post_write(
                self.id.as_raw(),
                wr_id as _,
                addr,
                range.len(),
                mr.as_raw(),
                flags,
                remote.addr,
                remote.rkey,
            )
        })
    }

    /// The next send-queue completion (`rdma_get_send_comp`), failing after `timeout`,
    /// with the completion's error status, or when the peer disconnects.
    pub fn get_send_comp(&self, timeout: Duration) -> Result<WorkCompletion> {
        self.comp(self.send_cq.as_ref(), "rdma_get_send_comp", timeout)
    }

    /// The next receive completion (`rdma_get_recv_comp`); as `get_send_comp`.
    pub fn get_recv_comp(&self, timeout: Duration) -> Result<WorkCompletion> {
        self.comp(self.recv_cq.as_ref(), "rdma_get_recv_comp", timeout)
    }

    fn comp(
        &self,
        cq: Option<&Arc<CompletionQueue>>,
        verb: &'static str,
        timeout: Duration,
    ) -> Result<WorkCompletion> {
        let cq = cq.ok_or_else(|| Error::InvalidArgument("the endpoint has no QP".into()))?;
        let channel = cq
            .channel()
            .ok_or_else(|| Error::InvalidArgument("CQ without a channel".into()))?;
        let mut deadline = crate::deadline::instant_after(timeout);
        if self.gone.load(Ordering::Acquire) {
            deadline = deadline.min(Instant::now() + GRACE);
        }
        let mut wcs = [WorkCompletion::default(); 1];
        loop {
            if let Some(wc) = cq.poll(&mut wcs)?.first() {
                wc.result()?;
                return Ok(*wc);
            }
            // A disconnect leaves our QP as it is until handled; completions already
            // under way may trail the event: give them a grace period.
            if let Some(ev) = self.events.get_event(Some(Duration::ZERO))? {
                match ev.kind() {
                    EventKind::Disconnected => {
                        self.gone.store(true, Ordering::Release);
                        deadline = deadline.min(Instant::now() + GRACE);
                    }
                    EventKind::DeviceRemoval => return Err(ev.to_error(verb)),
                    _ => {}
                }
                continue;
            }
            cq.req_notify(false)?;
            if let Some(wc) = cq.poll(&mut wcs)?.first() {
                wc.result()?;
                return Ok(*wc);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() && self.gone.load(Ordering::Acquire) {
                let _ = self.id.disconnect();
                return Err(Error::verb(verb, libc::ECONNRESET).with_hint("the peer disconnected"));
            }
            if left.is_zero() {
                return Err(Error::verb(verb, libc::ETIMEDOUT).with_hint(format!(
                    "no completion within {timeout:?}: is the peer alive?"
                )));
            }
            let fds = [channel.as_raw_fd(), self.events.as_raw_fd()];
            let [completion, _event] = crate::poll_readable(fds, Some(left))?;
            if completion {
                cq.wait(Some(Duration::ZERO))?;
            }
        }
    }
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("id", &self.id).finish()
    }
}
