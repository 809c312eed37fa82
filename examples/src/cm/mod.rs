//! Shared pieces of the RDMA CM ports (`rping`, `rdma-server`/`rdma-client`,
//! `rdma-pingpong-*`, `rdma-file-transfer`): one connection's verbs objects and a
//! waiter that sleeps on its completion channel and its CM event channel at once,
//! always with a timeout.

pub mod child;
pub mod desc;
pub mod leased;
pub mod rw;
pub mod workers;

use rdma_safe::cm::{CmEvent, CmId, EventChannel, EventKind};
use rdma_safe::qp::{Init, QpType};
use rdma_safe::sys;
use rdma_safe::{
    Completion, CompletionChannel, CompletionQueue, Context, Error, Lease, LeasedQp,
    ProtectionDomain, QpConfig, QueuePair, Result, WorkCompletion,
};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The verbs objects of one CM connection: PD, a CQ with its completion channel, and
/// the channel the id reports to.
pub struct Conn {
    /// The connection's id.
    pub id: CmId,
    /// Where the id's events arrive (used by this connection only).
    pub events: Arc<EventChannel>,
    /// The device the id is bound to.
    pub ctx: Arc<Context>,
    /// Protection domain of the connection's regions.
    pub pd: Arc<ProtectionDomain>,
    /// Completion queue of both queues.
    pub cq: Arc<CompletionQueue>,
    /// Set once the peer's `Disconnected` arrived: completions already on their way
    /// are still handed out for a short grace period, then waits fail.
    gone: AtomicBool,
}

/// How long completions are still awaited after the peer disconnected (its last
/// messages and our last acknowledgements may trail the CM's event).
const GRACE: Duration = Duration::from_millis(500);

fn disconnected() -> Error {
    Error::verb("rdma_get_cm_event", libc::ECONNRESET).with_hint("the peer disconnected")
}

/// What [`Conn::next`] woke up for.
pub enum Next {
    /// A completion (hand it to its `LeasedQp`, if the queue pair posts through one).
    Wc(Completion),
    /// A CM event of the connection.
    Event(CmEvent),
}

impl Conn {
    /// PD, completion channel and a CQ of `cq_depth` entries on the id's device.
    pub fn new(id: CmId, events: Arc<EventChannel>, cq_depth: u32) -> Result<Conn> {
        let ctx = id.context()?;
        let pd = ProtectionDomain::new(&ctx)?;
        let comp = CompletionChannel::new(&ctx)?;
        let cq = CompletionQueue::with_channel(&ctx, cq_depth, &comp, 0)?;
        Ok(Conn {
            id,
            events,
            ctx,
            pd,
            cq,
            gone: AtomicBool::new(false),
        })
    }

    /// An RC QP on the id with these depths (one SGE each way).
    pub fn create_qp(&self, send: u32, recv: u32) -> Result<QueuePair<Init>> {
        let mut config = QpConfig::rc(&self.cq);
        config.qp_type = QpType::Rc;
        config.max_send_wr = send;
        config.max_recv_wr = recv;
        self.id.create_qp(&self.pd, &config)
    }

    /// The next completion or CM event, whichever comes first; an error after
    /// `timeout` (naming `what` was awaited).
    pub fn next(&self, timeout: Duration, what: &str) -> Result<Next> {
        let deadline = Instant::now() + timeout;
        let mut wcs = [WorkCompletion::default(); 1];
        loop {
            if let Some(wc) = self.cq.poll_completions(&mut wcs)?.next() {
                return Ok(Next::Wc(wc));
            }
            if let Some(ev) = self.events.get_event(Some(Duration::ZERO))? {
                return Ok(Next::Event(ev));
            }
            self.cq.req_notify(false)?;
            if let Some(wc) = self.cq.poll_completions(&mut wcs)?.next() {
                return Ok(Next::Wc(wc));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(what, timeout));
            }
            let comp_fd = match self.cq.channel() {
                Some(c) => c.as_raw_fd(),
                None => return Err(Error::InvalidArgument("CQ without a channel".into())),
            };
            let fds = [comp_fd, self.events.as_raw_fd()];
            let [completion, _event] = rdma_safe::poll_readable(fds, Some(left))?;
            if completion {
                // Consume the channel event (acknowledged in batches by the CQ).
                self.cq.wait(Some(Duration::ZERO))?;
            }
        }
    }

    /// The next successful completion. A `Disconnected` event or a flushed request
    /// becomes an error with errno `ECONNRESET` (see [`is_disconnect`]); other CM
    /// events are ignored; a failed completion is an error with its status text.
    pub fn completion(&self, timeout: Duration, what: &str) -> Result<WorkCompletion> {
        self.completion_with(timeout, what, &mut |_| Ok(()))
    }

    /// [`Conn::completion`], handing every completion polled to `release` first (a
    /// failed one too: the device is done with its buffers).
    fn completion_with(
        &self,
        timeout: Duration,
        what: &str,
        release: &mut dyn FnMut(Completion) -> Result<()>,
    ) -> Result<WorkCompletion> {
        loop {
            let gone = self.gone.load(Ordering::Acquire);
            let wait = if gone { GRACE.min(timeout) } else { timeout };
            let next = match self.next(wait, what) {
                Ok(n) => n,
                Err(_) if gone => return Err(disconnected()),
                Err(e) => return Err(e),
            };
            match next {
                Next::Wc(c) => {
                    let wc = c.work_completion();
                    release(c)?;
                    if wc.status() == sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR {
                        return Err(Error::verb("ibv_poll_cq", libc::ECONNRESET)
                            .with_hint("the connection closed: requests were flushed"));
                    }
                    wc.result()?;
                    return Ok(wc);
                }
                Next::Event(ev) => match ev.kind() {
                    EventKind::Disconnected => self.gone.store(true, Ordering::Release),
                    EventKind::DeviceRemoval => return Err(ev.to_error("rdma_get_cm_event")),
                    _ => continue,
                },
            }
        }
    }

    /// True once the peer's `Disconnected` event was seen by [`Conn::completion`].
    pub fn peer_disconnected(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// The next completion of opcode `want`.
    ///
    /// Completions of this program's own sends (SEND, RDMA WRITE, READ, atomics: the
    /// send queue's) of other opcodes are skipped once their status was checked: the
    /// ports post their SENDs signaled and collect them here. A receive-queue
    /// completion of another opcode (a SEND or WRITE WITH IMMEDIATE of the peer) is
    /// never dropped: it used up a posted receive the protocol needs, so it is an
    /// error naming it (see [`unexpected_completion`]).
    pub fn completion_of(
        &self,
        want: sys::ibv_wc_opcode,
        timeout: Duration,
        what: &str,
    ) -> Result<WorkCompletion> {
        self.completion_of_with(want, timeout, what, &mut |_| Ok(()))
    }

    /// [`Conn::completion`] for a queue pair that posts through `qp`: the completion
    /// is handed to it, and the buffers it releases to `back`, with their `wr_id`s.
    pub fn leased_completion(
        &self,
        qp: &mut LeasedQp,
        timeout: Duration,
        what: &str,
        back: &mut dyn FnMut(u64, Lease),
    ) -> Result<WorkCompletion> {
        let mut release = |c| {
            for (wr_id, lease) in qp.complete(c)? {
                back(wr_id, lease);
            }
            Ok(())
        };
        self.completion_with(timeout, what, &mut release)
    }

    /// [`Conn::completion_of`] for a queue pair that posts through `qp`: every
    /// completion polled (a skipped one too) is handed to it, and the buffers it
    /// releases to `back`, with the `wr_id`s they were posted with.
    pub fn leased_completion_of(
        &self,
        qp: &mut LeasedQp,
        want: sys::ibv_wc_opcode,
        timeout: Duration,
        what: &str,
        back: &mut dyn FnMut(u64, Lease),
    ) -> Result<WorkCompletion> {
        let mut release = |c| {
            for (wr_id, lease) in qp.complete(c)? {
                back(wr_id, lease);
            }
            Ok(())
        };
        self.completion_of_with(want, timeout, what, &mut release)
    }

    fn completion_of_with(
        &self,
        want: sys::ibv_wc_opcode,
        timeout: Duration,
        what: &str,
        release: &mut dyn FnMut(Completion) -> Result<()>,
    ) -> Result<WorkCompletion> {
        loop {
            let wc = self.completion_with(timeout, what, release)?;
            if wc.opcode() == want {
                return Ok(wc);
            }
            if !is_own_send(wc.opcode()) {
                return Err(unexpected_completion(&wc, want, what));
            }
        }
    }

    /// Waits for `Established` (after connect or accept); any other event of the
    /// connection is an error naming it (e.g. `Rejected` with the reason).
    pub fn wait_established(&self, timeout: Duration, verb: &'static str) -> Result<CmEvent> {
        match self.events.get_event(Some(timeout))? {
            None => Err(timed_out("the connection to be established", timeout)),
            Some(ev) if ev.kind() == EventKind::Established => Ok(ev),
            Some(ev) => Err(ev.to_error(verb)),
        }
    }

    /// Disconnects and waits (briefly) for the `Disconnected` event, so the peer sees
    /// an orderly close. Errors are ignored: the connection is going away anyway.
    pub fn close(&self, timeout: Duration) {
        let _ = self.id.disconnect();
        if self.peer_disconnected() {
            return; // its event was seen already
        }
        let deadline = Instant::now() + timeout;
        while let Ok(Some(ev)) = self
            .events
            .get_event(Some(deadline.saturating_duration_since(Instant::now())))
        {
            if ev.kind() == EventKind::Disconnected {
                break;
            }
        }
    }
}

/// The send queue's opcodes: completions of work this program posted (SEND, RDMA
/// WRITE and READ, atomics, binds, invalidations). Everything else (C:
/// `wc->opcode & IBV_WC_RECV`) consumed a posted receive.
pub fn is_own_send(op: sys::ibv_wc_opcode) -> bool {
    use sys::ibv_wc_opcode as Op;
    [
        Op::IBV_WC_SEND,
        Op::IBV_WC_RDMA_WRITE,
        Op::IBV_WC_RDMA_READ,
        Op::IBV_WC_COMP_SWAP,
        Op::IBV_WC_FETCH_ADD,
        Op::IBV_WC_BIND_MW,
        Op::IBV_WC_LOCAL_INV,
        Op::IBV_WC_TSO,
        Op::IBV_WC_ATOMIC_WRITE,
    ]
    .contains(&op)
}

/// The verbs name of a completion opcode (`IBV_WC_RECV`, ...), for messages.
pub fn opcode_name(op: sys::ibv_wc_opcode) -> String {
    use sys::ibv_wc_opcode as Op;
    let names = [
        (Op::IBV_WC_SEND, "IBV_WC_SEND"),
        (Op::IBV_WC_RDMA_WRITE, "IBV_WC_RDMA_WRITE"),
        (Op::IBV_WC_RDMA_READ, "IBV_WC_RDMA_READ"),
        (Op::IBV_WC_COMP_SWAP, "IBV_WC_COMP_SWAP"),
        (Op::IBV_WC_FETCH_ADD, "IBV_WC_FETCH_ADD"),
        (Op::IBV_WC_BIND_MW, "IBV_WC_BIND_MW"),
        (Op::IBV_WC_LOCAL_INV, "IBV_WC_LOCAL_INV"),
        (Op::IBV_WC_RECV, "IBV_WC_RECV"),
        (Op::IBV_WC_RECV_RDMA_WITH_IMM, "IBV_WC_RECV_RDMA_WITH_IMM"),
    ];
    names
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, n)| (*n).to_owned())
        .unwrap_or_else(|| format!("{op:?}"))
}

/// The error for a receive completion `wc` that arrived while `want` was awaited for
/// `what`: it names both opcodes, the byte count and (if any) the immediate.
pub fn unexpected_completion(wc: &WorkCompletion, want: sys::ibv_wc_opcode, what: &str) -> Error {
    let imm = wc
        .imm_data()
        .map(|i| format!(", immediate {i}"))
        .unwrap_or_default();
    Error::Protocol(
        format!(
            "unexpected {} completion ({} bytes{imm}) while waiting for {what} ({}): the peer \
             sent something the protocol does not allow here, and it used up the posted receive",
            opcode_name(wc.opcode()),
            wc.byte_len(),
            opcode_name(want)
        )
        .into(),
    )
}

/// True when `err` says the peer went away (a `Disconnected` event or flushed work).
pub fn is_disconnect(err: &Error) -> bool {
    err.errno() == Some(libc::ECONNRESET)
}

/// Whether `err` is a wait that ran out of time ([`timed_out`]).
pub fn is_timeout(err: &Error) -> bool {
    err.errno() == Some(libc::ETIMEDOUT)
}

/// A timeout error naming what was awaited.
pub fn timed_out(what: &str, timeout: Duration) -> Error {
    Error::verb("wait", libc::ETIMEDOUT).with_hint(format!(
        "waited {timeout:?} for {what}: is the peer still running?"
    ))
}

/// Resolves `host` (a name or an address) and `port` to a socket address (IPv4
/// preferred), like the C programs' `getaddrinfo`.
pub fn socket_addr(host: &str, port: u16) -> Result<SocketAddr> {
    let all: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| Error::io(format!("getaddrinfo({host})"), e))?
        .collect();
    all.iter()
        .find(|a| a.is_ipv4())
        .or(all.first())
        .copied()
        .ok_or_else(|| Error::InvalidArgument(format!("no address for {host}").into()))
}

/// Exits the program with `err` on stderr and status 1 (no panic).
pub fn exit_with(program: &str, err: &Error) -> ! {
    exit_status(program, err, 1)
}

/// Exits the program with `err` on stderr and `status` (no panic).
pub fn exit_status(program: &str, err: &Error, status: i32) -> ! {
    eprintln!("{program}: {err}");
    std::process::exit(status)
}
