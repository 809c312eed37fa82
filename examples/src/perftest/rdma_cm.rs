//! perftest's `-R` (`--rdma_cm`): the RDMA CM instead of a TCP socket.
//!
//! perftest 6.06 with `-R` uses the CM twice, both times on the perftest port:
//!
//! 1. **The out-of-band link** (`create_comm_struct` and `establish_connection` with
//!    `use_rdma_cm`): one RC queue pair, connected with `rdma_connect`/`rdma_accept`
//!    and no private data, carries every exchange (version, system data, MTU,
//!    handshakes, results) as one SEND per message into a 56-byte receive buffer
//!    ([`CmLink`]). The server destroys its listener once it has accepted.
//! 2. **The test's queue pairs** (`create_rdma_cm_connection`): after a handshake,
//!    the server listens on the same port again and accepts one connection per QP,
//!    the client resolves and connects one id per QP; another handshake follows.
//!    READ tools ask for `out_reads` responder resources and initiator depth;
//!    retries 7 (perftest's default `--retry_count`).
//!
//! The queue pairs come out of the CM already in RTS with the CM's PSNs and path;
//! the key exchange afterwards only carries rkeys and addresses.

use super::connect::CommError;
use super::run::Relax;
use crate::cm::leased::{post_recv, Lent};
use rdma_safe::cm::{self, CmEvent, CmId, ConnParam, EventChannel, EventKind, PortSpace};
use rdma_safe::qp::{Init, Rts};
use rdma_safe::{
    Access, CompletionQueue, Lease, LeasedQp, MemoryRegion, ProtectionDomain, QpConfig, QueuePair,
    SendOp,
};
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Size of perftest's receive buffer on the link (`sizeof(struct pingpong_dest)`).
pub const LINK_MSG_SIZE: usize = super::protocol::KEY_SIZE_BINARY;

/// perftest's `SYNC_SPEC_ID`, the work request id of every message on the link: of
/// its sends here.
const SYNC_SPEC_ID: u64 = 5;

/// The work request id of the link's receives (ids stay on this host: the peer
/// never sees them).
const RECV_ID: u64 = SYNC_SPEC_ID + 1;

/// How long address and route resolution may take.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

fn cm_err(what: impl Into<String>) -> impl FnOnce(rdma_safe::Error) -> CommError {
    let what = what.into();
    move |e| CommError::Cm(what, e)
}

/// The IPv4 address of `host:port` (perftest resolves with `AF_INET` only).
pub fn resolve_ipv4(host: &str, port: u16) -> Result<SocketAddr, CommError> {
    let addrs = (host, port).to_socket_addrs().map_err(|e| {
        CommError::Io(
            format!("Problem in resolving basic address and port {host}:{port}"),
            e,
        )
    })?;
    addrs.into_iter().find(|a| a.is_ipv4()).ok_or_else(|| {
        CommError::Io(
            format!("{host} has no IPv4 address (perftest's rdma_cm uses IPv4)"),
            std::io::Error::from(std::io::ErrorKind::AddrNotAvailable),
        )
    })
}

/// The wildcard address `0.0.0.0:port` a server listens on.
pub fn any_addr(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::UNSPECIFIED, port))
}

/// True when a connect failed because nobody listens yet (worth a retry).
fn nobody_listens(ev: &CmEvent) -> bool {
    matches!(ev.kind(), EventKind::Rejected | EventKind::Unreachable)
}

/// The out-of-band link of `-R`: a CM-connected RC queue pair with one 56-byte
/// message buffer each way.
pub struct CmLink {
    /// Holds the buffers its requests were lent until their completions.
    qp: LeasedQp<Rts>,
    /// The message buffers: `SYNC_SPEC_ID`'s to send, `RECV_ID`'s to receive into.
    bufs: Lent,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    id: CmId,
    channel: Arc<EventChannel>,
    /// Set once the peer disconnected.
    closed: bool,
}

/// The link's resources before the connection is up (the region and the QP hold the
/// protection domain).
struct LinkParts {
    bufs: Lent,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    qp: LeasedQp<Init>,
}

impl LinkParts {
    /// Creates the link's resources on `id`'s device and posts the first receive, as
    /// perftest does before `rdma_connect`/`rdma_accept`.
    fn new(id: &CmId) -> Result<LinkParts, CommError> {
        let ctx = id
            .context()
            .map_err(cm_err("the rdma_cm link has no device"))?;
        let pd = ProtectionDomain::new(&ctx).map_err(cm_err("ibv_alloc_pd for the link"))?;
        let mut bufs = Lent::default();
        for (wr_id, what) in [(SYNC_SPEC_ID, "link send"), (RECV_ID, "link receive")] {
            let mr = MemoryRegion::new(&pd, LINK_MSG_SIZE, Access::LOCAL_WRITE)
                .map_err(cm_err("ibv_reg_mr for the link"))?;
            bufs.add(wr_id, what, mr);
        }
        let send_cq = CompletionQueue::new(&ctx, 2).map_err(cm_err("ibv_create_cq"))?;
        let recv_cq = CompletionQueue::new(&ctx, 2).map_err(cm_err("ibv_create_cq"))?;
        let mut config = QpConfig::rc(&send_cq);
        config.recv_cq = recv_cq.clone();
        config.max_send_wr = 1;
        config.max_recv_wr = 1;
        let qp = id
            .create_qp(&pd, &config)
            .map_err(cm_err("Couldn't create the rdma_cm link's QP"))?;
        let qp = LeasedQp::before_rts(qp)
            .map_err(|e| CommError::Cm("the rdma_cm link's QP".into(), e.error))?;
        let mut parts = LinkParts {
            bufs,
            send_cq,
            recv_cq,
            qp,
        };
        post_link_recv(&mut parts.qp, &mut parts.bufs)?;
        Ok(parts)
    }

    fn finish(self, id: CmId, channel: Arc<EventChannel>) -> Result<CmLink, CommError> {
        let qp = self
            .qp
            .established()
            .map_err(|e| CommError::Cm("the rdma_cm link's QP is not connected".into(), e.error))?;
        Ok(CmLink {
            qp,
            bufs: self.bufs,
            send_cq: self.send_cq,
            recv_cq: self.recv_cq,
            id,
            channel,
            closed: false,
        })
    }
}

fn post_link_recv<S: rdma_safe::qp::CanRecv>(
    qp: &mut LeasedQp<S>,
    bufs: &mut Lent,
) -> Result<(), CommError> {
    post_recv(qp, bufs, RECV_ID, LINK_MSG_SIZE)
        .map_err(cm_err("Function ibv_post_recv failed for RDMA_CM QP"))
}

/// The link's connection parameters (`rdma_client_connect`/`rdma_server_connect`: a
/// SEND-only link, 7 retries, RNR retry forever).
fn link_param() -> ConnParam {
    ConnParam {
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        ..Default::default()
    }
}

impl CmLink {
    /// Server: listens on `0.0.0.0:port`, accepts one client, stops listening.
    pub fn accept(port: u16) -> Result<CmLink, CommError> {
        let channel = EventChannel::new().map_err(cm_err("rdma_create_event_channel"))?;
        let listener =
            CmId::new(&channel, PortSpace::Tcp).map_err(cm_err("rdma_create_id failed"))?;
        listener
            .bind_addr(any_addr(port))
            .map_err(cm_err(" rdma_bind_addr failed"))?;
        listener.listen(1).map_err(cm_err("rdma_listen failed"))?;
        let id = loop {
            let ev = channel
                .get_event(None)
                .map_err(cm_err("rdma_get_cm_events failed"))?;
            match ev {
                Some(ev) if ev.kind() == EventKind::ConnectRequest => break ev.id().clone(),
                Some(ev) => {
                    return Err(CommError::Cm(
                        format!("bad event waiting for connect request {}", ev.name()),
                        ev.to_error("rdma_listen"),
                    ))
                }
                None => {}
            }
        };
        let parts = LinkParts::new(&id)?;
        id.accept(&link_param())
            .map_err(cm_err("Function rdma_accept failed"))?;
        drop(listener); // rdma_destroy_id(cm_id_control): the port is free again
        parts.finish(id, channel)
    }

    /// Client: connects to `host:port`, retrying for `retry` while nobody listens.
    pub fn connect(host: &str, port: u16, retry: Duration) -> Result<CmLink, CommError> {
        let dst = resolve_ipv4(host, port)?;
        let deadline = Instant::now() + retry;
        loop {
            let channel = EventChannel::new().map_err(cm_err("rdma_create_event_channel"))?;
            let id =
                CmId::new(&channel, PortSpace::Tcp).map_err(cm_err("rdma_create_id failed"))?;
            id.resolve(None, dst, RESOLVE_TIMEOUT)
                .map_err(cm_err(format!("Couldn't resolve {dst} for rdma_cm")))?;
            let parts = LinkParts::new(&id)?;
            id.connect(&link_param())
                .map_err(cm_err("Function rdma_connect failed"))?;
            let ev = channel
                .get_event(Some(super::connect::SETUP_TIMEOUT))
                .map_err(cm_err("rdma_get_cm_events failed"))?;
            match ev {
                Some(ev) if ev.kind() == EventKind::Established => {
                    drop(ev);
                    return parts.finish(id, channel);
                }
                Some(ev) if nobody_listens(&ev) && Instant::now() < deadline => {
                    drop(ev);
                    drop(parts);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Some(ev) => {
                    return Err(CommError::Cm(
                        format!("Couldn't connect to {dst} with rdma_cm"),
                        ev.to_error("rdma_connect"),
                    ))
                }
                None => {
                    return Err(CommError::Cm(
                        format!("Couldn't connect to {dst} with rdma_cm"),
                        rdma_safe::Error::verb("rdma_connect", libc::ETIMEDOUT),
                    ))
                }
            }
        }
    }

    /// One exchange: the client sends `mine` then receives, the server receives then
    /// sends. `theirs` is filled from the start of the peer's message.
    pub fn xchg(
        &mut self,
        client: bool,
        mine: &[u8],
        theirs: &mut [u8],
        timeout: Option<Duration>,
    ) -> Result<(), CommError> {
        if client {
            self.send(mine, timeout)?;
            self.recv(theirs, timeout)
        } else {
            self.recv(theirs, timeout)?;
            self.send(mine, timeout)
        }
    }

    fn send(&mut self, data: &[u8], timeout: Option<Duration>) -> Result<(), CommError> {
        if data.len() > LINK_MSG_SIZE {
            return Err(CommError::Io(
                format!("a message of {} bytes does not fit the link", data.len()),
                std::io::Error::from(std::io::ErrorKind::InvalidInput),
            ));
        }
        let mut mr = self
            .bufs
            .take(SYNC_SPEC_ID)
            .map_err(cm_err("the link's send buffer"))?;
        if let Err(e) = mr.write_at(0, data) {
            self.bufs.put(SYNC_SPEC_ID, Lease::Owned(mr));
            return Err(CommError::Cm("filling the link's send buffer".into(), e));
        }
        let posted = self.qp.post_send(
            SYNC_SPEC_ID,
            SendOp::Send,
            Lease::Owned(mr),
            0..data.len(),
            true,
        );
        if let Err(e) = posted {
            self.bufs.put_back(SYNC_SPEC_ID, e.lease);
            return Err(CommError::Cm(
                "Function ibv_post_send failed".into(),
                e.error,
            ));
        }
        self.wait(false, timeout, "send to")?;
        Ok(())
    }

    fn recv(&mut self, out: &mut [u8], timeout: Option<Duration>) -> Result<(), CommError> {
        let len = self.wait(true, timeout, "receive from")? as usize;
        if len < out.len() {
            return Err(CommError::Protocol(super::protocol::ProtocolError(
                format!(
                    "the peer sent {len} bytes on the rdma_cm link, expected {}",
                    out.len()
                ),
            )));
        }
        self.bufs
            .get(RECV_ID)
            .and_then(|mr| mr.read_at(0, out))
            .map_err(|e| CommError::Cm("reading the link's receive buffer".into(), e))?;
        post_link_recv(&mut self.qp, &mut self.bufs)
    }

    /// Polls the send or receive CQ for the one outstanding completion; returns its
    /// byte count. Spins briefly, then sleeps a millisecond between polls, and watches
    /// the CM channel for the peer's disconnect.
    fn wait(
        &mut self,
        recv: bool,
        timeout: Option<Duration>,
        what: &str,
    ) -> Result<u32, CommError> {
        let cq = if recv {
            self.recv_cq.clone()
        } else {
            self.send_cq.clone()
        };
        let start = Instant::now();
        let mut relax = Relax::default();
        let mut polls = 0u64;
        let want = if recv { RECV_ID } else { SYNC_SPEC_ID };
        let mut scratch = [rdma_safe::WorkCompletion::default(); 1];
        loop {
            let polled = cq
                .poll_completions(&mut scratch)
                .map_err(cm_err("ibv_poll_cq on the link"))?
                .next();
            if let Some(c) = polled {
                let wc = c.work_completion();
                let mut released = self
                    .qp
                    .complete(c)
                    .map_err(|r| CommError::Cm("a completion of the link".into(), r.error))?;
                let wr_id = released.wr_id();
                for (id, lease) in &mut released {
                    self.bufs.put(id, lease);
                }
                if !wc.is_ok() || wr_id != want {
                    return Err(CommError::Io(
                        format!(
                            "Bad wc status on the rdma_cm link: {} (wr_id {}){}",
                            rdma_safe::cq::status_text(wc.status()),
                            wr_id,
                            if self.closed {
                                "; the peer disconnected"
                            } else {
                                ""
                            }
                        ),
                        std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
                    ));
                }
                return Ok(wc.byte_len());
            }
            polls += 1;
            if polls < 2048 {
                relax.idle();
                continue;
            }
            std::thread::sleep(Duration::from_millis(1));
            if polls % 16 == 0 {
                self.watch_cm()?;
                if timeout.is_some_and(|t| start.elapsed() > t) {
                    return Err(CommError::Io(
                        format!(
                            "Couldn't {what} the peer over rdma_cm within {} s",
                            timeout.unwrap_or_default().as_secs()
                        ),
                        std::io::Error::from(std::io::ErrorKind::TimedOut),
                    ));
                }
            }
        }
    }

    /// Takes the link's pending CM events; on a disconnect, disconnects too (which
    /// flushes our outstanding work, so the wait above ends with an error).
    fn watch_cm(&mut self) -> Result<(), CommError> {
        while let Some(ev) = self
            .channel
            .get_event(Some(Duration::ZERO))
            .map_err(cm_err("rdma_get_cm_event"))?
        {
            if matches!(
                ev.kind(),
                EventKind::Disconnected | EventKind::DeviceRemoval
            ) && !self.closed
            {
                self.closed = true;
                let _ = self.id.disconnect();
                return Err(CommError::Io(
                    "the peer closed the rdma_cm link".into(),
                    std::io::Error::from(std::io::ErrorKind::ConnectionReset),
                ));
            }
        }
        Ok(())
    }
}

/// The test's CM-connected ids (one per QP), each with its own event channel.
pub struct CmQps {
    ids: Vec<(CmId, Arc<EventChannel>)>,
    client: bool,
}

impl CmQps {
    /// `rdma_cm_disconnect_nodes`: disconnects every id and waits up to `timeout` for
    /// each one's `Disconnected` (the peer's DREP or its own DREQ).
    pub fn disconnect(&self, timeout: Duration) {
        for (id, _) in &self.ids {
            let _ = id.disconnect();
        }
        let deadline = Instant::now() + timeout;
        for (_, channel) in &self.ids {
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match channel.get_event(Some(left)) {
                    Ok(Some(ev)) if ev.kind() == EventKind::Disconnected => break,
                    Ok(Some(_)) => continue,
                    _ => break,
                }
            }
        }
    }

    /// True on the active side.
    pub fn is_client(&self) -> bool {
        self.client
    }
}

/// The connection parameters of the test's QPs (`rdma_cm_route_handler` and
/// `rdma_cm_connection_request_handler`).
pub fn qp_param(out_reads: Option<u32>) -> ConnParam {
    let reads = out_reads.map_or(0, |r| r.min(255) as u8);
    ConnParam {
        responder_resources: reads,
        initiator_depth: reads,
        flow_control: 0,
        retry_count: 7,
        rnr_retry_count: 7,
        private_data: Vec::new(),
    }
}

/// A listener for the test's QPs, made before the handshake that precedes them so
/// that the peer never finds the port closed.
pub struct QpListener {
    listener: CmId,
    channel: Arc<EventChannel>,
}

impl QpListener {
    /// Binds `0.0.0.0:port` and listens (backlog: the number of QPs).
    pub fn new(port: u16, backlog: u32) -> Result<QpListener, CommError> {
        let channel = EventChannel::new().map_err(cm_err("rdma_create_event_channel"))?;
        let listener = CmId::new(&channel, PortSpace::Tcp)
            .map_err(cm_err("Failed to create RDMA CM server control ID."))?;
        listener
            .bind_addr(any_addr(port))
            .map_err(cm_err("Failed to bind RDMA CM address on the server."))?;
        listener
            .listen(backlog as i32)
            .map_err(cm_err("Failed to listen on RDMA CM server listen ID."))?;
        Ok(QpListener { listener, channel })
    }

    /// Accepts `n` connections; `make` creates each one's QP on its id (the first
    /// call may create the shared resources from the id's device). Each QP is in RTS
    /// when returned; the listener is destroyed.
    pub fn accept(
        self,
        n: usize,
        param: &ConnParam,
        timeout: Duration,
        mut make: impl FnMut(&CmId) -> Result<QueuePair<Init>, CommError>,
    ) -> Result<(CmQps, Vec<QueuePair<Rts>>), CommError> {
        let mut ids = Vec::with_capacity(n);
        let mut qps = Vec::with_capacity(n);
        while qps.len() < n {
            let ev = self
                .channel
                .expect(EventKind::ConnectRequest, "rdma_listen", timeout)
                .map_err(cm_err("Failed to get the client's RDMA CM connect request"))?;
            let id = ev.id().clone();
            drop(ev);
            let qp = make(&id)?;
            id.accept(param)
                .map_err(cm_err("Failed to accept RDMA CM connection."))?;
            let qp = cm::established(qp)
                .map_err(|e| CommError::Cm("the accepted QP is not in RTS".into(), e.error))?;
            // perftest sets the RNR NAK timer to 12 (0.64 ms) after `rdma_accept`; the
            // CM's default, 0, means 655 ms. Like perftest, a refusal is not fatal.
            let _ = qp.set_min_rnr_timer(12);
            // Later events of this id go to its own channel.
            let own = EventChannel::new().map_err(cm_err("rdma_create_event_channel"))?;
            id.migrate(&own).map_err(cm_err("rdma_migrate_id"))?;
            ids.push((id, own));
            qps.push(qp);
        }
        drop(self.listener);
        Ok((CmQps { ids, client: false }, qps))
    }
}

/// Client: connects `n` QPs to `host:port`, one id each; `make` creates each QP on
/// its resolved id. Retries an attempt that finds nobody listening for `retry`.
pub fn connect_qps(
    host: &str,
    port: u16,
    n: usize,
    param: &ConnParam,
    retry: Duration,
    mut make: impl FnMut(&CmId) -> Result<QueuePair<Init>, CommError>,
) -> Result<(CmQps, Vec<QueuePair<Rts>>), CommError> {
    let dst = resolve_ipv4(host, port)?;
    let deadline = Instant::now() + retry;
    let mut ids = Vec::with_capacity(n);
    let mut qps = Vec::with_capacity(n);
    while qps.len() < n {
        let channel = EventChannel::new().map_err(cm_err("rdma_create_event_channel"))?;
        let id =
            CmId::new(&channel, PortSpace::Tcp).map_err(cm_err("Failed to create RDMA CM ID."))?;
        id.resolve(None, dst, RESOLVE_TIMEOUT)
            .map_err(cm_err("Failed to resolve RDMA CM address."))?;
        let qp = make(&id)?;
        id.connect(param)
            .map_err(cm_err("Failed to connect through RDMA CM."))?;
        let ev = channel
            .get_event(Some(super::connect::SETUP_TIMEOUT))
            .map_err(cm_err("Failed to get RDMA CM event."))?;
        match ev {
            Some(ev) if ev.kind() == EventKind::Established => {
                drop(ev);
                let qp = cm::established(qp)
                    .map_err(|e| CommError::Cm("the connected QP is not in RTS".into(), e.error))?;
                let _ = qp.set_min_rnr_timer(12);
                ids.push((id, channel));
                qps.push(qp);
            }
            Some(ev) if nobody_listens(&ev) && Instant::now() < deadline => {
                drop(ev);
                drop(qp);
                std::thread::sleep(Duration::from_millis(100));
            }
            Some(ev) => {
                return Err(CommError::Cm(
                    "Failed to connect RDMA CM client".into(),
                    ev.to_error("rdma_connect"),
                ))
            }
            None => {
                return Err(CommError::Cm(
                    "Failed to connect RDMA CM client".into(),
                    rdma_safe::Error::verb("rdma_connect", libc::ETIMEDOUT),
                ))
            }
        }
    }
    Ok((CmQps { ids, client: true }, qps))
}
