//! Shared pieces of the RDMA CM ports (`rping`, `rdma-server`/`rdma-client`,
//! `rdma-pingpong-*`, `rdma-file-transfer`): one connection's verbs objects and a
//! waiter that sleeps on its completion channel and its CM event channel at once,
//! always with a timeout.

pub mod child;
pub mod rw;

use rdma_safe::cm::{CmEvent, CmId, EventChannel, EventKind};
use rdma_safe::qp::{Init, QpType};
use rdma_safe::sys;
use rdma_safe::{
    CompletionChannel, CompletionQueue, Context, Error, ProtectionDomain, QpConfig, QueuePair,
    Result, WorkCompletion,
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
    /// A completion.
    Wc(WorkCompletion),
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
            if let Some(wc) = self.cq.poll(&mut wcs)?.first() {
                return Ok(Next::Wc(*wc));
            }
            if let Some(ev) = self.events.get_event(Some(Duration::ZERO))? {
                return Ok(Next::Event(ev));
            }
            self.cq.req_notify(false)?;
            if let Some(wc) = self.cq.poll(&mut wcs)?.first() {
                return Ok(Next::Wc(*wc));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(timed_out(what, timeout));
            }
            let comp_fd = match self.cq.channel() {
                Some(c) => c.as_raw_fd(),
                None => return Err(Error::InvalidArgument("CQ without a channel".into())),
            };
            let mut fds = [
                libc::pollfd {
                    fd: comp_fd,
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.events.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: two valid pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(Error::io("poll", e));
                }
            }
            if fds[0].revents != 0 {
                // Consume the channel event (acknowledged in batches by the CQ).
                self.cq.wait(Some(Duration::ZERO))?;
            }
        }
    }

    /// The next successful completion. A `Disconnected` event or a flushed request
    /// becomes an error with errno `ECONNRESET` (see [`is_disconnect`]); other CM
    /// events are ignored; a failed completion is an error with its status text.
    pub fn completion(&self, timeout: Duration, what: &str) -> Result<WorkCompletion> {
        loop {
            let gone = self.gone.load(Ordering::Acquire);
            let wait = if gone { GRACE.min(timeout) } else { timeout };
            let next = match self.next(wait, what) {
                Ok(n) => n,
                Err(_) if gone => return Err(disconnected()),
                Err(e) => return Err(e),
            };
            match next {
                Next::Wc(wc) => {
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

    /// The next completion of opcode `want`, skipping (after checking their status)
    /// completions of other opcodes: use it only where no other completion that
    /// matters can be pending (e.g. to skip the completions of signaled SENDs).
    pub fn completion_of(
        &self,
        want: sys::ibv_wc_opcode,
        timeout: Duration,
        what: &str,
    ) -> Result<WorkCompletion> {
        loop {
            let wc = self.completion(timeout, what)?;
            if wc.opcode() == want {
                return Ok(wc);
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

/// True when `err` says the peer went away (a `Disconnected` event or flushed work).
pub fn is_disconnect(err: &Error) -> bool {
    err.errno() == Some(libc::ECONNRESET)
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
    eprintln!("{program}: {err}");
    std::process::exit(1)
}
