//! `ibv_rc_pingpong`: the rdma-core example, ported. Two processes connect RC queue
//! pairs through a TCP exchange of LID/QPN/PSN/GID (52 bytes each way, the C format)
//! and bounce a SEND back and forth `-n` times; both print the C program's lines.
//!
//! ```text
//! ibv_rc_pingpong [-p port] [-d dev] [-i ib-port] [-s size] [-m mtu] [-r rx-depth]
//!                 [-n iters] [-l sl] [-e] [-g gid-idx] [-o] [-c] [-t] [-j] [-N] [host]
//! ```
//! `-N` makes the queue pair with `ibv_create_qp_ex` and posts its SENDs through
//! `ibv_wr_*` (`rdma_safe::QueuePair::new_ex`), as the C program does.
//! `-t` reads the device's completion timestamps (an extended CQ) and prints the
//! receive-to-receive clock cycles as the C program; `-j` (device memory) checks the
//! device's `max_dm_size` as the C program and stops there: a device without device
//! memory (rxe) gets C's message and the figure, one with it is told that this port
//! does not place the buffer in device memory.
//! It interoperates with the C `ibv_rc_pingpong` both ways (on RoCE both need `-g`).

use clap::Parser;
use examples::pingpong::{mtu_to_enum, Dest, MSG_SIZE};
use rdma_safe::qp::Init;
use rdma_safe::sys;
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, Context, DeviceRegion, Gid, InitAttr, LeasedQp,
    MemoryRegion, Mtu, ProtectionDomain, QpConfig, QueuePair, RemoteEndpoint, RtrAttr, RtsAttr,
    SendFlags, SendOp, SendOps, WcFlags, WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Command line, as the C program's.
#[derive(Parser, Debug)]
#[command(
    name = "ibv_rc_pingpong",
    about = "ping-pong over an RC connection (port of rdma-core's ibv_rc_pingpong)"
)]
struct Args {
    /// listen on/connect to port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// use IB device (default first device found)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// use port of IB device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 4096)]
    size: usize,
    /// path MTU
    #[arg(short = 'm', long = "mtu", default_value_t = 1024)]
    mtu: u32,
    /// number of receives to post at a time
    #[arg(short = 'r', long = "rx-depth", default_value_t = 500)]
    rx_depth: u32,
    /// number of exchanges
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// service level value
    #[arg(short = 'l', long = "sl", default_value_t = 0)]
    sl: u8,
    /// sleep on CQ events (default poll)
    #[arg(short = 'e', long = "events")]
    events: bool,
    /// local port gid index
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// use on demand paging
    #[arg(short = 'o', long = "odp")]
    odp: bool,
    /// use implicit on demand paging
    #[arg(short = 'O', long = "iodp")]
    iodp: bool,
    /// prefetch an ODP MR
    #[arg(short = 'P', long = "prefetch")]
    prefetch: bool,
    /// validate received buffer
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// get CQE with timestamp
    #[arg(short = 't', long = "ts")]
    ts: bool,
    /// use device memory
    #[arg(short = 'j', long = "dm")]
    dm: bool,
    /// use new post send WR API
    #[arg(short = 'N', long = "new_send")]
    new_send: bool,
    /// server to connect to (none: be the server)
    servername: Option<String>,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Errors of this program.
type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

impl Args {
    /// `-o` or `-O`: the buffer is registered on demand.
    fn on_demand(&self) -> bool {
        self.odp || self.iodp
    }
}

fn main() {
    // C prints its usage and exits 1 for an option it does not know, and has no
    // -h of its own (which it takes for such an option).
    let args = Args::try_parse().unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(1)
    });
    if let Err(err) = run(&args) {
        eprintln!("ibv_rc_pingpong: {err}");
        std::process::exit(1);
    }
}

fn gid_text(gid: &[u8; 16]) -> String {
    Ipv6Addr::from(*gid).to_string()
}

fn print_dest(label: &str, d: &Dest) {
    println!(
        "  {label} LID 0x{:04x}, QPN 0x{:06x}, PSN 0x{:06x}, GID {}",
        d.lid,
        d.qpn,
        d.psn,
        gid_text(&d.gid)
    );
}

/// Client side of the exchange: connect (retrying for a few seconds while the server
/// starts), write ours, read theirs, write `done`.
fn client_exchange(host: &str, port: u16, mine: &Dest) -> AnyResult<Dest> {
    let mut sock = examples::tcp::connect(host, port, Duration::from_secs(5))?;
    sock.write_all(&mine.encode())
        .map_err(|e| format!("Couldn't send local address: {e}"))?;
    let mut msg = [0u8; MSG_SIZE];
    sock.read_exact(&mut msg)
        .map_err(|e| format!("Couldn't read remote address: {e}"))?;
    let rem = Dest::decode(&msg)?;
    sock.write_all(b"done\0")?;
    Ok(rem)
}

fn run(args: &Args) -> AnyResult<()> {
    let mtu = check_args(args)?;
    let page = examples::pingpong::page_size();
    let ctx = Context::open(args.ib_dev.as_deref())?;
    let ts_mask = check_device(&ctx, args)?;
    let res = Resources::new(&ctx, args, page)?;
    let port = ctx.query_port(args.ib_port)?;
    if !port.is_ethernet() && port.lid() == 0 {
        return Err("Couldn't get local LID".into());
    }
    let gid = match args.gid_idx {
        Some(i) => ctx.query_gid(args.ib_port, i)?,
        None => Gid::default(),
    };
    let me = Dest {
        lid: port.lid(),
        qpn: res.qp.qp_num(),
        psn: rdma_safe::random_psn(),
        gid: gid.0,
    };
    print_dest("local address: ", &me);
    // Armed before the exchange, as C arms it: the peer's first SEND can complete
    // before `establish` returns, and a queue armed after that completion raises
    // no event for it (the wait would time out).
    if res.channel.is_some() {
        res.cq.req_notify(false)?;
    }
    let link = Link {
        args,
        mtu,
        me: &me,
        buf: &res.buf,
    };
    let (conn, rem) = link.establish(res.qp)?;
    print_dest("remote address:", &rem);

    let mut pp = PingPong::new(args, conn, res.buf, res.inline, ts_mask);
    let start = Instant::now();
    pp.run(&res.cq)?;
    report(args, start.elapsed(), &pp.ts);
    if args.servername.is_none() && args.chk {
        // The queue pair goes first: then no receive holds the buffer any more.
        let PingPong { conn, buf, .. } = pp;
        drop(conn);
        let mr = buf
            .into_region()
            .map_err(|_| "the buffer is still held by a request")?;
        check(&mr, args.size, page)?;
    }
    Ok(())
}

/// The options' checks, as the C program's; the MTU's verbs code.
fn check_args(args: &Args) -> AnyResult<u32> {
    let mtu = mtu_to_enum(args.mtu).ok_or("invalid MTU (256, 512, 1024, 2048 or 4096)")?;
    if args.size == 0 {
        return Err("size must be at least 1".into());
    }
    if args.rx_depth < 2 {
        return Err("rx-depth must be at least 2".into());
    }
    if args.on_demand() && args.dm {
        return Err("DM memory region can't be on demand".into());
    }
    if !args.on_demand() && args.prefetch {
        return Err("prefetch is valid only with on-demand memory region".into());
    }
    Ok(mtu)
}

/// `pp_init_ctx`'s extended device query for `-o`, `-O`, `-t` and `-j`, before
/// any resource: refuses what the device cannot do; returns the timestamp mask (0
/// without `-t`).
fn check_device(ctx: &Context, args: &Args) -> AnyResult<u64> {
    if !args.ts && !args.dm && !args.on_demand() {
        return Ok(0);
    }
    let attr = ctx.query_device()?;
    if args.on_demand() {
        check_odp(ctx, &attr, args)?;
    }
    if args.ts && attr.completion_timestamp_mask() == 0 {
        return Err(format!(
            "The device isn't completion timestamp capable ({} reports \
             completion_timestamp_mask 0 in ibv_query_device_ex)",
            ctx.name()
        )
        .into());
    }
    if args.dm {
        let max = attr.max_dm_size();
        if max == 0 {
            return Err(format!(
                "Device doesn't support dm allocation ({} reports max_dm_size 0 in \
                 ibv_query_device_ex: it has no device memory)",
                ctx.name()
            )
            .into());
        }
        if max < args.size as u64 {
            return Err(format!(
                "Device memory is insufficient ({} has {max} bytes, -s asks for {})",
                ctx.name(),
                args.size
            )
            .into());
        }
        return Err(format!(
            "{} has {max} bytes of device memory, but this port does not place its \
             buffer there (ibv_alloc_dm/ibv_reg_dm_mr are not implemented); run without -j",
            ctx.name()
        )
        .into());
    }
    // -O on a device that can: C registers NULL..SIZE_MAX, a region over all of
    // the process's memory, which no safe region can be. Refused after every check
    // C makes (as -j is; the two never meet: -j is refused with either ODP flag),
    // so that a device C would refuse is refused in C's words.
    if args.iodp {
        return Err(format!(
            "{} supports implicit ODP, but this port does not register the whole \
             address space (ibv_reg_mr(NULL, SIZE_MAX)); run with -o",
            ctx.name()
        )
        .into());
    }
    Ok(attr.completion_timestamp_mask())
}

/// `-o` and `-O` as `pp_init_ctx` checks them: the device pages on demand for RC
/// sends and receives (and, for `-O`, implicitly over the whole address space).
fn check_odp(ctx: &Context, attr: &rdma_safe::context::DeviceAttr, args: &Args) -> AnyResult<()> {
    let odp = attr.0.odp_caps;
    let rc = sys::IBV_ODP_SUPPORT_SEND | sys::IBV_ODP_SUPPORT_RECV;
    if odp.general_caps & u64::from(sys::IBV_ODP_SUPPORT) == 0
        || odp.per_transport_caps.rc_odp_caps & rc != rc
    {
        return Err(format!(
            "The device isn't ODP capable or does not support RC send and receive with ODP \
             ({} reports general_caps {:#x} and rc_odp_caps {:#x} in ibv_query_device_ex)",
            ctx.name(),
            odp.general_caps,
            odp.per_transport_caps.rc_odp_caps
        )
        .into());
    }
    if args.iodp && odp.general_caps & u64::from(sys::IBV_ODP_SUPPORT_IMPLICIT) == 0 {
        return Err(format!(
            "The device doesn't support implicit ODP ({} reports general_caps {:#x})",
            ctx.name(),
            odp.general_caps
        )
        .into());
    }
    Ok(())
}

/// `-P`: asks the device to fault in the pages of `mr` (an ODP region) for writing
/// now, as C does; a refusal is only reported, and the run goes on.
fn prefetch(pd: &ProtectionDomain, mr: &MemoryRegion) {
    /// `IB_UVERBS_ADVISE_MR_FLAG_FLUSH` (`1 << 0`): return once the pages are in.
    const FLUSH: u32 = 1;
    // C's `size` is an int; a buffer of 4 GiB or more is advised in part.
    let length = u32::try_from(mr.len()).unwrap_or(u32::MAX);
    let mut sge = sys::ibv_sge {
        addr: mr.addr(),
        length,
        lkey: mr.lkey(),
    };
    // SAFETY: the protection domain and the region are alive for the call, and the
    // entry's key is that region's, registered on this protection domain, over at
    // most its range; the library reads `sge` during the call only and keeps no
    // pointer to it; an advice faults pages in and touches no byte of the buffer.
    let ret = unsafe {
        sys::ibv_advise_mr(
            pd.as_raw(),
            sys::IB_UVERBS_ADVISE_MR_ADVICE_PREFETCH_WRITE,
            FLUSH,
            &mut sge,
            1,
        )
    };
    if ret != 0 {
        eprintln!("Couldn't prefetch MR({ret}). Continue anyway");
    }
}

/// What `pp_init_ctx` creates: the buffer, the completion queue (with a channel for
/// `-e`, extended for `-t`) and the queue pair in INIT.
struct Resources {
    buf: DeviceRegion,
    channel: Option<Arc<CompletionChannel>>,
    cq: Arc<CompletionQueue>,
    qp: QueuePair<Init>,
    /// The payload fits the queue pair's inline data: sends are posted inline.
    inline: bool,
}

impl Resources {
    fn new(ctx: &Arc<Context>, args: &Args, page: usize) -> AnyResult<Resources> {
        let pd = ProtectionDomain::new(ctx)?;
        let mut access = Access::LOCAL_WRITE;
        if args.on_demand() {
            access = Access::from_bits(access.bits() | Access::ON_DEMAND.bits());
        }
        let mut mr = MemoryRegion::new(&pd, args.size, access)?;
        if args.prefetch {
            prefetch(&pd, &mr);
        }
        // The C program fills the buffer with 0x7b; with -c the client marks the first
        // byte of every page before its first send. Marking now is the same: nothing
        // is received before the client sent.
        mr.as_mut_slice()?.fill(0x7b);
        if args.chk && args.servername.is_some() {
            mark(&mut mr, args.size, page)?;
        }
        // Every receive and every send uses this one buffer, as in C.
        let buf = DeviceRegion::new(mr);
        let channel = match args.events {
            true => Some(CompletionChannel::new(ctx)?),
            false => None,
        };
        let depth = args.rx_depth + 1;
        let cq = match &channel {
            _ if args.ts => CompletionQueue::new_ex(
                ctx,
                depth,
                channel.as_ref(),
                WcFlags::COMPLETION_TIMESTAMP,
            )?,
            Some(ch) => CompletionQueue::with_channel(ctx, depth, ch, 0)?,
            None => CompletionQueue::new(ctx, depth)?,
        };
        let mut config = QpConfig::rc(&cq);
        config.max_send_wr = 1;
        config.max_recv_wr = args.rx_depth;
        // -N: the QP posts its SENDs through ibv_wr_* (the lease layer picks the
        // extended interface for the operations the QP was made for).
        let qp = match args.new_send {
            true => QueuePair::new_ex(&pd, &config, SendOps::SEND)?,
            false => QueuePair::new(&pd, &config)?,
        };
        let inline = qp.caps().max_inline_data as usize >= args.size;
        let qp = qp.to_init(&InitAttr {
            port: args.ib_port,
            pkey_index: 0,
            access: Access::NONE,
            qkey: 0,
        })?;
        Ok(Resources {
            buf,
            channel,
            cq,
            qp,
            inline,
        })
    }
}

/// The connection's half that both sides share: the exchange, the move to RTS and
/// the first receives.
struct Link<'a> {
    args: &'a Args,
    mtu: u32,
    me: &'a Dest,
    buf: &'a DeviceRegion,
}

impl Link<'_> {
    /// Exchanges addresses (the client writes first, the server answers once its
    /// receives are up) and returns the connected queue pair with `rx_depth`
    /// receives posted, and the peer's address.
    fn establish(&self, qp: QueuePair<Init>) -> AnyResult<(LeasedQp, Dest)> {
        match &self.args.servername {
            Some(host) => {
                let rem = client_exchange(host, self.args.port, self.me)?;
                Ok((self.connect(qp, &rem)?, rem))
            }
            None => {
                let port = self.args.port;
                let listener = TcpListener::bind(("0.0.0.0", port))
                    .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
                let (mut sock, _) = listener.accept()?;
                let mut msg = [0u8; MSG_SIZE];
                sock.read_exact(&mut msg)
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                let rem = Dest::decode(&msg)?;
                let conn = self.connect(qp, &rem)?;
                sock.write_all(&self.me.encode())
                    .map_err(|e| format!("Couldn't send local address: {e}"))?;
                let mut done = [0u8; 5];
                sock.read_exact(&mut done)
                    .map_err(|e| format!("Couldn't read remote address: {e}"))?;
                Ok((conn, rem))
            }
        }
    }

    /// `pp_connect_ctx`: RTR towards `rem`, then RTS; then the receives, before the
    /// peer can send.
    fn connect(&self, qp: QueuePair<Init>, rem: &Dest) -> AnyResult<LeasedQp> {
        let args = self.args;
        let remote_gid = Gid(rem.gid);
        let grh = !remote_gid.interface_id_is_zero();
        let peer = RemoteEndpoint {
            qpn: rem.qpn,
            psn: rem.psn,
            lid: rem.lid,
            gid: grh.then_some(remote_gid),
        };
        let mtu = Mtu::from_code(self.mtu).unwrap_or(Mtu::B4096);
        let mut rtr = RtrAttr::new(peer, mtu.into());
        rtr.port = args.ib_port;
        rtr.sl = args.sl;
        rtr.hop_limit = 1;
        rtr.sgid_index = args.gid_idx.unwrap_or(0) as u8;
        rtr.max_dest_rd_atomic = 1;
        rtr.min_rnr_timer = 12;
        let qp = qp
            .to_rtr(&rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {}", e.error))?
            .to_rts(&RtsAttr::new(self.me.psn))
            .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
        let mut conn = LeasedQp::new(qp).map_err(|e| e.error)?;
        let routs = post_recvs(&mut conn, self.buf, args.size, args.rx_depth);
        if routs < args.rx_depth {
            return Err(format!("Couldn't post receive ({routs})").into());
        }
        Ok(conn)
    }
}

/// The ping-pong loop's state (the C program's `main` loop variables).
struct PingPong<'a> {
    args: &'a Args,
    conn: LeasedQp,
    buf: DeviceRegion,
    inline: bool,
    ts_mask: u64,
    ts: TsParams,
    /// Receives posted and not completed.
    routs: u32,
    scnt: u32,
    rcnt: u32,
    /// `RECV_WRID | SEND_WRID` bits of what the next send waits for.
    pending: u64,
}

/// One completion as the loop needs it: the request's id, its status and, with
/// `-t`, the device's timestamp.
type Reaped = (u64, sys::ibv_wc_status, u64);

impl<'a> PingPong<'a> {
    fn new(args: &'a Args, conn: LeasedQp, buf: DeviceRegion, inline: bool, ts_mask: u64) -> Self {
        let routs = conn.outstanding_recvs() as u32;
        PingPong {
            args,
            conn,
            buf,
            inline,
            ts_mask,
            ts: TsParams::default(),
            routs,
            scnt: 0,
            rcnt: 0,
            pending: RECV_WRID,
        }
    }

    /// Sends first on the client, then answers every receive until both counts reach
    /// `-n`.
    fn run(&mut self, cq: &CompletionQueue) -> AnyResult<()> {
        if self.args.servername.is_some() {
            self.post_send()?;
            self.pending |= SEND_WRID;
        }
        let mut wcs = [WorkCompletion::default(); 2];
        // Pure busy polling, as C does: every completion is produced inside the peer's
        // post (rxe runs it in process context), so yielding only adds latency
        // (measured in the guest: 3-6% slower round trips with a yield every 128
        // empty polls).
        while self.rcnt < self.args.iters || self.scnt < self.args.iters {
            if self.args.events {
                if !cq.wait(Some(Duration::from_secs(60)))? {
                    return Err("no completion event within 60 s".into());
                }
                cq.req_notify(false)?;
            }
            let mut got = [(0, sys::ibv_wc_status::IBV_WC_SUCCESS, 0); 2];
            // No PAUSE between empty polls, as in C (see `Relax::idle`).
            let n = self.reap(cq, &mut wcs, &mut got)?;
            for &completion in &got[..n] {
                self.handle(completion)?;
            }
        }
        Ok(())
    }

    /// Polls up to two completions, hands them to the queue pair (which releases
    /// their holds on the buffer) and notes what the loop needs of each.
    fn reap(
        &mut self,
        cq: &CompletionQueue,
        wcs: &mut [WorkCompletion],
        got: &mut [Reaped; 2],
    ) -> AnyResult<usize> {
        let mut n = 0;
        if self.args.ts {
            let mut refused = None;
            cq.poll_ex(2, |wc| match self.conn.complete_ex(wc) {
                Ok(released) => {
                    got[n] = (
                        released.wr_id(),
                        wc.status(),
                        wc.completion_ts().unwrap_or(0),
                    );
                    n += 1;
                }
                Err(e) => refused = Some(e),
            })?;
            if let Some(e) = refused {
                return Err(e.into());
            }
        } else {
            for wc in cq.poll_completions(wcs)? {
                let status = wc.status();
                got[n] = (self.conn.complete(wc)?.wr_id(), status, 0);
                n += 1;
            }
        }
        Ok(n)
    }

    /// The C loop's body for one completion.
    fn handle(&mut self, (wr_id, status, stamp): Reaped) -> AnyResult<()> {
        if status != sys::ibv_wc_status::IBV_WC_SUCCESS {
            return Err(format!(
                "Failed status {} ({}) for wr_id {}",
                rdma_safe::cq::status_text(status),
                status.0,
                wr_id
            )
            .into());
        }
        match wr_id {
            SEND_WRID => self.scnt += 1,
            RECV_WRID => {
                if self.args.ts {
                    self.ts.record(stamp, self.ts_mask);
                }
                self.routs -= 1;
                if self.routs <= 1 {
                    let want = self.args.rx_depth - self.routs;
                    self.routs += post_recvs(&mut self.conn, &self.buf, self.args.size, want);
                    if self.routs < self.args.rx_depth {
                        return Err(format!("Couldn't post receive ({})", self.routs).into());
                    }
                }
                self.rcnt += 1;
            }
            other => return Err(format!("Completion for unknown wr_id {other}").into()),
        }
        self.pending &= !wr_id;
        if self.scnt < self.args.iters && self.pending == 0 {
            self.post_send()?;
            self.pending = RECV_WRID | SEND_WRID;
        }
        Ok(())
    }

    /// SENDs the buffer, signaled, inline when it fits.
    fn post_send(&mut self) -> AnyResult<()> {
        let flags = SendFlags {
            inline: self.inline,
            ..SendFlags::SIGNALED
        };
        let range = 0..self.args.size;
        self.conn
            .post_send_device(SEND_WRID, SendOp::Send, &self.buf, range, flags)
            .map_err(|e| format!("Couldn't post send: {e}").into())
    }
}

/// The C program's two result lines, and with `-t` its three timestamp lines.
fn report(args: &Args, elapsed: Duration, ts: &TsParams) {
    let usec = elapsed.as_secs_f64() * 1e6;
    let bytes = args.size as u64 * args.iters as u64 * 2;
    println!(
        "{bytes} bytes in {:.2} seconds = {:.2} Mbit/sec",
        usec / 1e6,
        bytes as f64 * 8.0 / usec
    );
    println!(
        "{} iters in {:.2} seconds = {:.2} usec/iter",
        args.iters,
        usec / 1e6,
        usec / args.iters as f64
    );
    if args.ts && ts.iters > 0 {
        println!("Max receive completion clock cycles = {}", ts.max);
        println!("Min receive completion clock cycles = {}", ts.min);
        println!(
            "Average receive completion clock cycles = {:.6}",
            ts.total as f64 / ts.iters as f64
        );
    }
}

/// The receive-to-receive gaps of `-t`, in device clock cycles (`struct ts_params`).
#[derive(Debug)]
struct TsParams {
    max: u64,
    min: u64,
    total: u64,
    prev: Option<u64>,
    iters: u64,
}

impl Default for TsParams {
    fn default() -> Self {
        TsParams {
            max: 0,
            min: 0xffff_ffff,
            total: 0,
            prev: None,
            iters: 0,
        }
    }
}

impl TsParams {
    /// Records a receive completion's timestamp; the clock wraps at `mask`.
    fn record(&mut self, stamp: u64, mask: u64) {
        if let Some(prev) = self.prev {
            let delta = if stamp >= prev {
                stamp - prev
            } else {
                mask.wrapping_sub(prev).wrapping_add(stamp).wrapping_add(1)
            };
            self.max = self.max.max(delta);
            self.min = self.min.min(delta);
            self.total += delta;
            self.iters += 1;
        }
        self.prev = Some(stamp);
    }
}

/// The value `-c` puts at the start of page `i`. The C program computes
/// `i / page_size % sizeof(char)`, which is always 0; kept as is for interop.
fn page_mark(_page_index: usize) -> u8 {
    0
}

/// With `-c`, the client marks the first byte of every page before its first send
/// (before the buffer is handed to the device).
fn mark(mr: &mut MemoryRegion, size: usize, page: usize) -> rdma_safe::Result<()> {
    let buf = mr.as_mut_slice()?;
    for i in (0..size).step_by(page) {
        buf[i] = page_mark(i / page);
    }
    Ok(())
}

/// With `-c`, the server checks those bytes after the run and reports bad pages (as
/// the C program: a message, not a failure).
fn check(mr: &MemoryRegion, size: usize, page: usize) -> rdma_safe::Result<()> {
    let buf = mr.as_slice()?;
    for i in (0..size).step_by(page) {
        if buf[i] != page_mark(i / page) {
            println!("invalid data in page {}", i / page);
        }
    }
    Ok(())
}

/// Posts `n` receives of the first `size` bytes of the buffer (all on the same
/// bytes, as in C); returns how many were posted.
fn post_recvs(conn: &mut LeasedQp, buf: &DeviceRegion, size: usize, n: u32) -> u32 {
    for i in 0..n {
        if conn.post_recv_device(RECV_WRID, buf, 0..size).is_err() {
            return i;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::TsParams;

    #[test]
    fn timestamp_gaps_as_the_c_program() {
        let mut ts = TsParams::default();
        ts.record(100, 0xffff);
        assert_eq!(ts.iters, 0, "the first receive only starts the clock");
        ts.record(130, 0xffff);
        ts.record(190, 0xffff);
        assert_eq!((ts.min, ts.max, ts.total, ts.iters), (30, 60, 90, 2));
        // The clock wraps at the mask: 0xfff0 -> 0x10 is 0x20 cycles.
        ts.record(0xfff0, 0xffff);
        ts.record(0x10, 0xffff);
        assert_eq!(ts.total, 90 + (0xfff0 - 190) + 0x20);
        assert_eq!((ts.min, ts.iters), (30, 4));
    }
}
