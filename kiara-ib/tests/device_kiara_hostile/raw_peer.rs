//! The attacker: a raw KIARA peer on rdma-safe alone, and what checks that
//! nothing it got was more than a descriptor grants.

use super::*;

/// Receive slots the attacker posts (its credits in the hello).
pub(crate) const RAW_CREDITS: u32 = 8;
/// Bytes per receive slot: header, metadata and a 4096-byte eager payload.
pub(crate) const RAW_SLOT: usize = CONTROL_HEADER_LEN + 64 + 4096;
/// The attacker's eager threshold and largest message, as its hello says.
pub(crate) const RAW_LIMITS: Limits = Limits {
    max_message: 16 << 20,
    eager_threshold: 4096,
};

/// Tags of the attacker's work requests (its own `wr_id`s in the lease).
pub(crate) const WR_RECV: u64 = 1 << 40;
pub(crate) const WR_SEND: u64 = 2 << 40;
pub(crate) const WR_READ: u64 = 3 << 40;

/// A control message the server sent the attacker.
#[derive(Debug)]
pub(crate) struct Received {
    pub(crate) kind: Kind,
    pub(crate) header: Control,
    pub(crate) meta: Vec<u8>,
}

/// A DATA descriptor the server announced: what it grants to read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Descriptor {
    pub(crate) msg_id: u64,
    pub(crate) addr: u64,
    pub(crate) len: u64,
    pub(crate) rkey: u32,
}

impl Descriptor {
    /// Exactly the announced bytes.
    pub(crate) fn remote(&self) -> RemoteSlice {
        RemoteSlice {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

/// What one READ of the attacker got: its completion status and the bytes of its
/// target buffer afterwards (all zero unless something was written).
pub(crate) struct ReadOutcome {
    pub(crate) status: ibv_wc_status,
    pub(crate) bytes: Vec<u8>,
}

/// An attacker's session: a raw RC queue pair connected to a kiara server through the
/// real handshake, speaking the control protocol by hand.
pub(crate) struct RawPeer {
    pub(crate) dev: Arc<Device>,
    pub(crate) tcp: TcpStream,
    pub(crate) conn: LeasedQp,
    pub(crate) cq: Arc<CompletionQueue>,
    /// Send buffers not in use.
    pub(crate) spare: Vec<MemoryRegion>,
    /// Control messages received and not yet looked at.
    pub(crate) inbox: VecDeque<Received>,
    /// Finished sends and READs, by our work request id: status and buffer.
    pub(crate) done: HashMap<u64, (ibv_wc_status, Lease)>,
    pub(crate) next_wr: u64,
    /// Our next message id.
    pub(crate) next_id: u64,
    /// Credits we owe the server (slots reposted since our last control message).
    pub(crate) owed: u32,
    /// SENDs the server's posted receives allow.
    pub(crate) credits: u32,
    /// The highest message id the server sent us.
    pub(crate) seen: u64,
    /// The last message of the server's that we acknowledged.
    pub(crate) last_acked: u64,
    /// The status of the first failed receive (the queue pair is in error then).
    pub(crate) failed: Option<ibv_wc_status>,
}

impl RawPeer {
    /// Connects to `server` through the full handshake.
    pub(crate) fn connect(dev: &Arc<Device>, server: SocketAddr) -> RawPeer {
        RawPeer::try_connect(dev, server, |_| {})
            .unwrap_or_else(|me| panic!("the server refused the handshake of {me}"))
    }

    /// Connects; `tweak` may spoil the hello. If the server refused it: our end of
    /// the bootstrap connection, which the server's log names. Greets the server
    /// over RDMA, as a KIARA client does (protocol version 5).
    pub(crate) fn try_connect(
        dev: &Arc<Device>,
        server: SocketAddr,
        tweak: impl FnOnce(&mut [u8]),
    ) -> Result<RawPeer, SocketAddr> {
        let mut peer = RawPeer::handshake(dev, server, tweak, |_| {})?;
        peer.send_control(Kind::Credit, Control::default(), &[], &[]);
        Ok(peer)
    }

    /// [`RawPeer::try_connect`], running `before_ready` once our queue pair is ready
    /// to send and before we send the ready byte (it may send, and spoil the ready
    /// byte by writing one of its own first).
    pub(crate) fn handshake(
        dev: &Arc<Device>,
        server: SocketAddr,
        tweak: impl FnOnce(&mut [u8]),
        before_ready: impl FnOnce(&mut RawPeer),
    ) -> Result<RawPeer, SocketAddr> {
        RawPeer::handshake_with(dev, server, tweak, before_ready, true)
    }

    /// Connects through the full handshake and greets, granting the server
    /// [`RAW_CREDITS`] credits in the hello but posting no receive for them.
    pub(crate) fn connect_without_receives(dev: &Arc<Device>, server: SocketAddr) -> RawPeer {
        let mut peer = RawPeer::handshake_with(dev, server, |_| {}, |_| {}, false)
            .unwrap_or_else(|me| panic!("the server refused the handshake of {me}"));
        peer.send_control(Kind::Credit, Control::default(), &[], &[]);
        peer
    }

    /// [`RawPeer::handshake`]; `receives`: whether to post the receives the hello
    /// grants.
    fn handshake_with(
        dev: &Arc<Device>,
        server: SocketAddr,
        tweak: impl FnOnce(&mut [u8]),
        before_ready: impl FnOnce(&mut RawPeer),
        receives: bool,
    ) -> Result<RawPeer, SocketAddr> {
        let channel = CompletionChannel::new(&dev.ctx).unwrap();
        let cq = CompletionQueue::with_channel(&dev.ctx, 256, &channel, 0).unwrap();
        let qp = QueuePair::new(&dev.pd, &QpConfig::rc(&cq))
            .unwrap()
            .to_init(&InitAttr::default())
            .unwrap();
        let mut tcp = TcpStream::connect(server).unwrap();
        tcp.set_read_timeout(Some(STEP)).unwrap();
        let me = tcp.local_addr().unwrap();
        let mut hello = Hello {
            qpn: qp.qp_num(),
            psn: 7,
            lid: 0,
            mtu: 3,
            gid: Some(dev.gid.0),
            credits: RAW_CREDITS,
            slot_size: RAW_SLOT as u32,
            max_message: RAW_LIMITS.max_message,
            eager_threshold: RAW_LIMITS.eager_threshold,
        }
        .encode();
        tweak(&mut hello);
        tcp.write_all(&hello).unwrap();
        let mut header = [0u8; HELLO_HEADER_LEN];
        tcp.read_exact(&mut header).map_err(|_| me)?;
        let len = Hello::decode_header(&header).unwrap();
        let mut body = vec![0u8; len];
        tcp.read_exact(&mut body).map_err(|_| me)?;
        let theirs = Hello::decode_body(&body).unwrap();
        let mut rtr = RtrAttr::new(theirs.endpoint(), rdma_safe::sys::ibv_mtu::IBV_MTU_1024);
        rtr.sgid_index = dev.gid_index as u8;
        // Three transport retries, not 7: rxe retries 7 times forever, and a READ
        // sent to a session the server has destroyed must fail, not hang.
        let rts = RtsAttr {
            retry_cnt: 3,
            ..RtsAttr::new(7)
        };
        let qp = qp.to_rtr(&rtr).unwrap().to_rts(&rts).unwrap();
        let conn = LeasedQp::new(qp).map_err(|t| t.error).unwrap();
        let mut peer = RawPeer {
            dev: dev.clone(),
            tcp,
            conn,
            cq,
            spare: Vec::new(),
            inbox: VecDeque::new(),
            done: HashMap::new(),
            next_wr: 0,
            next_id: 1,
            owed: 0,
            credits: theirs.credits,
            seen: 0,
            last_acked: 0,
            failed: None,
        };
        for slot in (0..u64::from(RAW_CREDITS)).filter(|_| receives) {
            let mr = MemoryRegion::new(&dev.pd, RAW_SLOT, Access::LOCAL_WRITE).unwrap();
            peer.conn
                .post_recv(WR_RECV | slot, mr, 0..RAW_SLOT)
                .map_err(|e| e.error)
                .unwrap();
        }
        before_ready(&mut peer);
        // A server that refused the hello may already have reset the connection.
        peer.tcp.write_all(b"R").map_err(|_| me)?;
        let mut ready = [0u8; 1];
        peer.tcp.read_exact(&mut ready).map_err(|_| me)?;
        assert_eq!(ready, *b"R");
        Ok(peer)
    }

    /// Our end of the bootstrap connection: how the server's log names this session.
    pub(crate) fn me(&self) -> SocketAddr {
        self.tcp.local_addr().unwrap()
    }

    /// Handles every completion there is; waits up to `timeout` for one if there is
    /// none. Returns whether one was handled.
    pub(crate) fn pump(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.poll_once() {
                return true;
            }
            self.cq.req_notify(false).unwrap();
            // A completion that came before the request raises no event.
            if self.poll_once() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() || !self.cq.wait(Some(left)).unwrap() {
                return self.poll_once();
            }
        }
    }

    /// Polls one batch of completions and handles it.
    pub(crate) fn poll_once(&mut self) -> bool {
        let mut scratch = [WorkCompletion::default(); 16];
        let completions: Vec<_> = self.cq.poll_completions(&mut scratch).unwrap().collect();
        let any = !completions.is_empty();
        for c in completions {
            let wc = c.work_completion();
            let released: Vec<(u64, Lease)> = self
                .conn
                .complete(c)
                .expect("a completion of the attacker's own queue pair")
                .collect();
            for (wr_id, lease) in released {
                self.finished(wr_id, &wc, lease);
            }
        }
        any
    }

    /// A work request finished: a receive is decoded (and its slot posted again, its
    /// credit owed), a send or READ is kept for its waiter.
    pub(crate) fn finished(&mut self, wr_id: u64, wc: &WorkCompletion, lease: Lease) {
        if wr_id & !0xff_ffff_ffff != WR_RECV {
            self.done.insert(wr_id, (wc.status(), lease));
            return;
        }
        if !wc.is_ok() {
            self.failed.get_or_insert(wc.status());
            return;
        }
        let Lease::Owned(mr) = lease else {
            unreachable!("receives are leased exclusively")
        };
        let mut bytes = vec![0u8; wc.byte_len() as usize];
        mr.read_at(0, &mut bytes).unwrap();
        inspect(&bytes, "a control message the server sent");
        let d = Control::decode(&bytes, &RAW_LIMITS)
            .unwrap_or_else(|e| panic!("the server sent a malformed control message: {e}"));
        self.credits += d.header.credits;
        if matches!(d.kind, Kind::Data | Kind::Eager) {
            self.seen = self.seen.max(d.header.msg_id);
        }
        self.inbox.push_back(Received {
            kind: d.kind,
            header: d.header,
            meta: d.meta.to_vec(),
        });
        self.conn
            .post_recv(wr_id, mr, 0..RAW_SLOT)
            .map_err(|e| e.error)
            .unwrap();
        self.owed += 1;
    }

    /// Waits for work request `wr_id` to finish.
    pub(crate) fn wait_request(&mut self, wr_id: u64, what: &str) -> (ibv_wc_status, Lease) {
        let deadline = Instant::now() + STEP;
        loop {
            if let Some(done) = self.done.remove(&wr_id) {
                return done;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "{what} did not complete within {STEP:?}");
            self.pump(left);
        }
    }

    /// SENDs `bytes` as they are; returns the SEND's completion status.
    pub(crate) fn send_raw(&mut self, bytes: &[u8]) -> ibv_wc_status {
        self.send_raw_as(bytes, SendOp::Send)
    }

    /// [`RawPeer::send_raw`] with operation `op` (a SEND of some kind).
    pub(crate) fn send_raw_as(&mut self, bytes: &[u8], op: SendOp) -> ibv_wc_status {
        let wr_id = self.post_raw(bytes, op);
        let (status, lease) = self.wait_request(wr_id, "a SEND");
        if let Lease::Owned(mr) = lease {
            self.spare.push(mr);
        }
        status
    }

    /// Posts `bytes` as a SEND of kind `op` (spending a credit) without waiting;
    /// returns its work request id.
    pub(crate) fn post_raw(&mut self, bytes: &[u8], op: SendOp) -> u64 {
        let mut mr = match self.spare.pop() {
            Some(mr) if mr.len() >= bytes.len() => mr,
            _ => MemoryRegion::new(&self.dev.pd, bytes.len().max(RAW_SLOT), Access::LOCAL_WRITE)
                .unwrap(),
        };
        mr.write_at(0, bytes).unwrap();
        self.next_wr += 1;
        let wr_id = WR_SEND | self.next_wr;
        self.conn
            .post_send(wr_id, op, Lease::Owned(mr), 0..bytes.len(), true)
            .map_err(|e| e.error)
            .unwrap();
        self.credits = self.credits.saturating_sub(1);
        wr_id
    }

    /// SENDs a flood keeps in flight at most (within the send queue, 128 deep).
    pub(crate) const FLOOD_DEPTH: usize = 120;

    /// Keeps the server's completion queue busy while keeping every rule: CREDIT
    /// messages back to back, each returning what we owe, as many in flight as the
    /// server's credits allow, until `stop` is set or the session fails. `sent`
    /// counts those that completed. Stops at `until` whatever happens.
    pub(crate) fn flood(&mut self, stop: &AtomicBool, sent: &AtomicU64, until: Instant) {
        let mut in_flight = VecDeque::new();
        while !stop.load(Ordering::SeqCst) && self.failed.is_none() && Instant::now() < until {
            while self.credits > 0 && in_flight.len() < Self::FLOOD_DEPTH {
                let h = Control {
                    credits: std::mem::take(&mut self.owed),
                    seen: self.seen as u32,
                    ..Control::default()
                };
                let mut bytes = vec![0u8; CONTROL_HEADER_LEN];
                h.write_header(Kind::Credit, &mut bytes);
                in_flight.push_back(self.post_raw(&bytes, SendOp::Send));
            }
            self.poll_once();
            self.inbox.clear();
            while let Some(done) = in_flight.front().and_then(|id| self.done.remove(id)) {
                in_flight.pop_front();
                if done.0 != ibv_wc_status::IBV_WC_SUCCESS {
                    return;
                }
                if let Lease::Owned(mr) = done.1 {
                    self.spare.push(mr);
                }
                sent.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// SENDs every message of `burst` back to back, ignoring credits, then waits
    /// for them all; returns how many completed successfully.
    pub(crate) fn send_burst(&mut self, burst: &[Vec<u8>]) -> usize {
        let mut ids = Vec::with_capacity(burst.len());
        for bytes in burst {
            let mut mr = MemoryRegion::new(&self.dev.pd, RAW_SLOT, Access::LOCAL_WRITE).unwrap();
            mr.write_at(0, bytes).unwrap();
            self.next_wr += 1;
            let wr_id = WR_SEND | self.next_wr;
            self.conn
                .post_send(wr_id, SendOp::Send, Lease::Owned(mr), 0..bytes.len(), true)
                .map_err(|e| e.error)
                .unwrap();
            ids.push(wr_id);
        }
        ids.into_iter()
            .filter(|&id| {
                self.wait_request(id, "a SEND of a burst").0 == ibv_wc_status::IBV_WC_SUCCESS
            })
            .count()
    }

    /// Sends a well-formed control message (waiting for a credit), returning the
    /// credits owed and saying what it has seen. Panics if the SEND fails.
    pub(crate) fn send_control(&mut self, kind: Kind, h: Control, meta: &[u8], payload: &[u8]) {
        let status = self.send_control_as(kind, h, meta, payload, SendOp::Send);
        assert_eq!(status, ibv_wc_status::IBV_WC_SUCCESS, "{kind:?} not sent");
    }

    /// [`RawPeer::send_control`] with operation `op`, returning the SEND's status.
    pub(crate) fn send_control_as(
        &mut self,
        kind: Kind,
        h: Control,
        meta: &[u8],
        payload: &[u8],
        op: SendOp,
    ) -> ibv_wc_status {
        let bytes = self.control_bytes(kind, h, meta, payload);
        self.send_raw_as(&bytes, op)
    }

    /// [`RawPeer::send_control`] without waiting for the SEND's completion;
    /// returns its work request id.
    pub(crate) fn post_control(&mut self, kind: Kind, h: Control, meta: &[u8]) -> u64 {
        let bytes = self.control_bytes(kind, h, meta, &[]);
        self.post_raw(&bytes, SendOp::Send)
    }

    /// A control message of `kind` as the protocol has it, once the server has
    /// given us a credit: `h` with our credits owed and the last id seen, then
    /// `meta` and `payload`.
    fn control_bytes(
        &mut self,
        kind: Kind,
        mut h: Control,
        meta: &[u8],
        payload: &[u8],
    ) -> Vec<u8> {
        let deadline = Instant::now() + STEP;
        while self.credits == 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "the server returned no credit");
            self.pump(left);
            self.check_alive("waiting for a credit");
        }
        h.credits = std::mem::take(&mut self.owed);
        h.seen = self.seen as u32;
        h.meta_len = meta.len() as u8;
        let mut bytes = vec![0u8; CONTROL_HEADER_LEN];
        h.write_header(kind, &mut bytes);
        bytes.extend_from_slice(meta);
        bytes.extend_from_slice(payload);
        bytes
    }

    /// Our next message id.
    pub(crate) fn take_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id - 1
    }

    /// Panics if the session failed (a receive was flushed).
    pub(crate) fn check_alive(&self, what: &str) {
        if let Some(status) = self.failed {
            panic!(
                "the attacker's session failed while {what}: {}",
                rdma_safe::cq::status_text(status)
            );
        }
    }

    /// The first received control message for which `pred` holds (others stay, but
    /// CREDIT messages are dropped: their credits were counted).
    pub(crate) fn recv(&mut self, what: &str, pred: impl Fn(&Received) -> bool) -> Received {
        let deadline = Instant::now() + STEP;
        loop {
            // Credit returns carry nothing more (their credits were counted).
            self.inbox.retain(|m| m.kind != Kind::Credit);
            if let Some(at) = self.inbox.iter().position(&pred) {
                return self.inbox.remove(at).expect("found");
            }
            self.check_alive(&format!("waiting for {what}"));
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no {what} within {STEP:?}");
            self.pump(left);
        }
    }

    /// Asks the server for a bait message of `len` bytes, tagged `tag`, without
    /// waiting for it.
    pub(crate) fn ask_bait(&mut self, mode: Mode, len: usize, tag: u64) {
        let mut meta = b"GIVE".to_vec();
        meta.push(mode as u8);
        meta.extend_from_slice(&(len as u32).to_be_bytes());
        meta.extend_from_slice(&tag.to_be_bytes());
        let h = Control {
            msg_id: self.take_id(),
            ..Control::default()
        };
        self.send_control(Kind::Eager, h, &meta, &[]);
    }

    /// The DATA descriptor of bait `tag`.
    pub(crate) fn bait_descriptor(&mut self, tag: u64) -> Descriptor {
        let mut want = b"BAIT".to_vec();
        want.extend_from_slice(&tag.to_be_bytes());
        let m = self.recv(&format!("the descriptor of bait {tag}"), |m| {
            m.kind == Kind::Data && m.meta == want
        });
        Descriptor {
            msg_id: m.header.msg_id,
            addr: m.header.addr,
            len: m.header.len,
            rkey: m.header.rkey,
        }
    }

    /// Asks for bait and returns its descriptor.
    pub(crate) fn request_bait(&mut self, mode: Mode, len: usize, tag: u64) -> Descriptor {
        self.ask_bait(mode, len, tag);
        self.bait_descriptor(tag)
    }

    /// Acknowledges the server's message `msg_id` (delivered).
    pub(crate) fn ack(&mut self, msg_id: u64) {
        let h = Control {
            msg_id,
            ..Control::default()
        };
        self.send_control(Kind::Ack, h, &[], &[]);
        self.last_acked = msg_id;
    }

    /// Acknowledges the server's message `msg_id` as kiara-ib does: a SEND_WITH_INV
    /// of the message's key `rkey`, which the ACK also names.
    pub(crate) fn ack_invalidating(&mut self, msg_id: u64, rkey: u32) {
        let h = Control {
            msg_id,
            rkey,
            ..Control::default()
        };
        let status = self.send_control_as(Kind::Ack, h, &[], &[], SendOp::SendWithInvalidate(rkey));
        assert_eq!(
            status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "invalidating ACK not sent"
        );
        self.last_acked = msg_id;
    }

    /// Returns the credits we owe with a CREDIT message, if any.
    pub(crate) fn return_credits(&mut self) {
        if self.owed > 0 {
            self.send_control(Kind::Credit, Control::default(), &[], &[]);
        }
    }

    /// READs `remote` into a fresh zeroed buffer.
    pub(crate) fn read(&mut self, remote: RemoteSlice) -> ReadOutcome {
        let len = remote.len as usize;
        let mr = MemoryRegion::new(&self.dev.pd, len.max(1), Access::LOCAL_WRITE).unwrap();
        self.next_wr += 1;
        let wr_id = WR_READ | self.next_wr;
        self.conn
            .post_send(wr_id, SendOp::Read(remote), Lease::Owned(mr), 0..len, true)
            .map_err(|e| e.error)
            .unwrap();
        let (status, lease) = self.wait_request(wr_id, "an RDMA READ");
        let bytes = lease.region().to_vec();
        ReadOutcome { status, bytes }
    }

    /// The positive control: the READ a live descriptor grants succeeds and returns
    /// exactly the bait.
    pub(crate) fn read_granted(&mut self, d: &Descriptor, what: &str) {
        let got = self.read(d.remote());
        assert_eq!(
            got.status,
            ibv_wc_status::IBV_WC_SUCCESS,
            "{what}: the READ the descriptor grants failed ({}): the harness is broken",
            rdma_safe::cq::status_text(got.status)
        );
        assert!(
            got.bytes == bait(d.len as usize),
            "{what}: the bait read back differs"
        );
    }

    /// Attempts `remote`, which no descriptor grants. Refused as it must be (the READ
    /// completes with a remote error, nothing lands in the buffer, the queue pair
    /// goes to the error state): `None`. Otherwise the breach, described.
    pub(crate) fn probe(&mut self, remote: RemoteSlice, what: &str) -> Option<String> {
        let got = self.read(remote);
        if got.status == ibv_wc_status::IBV_WC_SUCCESS {
            return Some(format!(
                "{what}: the READ of {remote:x?} succeeded and got {}",
                classify(&got.bytes)
            ));
        }
        if got.bytes.iter().any(|&b| b != 0) {
            return Some(format!(
                "{what}: the READ of {remote:x?} failed but wrote {}",
                classify(&got.bytes)
            ));
        }
        assert!(
            [
                ibv_wc_status::IBV_WC_REM_ACCESS_ERR,
                ibv_wc_status::IBV_WC_REM_INV_REQ_ERR
            ]
            .contains(&got.status),
            "{what}: the READ failed, but not with a remote access error: {}",
            rdma_safe::cq::status_text(got.status)
        );
        self.wait_qp_error(what);
        eprintln!(
            "refused at the attacker: {what}: {}",
            rdma_safe::cq::status_text(got.status)
        );
        None
    }

    /// Waits until the attacker's queue pair is in the error state (the provider may
    /// report the completion just before it moves the state).
    pub(crate) fn wait_qp_error(&self, what: &str) {
        let deadline = Instant::now() + STEP;
        loop {
            let state = self.conn.qp().query_state().unwrap();
            if state == ibv_qp_state::IBV_QPS_ERR {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: the attacker's queue pair did not go to the error state"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// True once the server closed the bootstrap connection (waits up to [`STEP`]).
    pub(crate) fn closed_by_server(&mut self) -> bool {
        self.tcp.set_read_timeout(Some(STEP)).unwrap();
        let mut b = [0u8; 1];
        match self.tcp.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ),
        }
    }
}

/// Panics if `bytes` hold any of the planted secret or of the bytes around the
/// region's messages: the attacker must never get either.
pub(crate) fn inspect(bytes: &[u8], what: &str) {
    if find(bytes, &SECRET_MAGIC).is_some() || find(bytes, &NEIGHBOUR_MAGIC).is_some() {
        panic!("VULNERABLE: {what} holds {}", classify(bytes));
    }
}

/// What bytes an attacker got are, for the report of a breach.
pub(crate) fn classify(bytes: &[u8]) -> String {
    if let Some(at) = find(bytes, &SECRET_MAGIC) {
        return format!(
            "the planted secret (at offset {at} of {} bytes)",
            bytes.len()
        );
    }
    if let Some(at) = find(bytes, &NEIGHBOUR_MAGIC) {
        return format!(
            "bytes next to a message, never announced (at offset {at} of {})",
            bytes.len()
        );
    }
    let nonzero = bytes.iter().filter(|&&b| b != 0).count();
    if nonzero == 0 {
        return format!("{} zero bytes", bytes.len());
    }
    let from_bait = bytes.len() >= 16 && find(&bait(BAIT_MAX), &bytes[..16]).is_some();
    format!(
        "{} bytes, {nonzero} non-zero ({})",
        bytes.len(),
        if from_bait {
            "starting with bait"
        } else {
            "not the bait: other memory"
        }
    )
}

/// Connects a fresh attacker session, has it take bait `tag` of `len` bytes and read
/// it as the descriptor grants (the positive control); returns both.
pub(crate) fn baited(
    dev: &Arc<Device>,
    server: &Server,
    mode: Mode,
    len: usize,
    tag: u64,
) -> (RawPeer, Descriptor) {
    let mut peer = RawPeer::connect(dev, server.addr);
    let d = peer.request_bait(mode, len, tag);
    assert_eq!(
        d.len, len as u64,
        "the descriptor announces the bait's length"
    );
    peer.read_granted(&d, &format!("bait {tag} ({mode:?})"));
    (peer, d)
}

/// The breaches of one test: accesses that should have been refused and were not.
/// The test goes on after one (on a fresh session) and fails at the end, listing
/// them all.
#[derive(Default)]
pub(crate) struct Breaches {
    pub(crate) found: Vec<String>,
    pub(crate) tried: usize,
}

impl Breaches {
    /// Has `peer` attempt `remote`. A refusal must also end the session on the
    /// server, which logs why (its queue pair went to the error state with the
    /// attacker's, as the responder that refused the READ: the log says so, not
    /// only that a receive was flushed), and closes the bootstrap connection. A
    /// breach is kept (and the breaching session dropped).
    pub(crate) fn attempt(
        &mut self,
        server: &Server,
        mut peer: RawPeer,
        remote: RemoteSlice,
        what: &str,
    ) {
        self.tried += 1;
        match peer.probe(remote, what) {
            None => {
                let line = server.closed(peer.me(), "the peer's RDMA READ or WRITE was refused");
                assert!(
                    peer.closed_by_server(),
                    "{what}: the connection was left open"
                );
                eprintln!("server log: {line}");
            }
            Some(breach) => {
                eprintln!("VULNERABLE: {breach}");
                self.found.push(breach);
            }
        }
    }

    /// Fails the test if any access succeeded.
    pub(crate) fn check(self) {
        assert!(
            self.found.is_empty(),
            "VULNERABLE: {} of {} accesses that no descriptor grants succeeded:\n{}",
            self.found.len(),
            self.tried,
            self.found.join("\n")
        );
    }
}

/// When and how the secret is planted.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plant {
    /// Before the attack; the server keeps it.
    Keep,
    /// Before the attack; the server drops it (its buffer goes back to the pool).
    Drop,
    /// The attack plants it itself.
    Later,
}

/// Runs `attack` against a server serving good clients (the secret planted as
/// `plant` says), then checks that the good clients were served intact throughout
/// (even when the attack failed the test) and that a client arriving afterwards is
/// served too.
pub(crate) fn with_victims(
    config: Config,
    plant: Plant,
    attack: impl FnOnce(&Server, &Arc<Device>),
) {
    let server = Server::start(config);
    let planted = match plant {
        Plant::Keep => Some(server.plant_secret(b"KEEP")),
        Plant::Drop => Some(server.plant_secret(b"DROP")),
        Plant::Later => None,
    };
    let good = GoodClients::start(server.addr, 3);
    let dev = Device::open();
    // A breach fails the test, but only after the good clients were checked: they
    // must have been served intact whatever the attacker managed.
    let attacked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        attack(&server, &dev);
    }));
    let served = good.finish();
    assert!(
        served >= 3 * (GOOD_MIN_ROUNDS + 1),
        "only {served} good round trips"
    );
    // A client arriving after the attack is served too.
    let late = GoodClients::start(server.addr, 1);
    late.finish();
    if let Some((client, session)) = planted {
        client.disconnect(session).unwrap();
    }
    server.finish();
    if let Err(breach) = attacked {
        std::panic::resume_unwind(breach);
    }
}
