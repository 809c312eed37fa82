//! Establishing a session over its bootstrap connection: the hellos, the
//! queue pair and its buffers, RTR/RTS and the ready bytes
//! (docs/kiara-protocol.md, section 1), then joining the live sessions.

use super::{Catch, Engine};
use crate::conn::{Conn, Receives, INLINE_BYTES, READS_IN_FLIGHT, WINDOWS};
use crate::error::{CloseReason, Error, Result};
use crate::protocol::{Hello, Limits, HELLO_HEADER_LEN, HELLO_MAX_BODY_LEN, SLOT_OVERHEAD};
use crate::shared_recv::SharedRecv;
use crate::slots::SlotSlab;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::{
    Access, CompletionQueue, Deadline, InitAttr, QpConfig, QueuePair, RtrAttr, RtsAttr,
};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The next session's id: one counter for the process, so that an id names one
/// session for good (a handle kept across an `unbind` and a new `bind`, or of
/// another transport, never names a live session of this one).
static NEXT_SESSION_ID: AtomicU64 = AtomicU64::new(1);

impl Engine {
    /// Builds a session over a connected bootstrap socket: the hello exchange, queue
    /// pair, buffers, RTR/RTS, and a one-byte "ready" each way so that neither side
    /// sends before the other can receive. The accepting side reads and checks the
    /// client's hello before it creates anything (a client that never says a word
    /// costs it a socket, no device resource); the connecting side writes its hello
    /// first (docs/kiara-protocol.md, section 1).
    pub(crate) fn establish(
        self: &Arc<Self>,
        mut tcp: TcpStream,
        peer: SocketAddr,
        side: Side,
        heard: &dyn Fn() -> bool,
    ) -> Result<Arc<Conn>> {
        let c = &self.config;
        // One deadline for the whole handshake (hello and ready), not one per read: a
        // peer dripping a byte at a time is cut off when it has passed.
        let deadline = Deadline::after(c.timeout, "KIARA handshake");
        if side == Side::Connecting {
            self.room_for_a_session()?;
        }
        tcp.set_nodelay(true)
            .and_then(|()| crate::keepalive::enable(&tcp, c.peer_timeout))
            .map_err(|e| Error::io("configuring the bootstrap socket", e))?;
        // The server hears the client out first: nothing is allocated for a peer that
        // has not sent a valid hello.
        let early = match side {
            Side::Accepting => {
                let hello = read_hello(&mut tcp, &deadline)?;
                // Cut in the moment since the read: its place is a newcomer's, and
                // nothing may be allocated for it.
                if !heard() {
                    let cut = std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "its place went to a newer connection as the hello came in",
                    );
                    return Err(Error::io("reading the hello", cut));
                }
                Some(hello)
            }
            Side::Connecting => None,
        };
        // Accepted sessions receive into the shared queue, if there is one; its slots
        // must stay shorter than the path MTU (`shared_slot_size`), so a peer whose
        // MTU is smaller than ours is refused.
        let shared = match (&early, &self.shared_recv) {
            (Some(theirs), Some(pool)) => Some(self.shared_fits(theirs, pool)?),
            _ => None,
        };
        // The slabs before the queue pair: on an early return the QP goes first.
        let (send, send_slots) = SlotSlab::new(&self.pd, c.slot_size(), c.send_slots)?;
        let (recv, cq, qp) = self.new_queues(shared)?;
        // On the shared queue, the peer may have sent before the handshake failed:
        // the queue pair is gone by the time `handshake` returns, and its
        // completions give their slots back.
        let (qp, theirs) = match self.handshake(qp, &recv, &mut tcp, early, &deadline) {
            Ok(done) => done,
            Err(e) => {
                recv.drain();
                return Err(e);
            }
        };
        // Our message size limit applies to what we receive; the peer's to what we send.
        let peer_limits = Limits {
            max_message: theirs.max_message,
            eager_threshold: theirs.eager_threshold,
        };
        let id = NEXT_SESSION_ID.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn::new(
            id,
            peer,
            qp,
            cq,
            tcp,
            recv,
            send,
            send_slots,
            c,
            theirs.credits,
            peer_limits,
            self.pool.clone(),
            self.registrar.clone(),
            [self.receiving.clone(), self.sending.clone()],
            self.session_log(),
        ));
        conn.start(side == Side::Accepting, c.timeout)
            .map_err(Error::Closed)?;
        let conn = self.join(conn)?;
        if side == Side::Connecting {
            self.greeted(&conn, c.timeout)?;
        }
        Ok(conn)
    }

    /// The connecting side: waits up to `within` for the server's queue pair to
    /// acknowledge our greeting, so that a session `connect` returns has been heard
    /// over RDMA (and a bind's gate finds its send queue idle). A queue pair that
    /// never answers closes the session with `CloseReason::Silent`.
    fn greeted(&self, conn: &Arc<Conn>, within: Duration) -> Result<()> {
        // Not recorded as a wait of the session: it would shorten the spins of
        // its first `recv`s (`crate::waiting`).
        let ready = || conn.greeted();
        let spun = self.spin(conn, Some(within), &ready, Catch::Route);
        let spent = spun.map_or(Duration::ZERO, |s| s.last - s.began);
        if !conn.wait_greeted(within.saturating_sub(spent)) {
            conn.close(CloseReason::Silent { after: within });
        }
        let Some(why) = conn.closed() else {
            return Ok(());
        };
        // The caller never gets the session: it leaves at once.
        self.remove(conn);
        Err(Error::Closed(why))
    }

    /// Adds a session whose handshake finished to the live ones.
    fn join(&self, conn: Arc<Conn>) -> Result<Arc<Conn>> {
        // A handshake that finishes after the transport shut down (`unbind` does not
        // wait for handshakes) joins nothing: the session drops here, its queue pair
        // before its buffers. Looked at under the lock `shutdown` drains, so a session
        // is either refused here or closed there.
        let mut conns = self.conns.lock();
        if self.stop.load(Ordering::SeqCst) {
            return Err(Error::Closed(CloseReason::Shutdown));
        }
        conns.insert(conn.id, conn.clone());
        self.conns_gen.fetch_add(1, Ordering::AcqRel);
        drop(conns);
        // On the shared queue, what the peer sent before the session existed waits
        // in its mailbox; from now on the reaper drains the session itself.
        if let Some(mailbox) = conn.mailbox() {
            mailbox.attach(&conn);
            if mailbox.has_mail() {
                self.try_progress(&conn, false, Catch::Route);
            }
        }
        Ok(conn)
    }

    /// A session's receives, completion queue and queue pair (in INIT, its own
    /// receive slots posted, or on the shared queue `shared`).
    fn new_queues(
        &self,
        shared: Option<&Arc<SharedRecv>>,
    ) -> Result<(Receives, Arc<CompletionQueue>, QueuePair<Init>)> {
        let c = &self.config;
        // The slab before the queue pair: on an early return the QP goes first.
        let mut own = match shared {
            Some(_) => None,
            None => Some(SlotSlab::new(&self.pd, c.slot_size(), c.credits)?),
        };
        // Receives (at most one per credit; on the shared queue they complete on the
        // pool's CQ instead), SENDs, READs, window invalidations (binds are
        // unsignaled, but flush with the rest when the QP fails).
        let receives = if shared.is_some() { 0 } else { c.credits };
        let depth = receives + c.send_slots + READS_IN_FLIGHT + 2 * WINDOWS + 8;
        let cq = CompletionQueue::with_channel(&self.ctx, depth, &self.channel, 0)?;
        let mut qpc = QpConfig::rc(&cq);
        if let Some(pool) = shared {
            qpc.recv_cq = pool.cq().clone();
        }
        qpc.max_send_wr = c.send_slots + READS_IN_FLIGHT + 2 * WINDOWS + 1;
        qpc.max_recv_wr = c.credits;
        qpc.max_inline_data = INLINE_BYTES;
        qpc.srq = shared.map(|pool| pool.srq().clone());
        let qp = QueuePair::new(&self.pd, &qpc)?
            .to_init(&InitAttr {
                port: c.port,
                access: Access::LOCAL_WRITE | Access::REMOTE_READ,
                ..Default::default()
            })
            .map_err(|t| t.error)?;
        cq.req_notify(false)?;
        // Posted while the slab is still `own`, declared before `qp`: if a post
        // fails, the queue pair (with the receives posted so far) goes first.
        if let Some((slab, slots)) = &mut own {
            for s in std::mem::take(slots) {
                Conn::post_recv_slot(&qp, slab, s)?;
            }
        }
        let recv = match (own, shared) {
            (Some((slab, _)), _) => Receives::own(slab, c.credits),
            (None, Some(pool)) => {
                // Opened last (nothing after it fails, so the mailbox is closed on
                // every way out: `Receives::drain`), while the queue pair cannot
                // receive yet (INIT).
                let qpn = qp.qp_num();
                let mailbox = pool.open(qpn, c.credits, &mut |conn| self.drain_mail(conn));
                Receives::shared(pool.clone(), qpn, mailbox, c.credits)
            }
            (None, None) => unreachable!("a session receives into a slab or the pool"),
        };
        Ok((recv, cq, qp))
    }

    /// The hellos (ours, and the peer's unless `early` has it), RTR/RTS and the
    /// ready bytes. On an error the queue pair is destroyed before this returns.
    fn handshake(
        &self,
        qp: QueuePair<Init>,
        recv: &Receives,
        tcp: &mut TcpStream,
        early: Option<Hello>,
        deadline: &Deadline,
    ) -> Result<(QueuePair<Rts>, Hello)> {
        let c = &self.config;
        let slot = recv.slot_size();
        let psn = rdma_safe::random_psn();
        let mine = Hello {
            qpn: qp.qp_num(),
            psn,
            lid: self.lid,
            mtu: u8::try_from(self.mtu.0).unwrap_or(0),
            gid: Some(self.gid.0),
            credits: c.credits,
            slot_size: slot as u32,
            max_message: c.max_message,
            eager_threshold: (slot - SLOT_OVERHEAD) as u32,
        };
        deadline.write_all(tcp, &mine.encode(), "hello")?;
        let accepting = early.is_some();
        let theirs = match early {
            Some(theirs) => theirs,
            None => read_hello(tcp, deadline)?,
        };
        // The accepting side hears the client's ready byte before its queue pair
        // can receive (RTR): a client that never finishes the handshake lands
        // nothing (on the shared receive queue it would hold slots with no session
        // to cut it off). The connecting side writes its byte without waiting, so
        // neither waits for the other.
        if accepting {
            read_ready(tcp, deadline)?;
        }
        let qp = self.connect_qp(qp, &theirs, psn)?;
        deadline.write_all(tcp, b"R", "ready byte")?;
        if !accepting {
            read_ready(tcp, deadline)?;
        }
        tcp.set_nonblocking(true)
            .map_err(|e| Error::io("configuring the bootstrap socket", e))?;
        Ok((qp, theirs))
    }

    /// `connect` refuses a session beyond `Config::max_sessions` (`bind` refuses
    /// its clients before the handshake).
    fn room_for_a_session(&self) -> Result<()> {
        let max = self.config.max_sessions;
        if self.live_sessions() < max {
            return Ok(());
        }
        Err(Error::Usage(
            format!(
                "max_sessions ({max}) reached: disconnect a session first, or raise \
                 Config::max_sessions"
            )
            .into(),
        ))
    }

    /// The shared receive queue, for a client whose hello is `theirs`: refused if
    /// its MTU is below ours, as the path MTU would then not exceed a slot.
    fn shared_fits<'a>(
        &self,
        theirs: &Hello,
        pool: &'a Arc<SharedRecv>,
    ) -> Result<&'a Arc<SharedRecv>> {
        let ours = u8::try_from(self.mtu.0).unwrap_or(0);
        if theirs.mtu < ours {
            return Err(Error::Usage(
                format!(
                    "the client's MTU (code {}) is below this server's (code {ours}): a \
                     server with a shared receive queue needs the path MTU to exceed its \
                     slots of {} bytes",
                    theirs.mtu,
                    pool.slot_size()
                )
                .into(),
            ));
        }
        Ok(pool)
    }

    /// Moves a new queue pair to RTS towards the peer that sent `theirs`: the
    /// smaller of the two MTUs, our GID index, and our RDMA READ depth both ways.
    fn connect_qp(&self, qp: QueuePair<Init>, theirs: &Hello, psn: u32) -> Result<QueuePair<Rts>> {
        let c = &self.config;
        let mtu = u8::try_from(self.mtu.0).unwrap_or(0).min(theirs.mtu);
        let mut rtr = RtrAttr::new(
            theirs.endpoint(),
            rdma_safe::Mtu::from_code(u32::from(mtu))
                .unwrap_or(rdma_safe::Mtu::B4096)
                .into(),
        );
        rtr.port = c.port;
        rtr.sgid_index = self.gid_index as u8;
        rtr.max_dest_rd_atomic = self.rd_atomic;
        let mut rts = RtsAttr::new(psn);
        rts.max_rd_atomic = self.rd_atomic;
        rts.timeout = c.rc_timeout;
        rts.retry_cnt = c.rc_retries;
        qp.to_rtr(&rtr)
            .map_err(|t| t.error)?
            .to_rts(&rts)
            .map_err(|t| t.error.into())
    }
}

/// Which end of the bootstrap connection a handshake runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// `connect`: writes its hello first, then reads the server's.
    Connecting,
    /// `bind`'s accept loop: reads and checks the client's hello first, then creates
    /// the queue pair and its buffers and answers.
    Accepting,
}

/// Reads the peer's ready byte `R`. Each side writes its own once its queue pair
/// is in RTS, so neither sends before the other can receive; the accepting side
/// reads the client's before its queue pair leaves INIT ([`Engine::handshake`]).
fn read_ready(tcp: &mut TcpStream, deadline: &Deadline) -> Result<()> {
    let mut ready = [0u8; 1];
    deadline.read_exact(tcp, &mut ready, "ready byte")?;
    if ready != *b"R" {
        return Err(Error::Protocol(crate::protocol::ProtocolError(format!(
            "expected the ready byte 'R', got {:#04x}",
            ready[0]
        ))));
    }
    Ok(())
}

/// Reads and checks the peer's hello (every field bounded: `Hello::decode_body`),
/// before `deadline`.
fn read_hello(tcp: &mut TcpStream, deadline: &Deadline) -> Result<Hello> {
    let mut header = [0u8; HELLO_HEADER_LEN];
    deadline.read_exact(tcp, &mut header, "hello header")?;
    let len = Hello::decode_header(&header)?;
    let mut body = [0u8; HELLO_MAX_BODY_LEN];
    deadline.read_exact(tcp, &mut body[..len], "hello body")?;
    Ok(Hello::decode_body(&body[..len])?)
}
