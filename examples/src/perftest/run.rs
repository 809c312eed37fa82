//! The six tools' common program: setup, the per-tool exchange sequence, the data
//! paths (bandwidth with `-t` in flight, `-Q` moderation and `-l` post lists; latency
//! ping-pong) and the reports.

use super::connect::{Comm, CommError};
use super::params::{Args, Params, TestKind, Verb};
use super::protocol::{BwReport, KeyData};
use super::rdma_cm::{self, CmQps};
use super::report::{self, RESULT_LINE};
use clap::Parser;
use rdma_safe::cm::CmId;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys;
use rdma_safe::{
    Access, CompletionQueue, Context, Gid, InitAttr, MemoryRegion, ProtectionDomain, QpConfig,
    QueuePair, RemoteEndpoint, RtrAttr, RtsAttr, WorkCompletion,
};
use rdma_safe::{Mtu, Selection};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Errors of a run.
pub type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How long a data path may wait without progress before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// Entry point of a tool: parses perftest's command line, runs, exits 1 on error.
pub fn main(verb: Verb, kind: TestKind) -> ! {
    let args = Args::parse();
    if args.version {
        println!("Version: {}", super::protocol::VERSION);
        std::process::exit(0);
    }
    let result = Params::new(verb, kind, args)
        .map_err(|e| e.into())
        .and_then(run);
    match result {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!(" {e}");
            std::process::exit(1);
        }
    }
}

/// Everything one side needs on the data path.
struct Side {
    clock: Clock,
    /// Dropped first: no QP uses the region after this.
    qps: Vec<QueuePair<Rts>>,
    /// With `-R`: the CM ids of the QPs.
    cm: Option<CmQps>,
    p: Params,
    mr: MemoryRegion,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    rem: Vec<KeyData>,
    /// Bytes per QP slot: max(size, cycle buffer).
    slot: u64,
}

impl Side {
    fn send_addr(&self, q: usize) -> u64 {
        self.mr.addr() + q as u64 * self.slot
    }
    fn recv_addr(&self, q: usize) -> u64 {
        self.mr.addr() + (self.qps.len() + q) as u64 * self.slot
    }
}

fn run(p: Params) -> AnyResult<()> {
    let args = p.args.clone();
    let chosen = args.gid_index.and_then(|x| u32::try_from(x).ok());
    let sel = Selection::from_env(args.ib_dev.clone(), args.ib_port, chosen).open()?;
    // `-x` with a negative index: no GID, even on Ethernet.
    let gid_pair = if args.gid_index.is_some_and(|x| x < 0) {
        None
    } else {
        sel.gid
    };
    let (ctx, port) = (sel.ctx, sel.port);
    let ethernet = port.is_ethernet();
    let gid_index: Option<u32> = gid_pair.map(|(i, _)| i);
    let gid = gid_pair.map(|(_, g)| g);
    let out_reads: u32 = if p.verb == Verb::Read {
        let max = ctx.query_device()?.raw().max_qp_rd_atom.clamp(1, 255) as u32;
        match args.outs {
            Some(o) if o > 0 && o <= max => o,
            Some(o) if o > max => {
                println!("{RESULT_LINE}");
                eprintln!(" Number of outstanding reads is above max = {max}");
                eprintln!(" Changing to that max value");
                max
            }
            _ => max.min(16),
        }
    } else {
        1
    };
    let my_mtu = match args.mtu {
        Some(m) => Mtu::from_bytes(m)
            .map(Mtu::code)
            .ok_or(" Invalid MTU - it must be 256, 512, 1024, 2048 or 4096")?,
        None => port.active_mtu().0,
    };

    // Out-of-band connection and the preliminary exchanges.
    // -R connects the QPs with the CM (work_rdma_cm); -R and -z carry the exchanges
    // over a CM connection (use_rdma_cm).
    let cm = args.rdma_cm;
    let link_cm = p.rdma_cm_link();
    let mut comm = if let Some(host) = &args.servername {
        if link_cm {
            Comm::connect_cm(host, args.port, Duration::from_secs(5))?
        } else {
            Comm::connect(host, args.port, Duration::from_secs(5))?
        }
    } else {
        println!();
        println!("************************************");
        println!("* Waiting for client to connect... *");
        println!("************************************");
        if link_cm {
            Comm::accept_cm(args.port)?
        } else {
            Comm::accept(args.port)?
        }
    };
    comm.set_gid_index(gid_index.map_or(-1, |i| i as i32));
    comm.versions()?;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u32;
    // SAFETY: as above.
    let line = unsafe { libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE) };
    let line = if line > 0 { line as u32 } else { 64 };
    let cycle_buffer = comm.xchg_u32(page)?.max(page);
    let _cache_line = comm.xchg_u32(line)?.max(line);
    let mtu = comm.mtu(my_mtu)?;

    // Resources and queue pairs: on our device context, or with -R on the context of
    // the CM ids (the CM creates the QPs and connects them).
    let nq = args.num_qps as usize;
    let max_size = p.sizes().into_iter().max().unwrap_or(p.size);
    let slot = max_size.max(cycle_buffer as u64).div_ceil(64) * 64;
    let (res, mut pending, cm_qps) = if cm {
        let param = rdma_cm::qp_param((p.verb == Verb::Read).then_some(out_reads));
        let sync = KeyData::default();
        let mut res: Option<Resources> = None;
        let mut make = |id: &CmId| -> Result<QueuePair<Init>, CommError> {
            let r = match &mut res {
                Some(r) => r,
                None => {
                    let ctx = id
                        .context()
                        .map_err(|e| CommError::Cm("the CM id has no device".into(), e))?;
                    res.insert(Resources::new(&ctx, &p, nq, slot).map_err(|e| {
                        CommError::Cm("Failed to initialize RDMA contexts.".into(), e)
                    })?)
                }
            };
            id.create_qp(&r.pd, &r.config)
                .map_err(|e| CommError::Cm("Failed to create QP.".into(), e))
        };
        // create_rdma_cm_connection: a handshake, the connections, a handshake.
        let (cm_qps, qps) = match &args.servername {
            Some(host) => {
                comm.handshake(&sync)?;
                rdma_cm::connect_qps(
                    host,
                    args.port,
                    nq,
                    &param,
                    Duration::from_secs(10),
                    &mut make,
                )?
            }
            None => {
                let listener = rdma_cm::QpListener::new(args.port, args.num_qps)?;
                comm.handshake(&sync)?;
                listener.accept(nq, &param, super::connect::SETUP_TIMEOUT, &mut make)?
            }
        };
        comm.handshake(&sync)?;
        let res = res.ok_or("no RDMA CM connection was made")?;
        (res, Pending::Connected(qps), Some(cm_qps))
    } else {
        let res = Resources::new(&ctx, &p, nq, slot)?;
        let init = InitAttr {
            port: args.ib_port,
            ..Default::default()
        };
        let mut inits: Vec<QueuePair<Init>> = Vec::with_capacity(nq);
        for _ in 0..nq {
            inits.push(QueuePair::new(&res.pd, &res.config)?.to_init(&init)?);
        }
        (res, Pending::Init(inits), None)
    };
    let Resources {
        mr,
        send_cq,
        recv_cq,
        ..
    } = res;
    let keys: Vec<KeyData> = pending
        .qp_nums()
        .into_iter()
        .enumerate()
        .map(|(i, qpn)| KeyData {
            lid: port.lid(),
            out_reads,
            qpn,
            psn: rdma_safe::random_psn(),
            rkey: mr.rkey(),
            vaddr: mr.addr() + (nq + i) as u64 * slot,
            gid: gid.map(|g| g.0),
            srqn: 0,
        })
        .collect();

    let mut info = report::test_info(
        &p,
        &ctx.name(),
        Mtu::from_code(mtu.clamp(1, 5)).map_or(4096, Mtu::bytes),
        ethernet,
        gid_index,
    );
    // The inline/outstanding-reads line sits before "rdma_cm QPs".
    if let Some(pos) = info.find(" rdma_cm QPs") {
        info.insert_str(pos, &(report::inline_or_reads_line(&p, out_reads) + "\n"));
    }
    println!("{info}");

    // Key exchanges and connection, in each tool's order.
    let lat_rdma = p.kind == TestKind::Lat && p.verb != Verb::Send;
    if lat_rdma {
        comm.handshake(&keys[0])?;
    }
    let mut rem = Vec::with_capacity(nq);
    for k in &keys {
        rem.push(comm.handshake(k)?);
    }
    let qps = match std::mem::replace(&mut pending, Pending::Connected(Vec::new())) {
        Pending::Connected(qps) => qps,
        Pending::Init(inits) => {
            if let (Some(a), Some(b)) = (keys[0].gid, rem[0].gid) {
                if Gid(a).is_ipv4_mapped() != Gid(b).is_ipv4_mapped() {
                    return Err("\n Found Incompatibility issue with GID types.\n Please Try to use a different IP version.".into());
                }
            }
            let mut qps = Vec::with_capacity(nq);
            for (i, qp) in inits.into_iter().enumerate() {
                let r = &rem[i];
                let mut rtr = RtrAttr::new(
                    RemoteEndpoint {
                        qpn: r.qpn,
                        psn: r.psn,
                        lid: r.lid,
                        gid: if gid_index.is_some() {
                            r.gid.map(Gid)
                        } else {
                            None
                        },
                    },
                    Mtu::from_code(mtu).unwrap_or(Mtu::B4096).into(),
                );
                rtr.port = args.ib_port;
                rtr.sgid_index = gid_index.unwrap_or(0) as u8;
                rtr.hop_limit = 0xff;
                rtr.sl = args.sl;
                rtr.max_dest_rd_atomic = out_reads as u8;
                rtr.min_rnr_timer = 12;
                let mut rts = RtsAttr::new(keys[i].psn);
                rts.timeout = args.qp_timeout;
                rts.max_rd_atomic = if p.verb == Verb::Read {
                    r.out_reads.clamp(1, 255) as u8
                } else {
                    1
                };
                let qp = qp.to_rtr(&rtr).map_err(|e| {
                    format!("Failed to modify QP {} to RTR: {}", keys[i].qpn, e.error)
                })?;
                let qp = qp
                    .to_rts(&rts)
                    .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
                qps.push(qp);
            }
            qps
        }
    };
    if p.verb == Verb::Send {
        comm.handshake(&keys[0])?;
    }
    // perftest prints the addresses with the comm struct's verb, SEND with -R or -z.
    let addr_verb = if link_cm { Verb::Send } else { p.verb };
    for k in &keys {
        println!("{}", report::address_lines("local", k, addr_verb));
    }
    for k in &keys {
        let r = comm.handshake(k)?;
        println!("{}", report::address_lines("remote", &r, addr_verb));
    }
    if p.verb != Verb::Send {
        comm.handshake(&keys[0])?;
    }

    let mut side = Side {
        clock: Clock::calibrate(),
        qps,
        cm: cm_qps,
        p: p.clone(),
        mr,
        send_cq,
        recv_cq,
        rem,
        slot,
    };
    let gbits = args.report_gbits;
    let k0 = keys[0];
    match (p.verb, p.kind) {
        (Verb::Write | Verb::Read, TestKind::Bw) => {
            println!("{RESULT_LINE}");
            println!("{}", report::bw_header(gbits));
            if !p.is_client {
                comm.set_timeout(None);
                comm.handshake(&k0)?;
                comm.set_timeout(Some(super::connect::SETUP_TIMEOUT));
                let rep = comm.reports(&BwReport::default())?;
                println!("{}", report::bw_row(&rep, gbits));
                comm.close(&k0)?;
                println!("{RESULT_LINE}");
            } else {
                let mut last = BwReport::default();
                for size in p.sizes() {
                    last = bw_client(&mut side, size)?;
                    println!("{}", report::bw_row(&last, gbits));
                }
                println!("{RESULT_LINE}");
                comm.handshake(&k0)?;
                comm.reports(&last)?;
                comm.close(&k0)?;
            }
        }
        (Verb::Send, TestKind::Bw) => {
            println!("{RESULT_LINE}");
            println!("{}", report::bw_header(gbits));
            let all = p.args.all;
            for size in p.sizes() {
                if !p.is_client {
                    post_initial_recvs(&side, size)?;
                }
                comm.set_timeout(None);
                comm.handshake(&k0)?;
                let rep = if p.is_client {
                    bw_client(&mut side, size)?
                } else {
                    bw_server_recv(&mut side, size)?
                };
                println!("{}", report::bw_row(&rep, gbits));
                if all {
                    comm.handshake(&k0)?;
                }
            }
            comm.set_timeout(Some(super::connect::SETUP_TIMEOUT));
            println!("{RESULT_LINE}");
            comm.close(&k0)?;
        }
        (Verb::Write, TestKind::Lat) => {
            println!("{RESULT_LINE}");
            println!("{}", report::lat_header(p.args.duration.is_some()));
            for size in p.sizes() {
                let posted = lat_write(&side, size)?;
                print_lat(&side.clock, size, p.iters, &posted, 2.0)?;
            }
            println!("{RESULT_LINE}");
            drop(comm);
        }
        (Verb::Read, TestKind::Lat) => {
            if !p.is_client {
                comm.set_timeout(None);
                comm.close(&k0)?;
                println!("{RESULT_LINE}");
            } else {
                println!("{RESULT_LINE}");
                println!("{}", report::lat_header(p.args.duration.is_some()));
                for size in p.sizes() {
                    let posted = lat_read(&side, size)?;
                    print_lat(&side.clock, size, p.iters, &posted, 1.0)?;
                }
                comm.close(&k0)?;
                println!("{RESULT_LINE}");
            }
        }
        (Verb::Send, TestKind::Lat) => {
            println!("{RESULT_LINE}");
            println!("{}", report::lat_header(p.args.duration.is_some()));
            for size in p.sizes() {
                post_initial_recvs(&side, size)?;
                comm.handshake(&k0)?;
                let posted = lat_send(&side, size)?;
                print_lat(&side.clock, size, p.iters, &posted, 2.0)?;
            }
            println!("{RESULT_LINE}");
            comm.close(&k0)?;
        }
    }
    side.rem.clear();
    if let Some(cm) = &side.cm {
        // rdma_cm_disconnect_nodes: the C client waits for its Disconnected events.
        cm.disconnect(Duration::from_secs(3));
    }
    Ok(())
}

/// The queue pairs between their creation and the key exchange: in INIT (to be
/// connected with the peer's keys) or already connected by the CM.
enum Pending {
    Init(Vec<QueuePair<Init>>),
    Connected(Vec<QueuePair<Rts>>),
}

impl Pending {
    fn qp_nums(&self) -> Vec<u32> {
        match self {
            Pending::Init(q) => q.iter().map(|q| q.qp_num()).collect(),
            Pending::Connected(q) => q.iter().map(|q| q.qp_num()).collect(),
        }
    }
}

/// The data path's memory and completion queues, and the QPs' configuration.
struct Resources {
    pd: Arc<ProtectionDomain>,
    mr: MemoryRegion,
    send_cq: Arc<CompletionQueue>,
    recv_cq: Arc<CompletionQueue>,
    config: QpConfig,
}

impl Resources {
    /// `ctx_init`: one region of two `slot`s per QP (send, then receive/target), the
    /// CQs and the QP sizes.
    fn new(ctx: &Arc<Context>, p: &Params, nq: usize, slot: u64) -> rdma_safe::Result<Self> {
        let pd = ProtectionDomain::new(ctx)?;
        let mr = MemoryRegion::new(
            &pd,
            (2 * nq as u64 * slot) as usize,
            Access::from_bits(
                Access::LOCAL_WRITE.bits()
                    | Access::REMOTE_WRITE.bits()
                    | Access::REMOTE_READ.bits(),
            ),
        )?;
        let num_qps = nq as u32;
        let send_cq = CompletionQueue::new(ctx, (p.tx_depth * num_qps).max(1) + 1)?;
        let recv_depth = if p.verb == Verb::Send {
            p.rx_depth * num_qps
        } else {
            1
        };
        let recv_cq = CompletionQueue::new(ctx, recv_depth.max(1) + 1)?;
        let mut config = QpConfig::rc(&send_cq);
        config.recv_cq = recv_cq.clone();
        config.max_send_wr = p.tx_depth.max(p.post_list);
        config.max_recv_wr = if p.verb == Verb::Send { p.rx_depth } else { 1 };
        config.max_inline_data = p.inline_size;
        Ok(Resources {
            pd,
            mr,
            send_cq,
            recv_cq,
            config,
        })
    }
}

fn print_lat(clock: &Clock, size: u64, iters: u64, run: &LatRun, rtt: f64) -> AnyResult<()> {
    match run {
        LatRun::Posted(posted) => {
            let t0 = posted.first().copied().unwrap_or(0);
            let ns: Vec<f64> = posted
                .iter()
                .map(|&t| clock.ns(t.wrapping_sub(t0)))
                .collect();
            let s =
                report::lat_stats(&ns, rtt).ok_or("too few iterations for latency statistics")?;
            println!("{}", report::lat_row(size, iters, &s));
        }
        LatRun::Sampled(count, ph) => {
            // print_report_lat_duration
            if *count == 0 {
                return Err("no iteration completed in the sampled window".into());
            }
            let secs = ph.window_secs();
            let latency = secs * 1e6 / rtt / *count as f64;
            let tps = *count as f64 / secs;
            println!("{}", report::lat_dur_row(size, *count, latency, tps));
        }
    }
    Ok(())
}

/// Busy-polling with a courtesy: after `EMPTY_POLLS_BEFORE_YIELD` fruitless polls in a
/// row the thread yields the CPU once.
///
/// On a machine with fewer CPUs than busy pollers (the 2-vCPU Soft-RoCE guest runs
/// two spinning peers), rxe's deferred work (its tasklets, run by `ksoftirqd`) would
/// otherwise wait for the next scheduler tick, milliseconds later. With a CPU to
/// spare, `sched_yield` returns at once and costs one system call per
/// `EMPTY_POLLS_BEFORE_YIELD` empty polls.
#[derive(Debug, Default)]
pub struct Relax {
    empty: u32,
}

/// Empty polls in a row before [`Relax`] yields.
pub const EMPTY_POLLS_BEFORE_YIELD: u32 = 128;

impl Relax {
    /// Records an empty poll; yields the CPU every `EMPTY_POLLS_BEFORE_YIELD`th one.
    #[inline]
    pub fn idle(&mut self) {
        self.empty += 1;
        if self.empty >= EMPTY_POLLS_BEFORE_YIELD {
            self.empty = 0;
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }

    /// Records progress.
    #[inline]
    pub fn busy(&mut self) {
        self.empty = 0;
    }
}

/// perftest's duration mode (`-D`): a margin of a quarter of the duration (whole
/// seconds: perftest's integer division), the sampled window, the margin again. Only
/// work completed inside the window counts; the figures are over the window's length.
#[derive(Clone, Copy, Debug)]
pub struct Phases {
    sample_start: Instant,
    sample_end: Instant,
    end: Instant,
}

impl Phases {
    /// The phases of a run of `secs` seconds starting now.
    pub fn start(secs: u64) -> Phases {
        let margin = Duration::from_secs(secs / 4);
        let now = Instant::now();
        let total = Duration::from_secs(secs);
        Phases {
            sample_start: now + margin,
            sample_end: now + total - margin,
            end: now + total,
        }
    }

    /// True inside the sampled window.
    #[inline]
    pub fn sampling(&self, now: Instant) -> bool {
        now >= self.sample_start && now < self.sample_end
    }

    /// True once the run is over.
    #[inline]
    pub fn ended(&self, now: Instant) -> bool {
        now >= self.end
    }

    /// The sampled window's length in seconds.
    pub fn window_secs(&self) -> f64 {
        (self.sample_end - self.sample_start).as_secs_f64()
    }
}

/// Bandwidth figures of a duration run: `count` messages of `size` in the window.
fn duration_report(size: u64, count: u64, phases: &Phases, gbits: bool) -> BwReport {
    let secs = phases.window_secs().max(1e-9);
    let factor = if gbits { 125e6 } else { 1048576.0 };
    BwReport {
        size,
        iters: count,
        bw_peak: 0.0,
        bw_avg: size as f64 * count as f64 / (secs * factor),
        msg_rate: count as f64 / secs / 1e6,
    }
}

/// A cheap clock for the data path: the CPU's time-stamp counter (as perftest's
/// `get_cycles`), calibrated once against the monotonic clock; elsewhere `Instant`.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    ns_per_tick: f64,
}

impl Clock {
    /// Calibrates the counter over 20 ms.
    pub fn calibrate() -> Clock {
        if cfg!(target_arch = "x86_64") {
            let (t0, c0) = (Instant::now(), Self::ticks_raw());
            std::thread::sleep(Duration::from_millis(20));
            let (t1, c1) = (Instant::now(), Self::ticks_raw());
            let ticks = c1.wrapping_sub(c0);
            if ticks > 0 {
                return Clock {
                    ns_per_tick: (t1 - t0).as_nanos() as f64 / ticks as f64,
                };
            }
        }
        Clock { ns_per_tick: 1.0 }
    }

    #[cfg(target_arch = "x86_64")]
    fn ticks_raw() -> u64 {
        // SAFETY: RDTSC has no preconditions on x86_64; it only reads a counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn ticks_raw() -> u64 {
        static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        START.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }

    /// The counter now.
    #[inline]
    pub fn ticks(&self) -> u64 {
        Self::ticks_raw()
    }

    /// Counter ticks to nanoseconds.
    #[inline]
    pub fn ns(&self, ticks: u64) -> f64 {
        ticks as f64 * self.ns_per_tick
    }

    /// Ticks in a duration.
    pub fn ticks_in(&self, d: Duration) -> u64 {
        (d.as_nanos() as f64 / self.ns_per_tick) as u64
    }
}

fn completion_error(wc: &WorkCompletion, what: &str) -> Box<dyn std::error::Error> {
    format!(
        " Completion with error at {what}:\n Failed status {}: wr_id {} syndrom 0x{:x}",
        rdma_safe::cq::status_text(wc.status()),
        wc.wr_id(),
        wc.0.vendor_err
    )
    .into()
}

/// The bandwidth client (`run_iter_bw`): keeps up to `tx_depth` requests in flight per
/// QP, posts lists of `post_list`, signals every `cq_mod`-th.
fn bw_client(side: &mut Side, size: u64) -> AnyResult<BwReport> {
    let p = side.p.clone();
    let nq = side.qps.len();
    let pl = p.post_list as usize;
    let opcode = match p.verb {
        Verb::Send => sys::ibv_wr_opcode::IBV_WR_SEND,
        Verb::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
        Verb::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
    };
    let inline = p.verb != Verb::Read && size <= p.inline_size as u64;
    // Work requests and SGEs per QP, in boxed slices that never move.
    let mut sges: Vec<Box<[sys::ibv_sge]>> = (0..nq)
        .map(|q| {
            vec![
                sys::ibv_sge {
                    addr: side.send_addr(q),
                    length: size as u32,
                    lkey: side.mr.lkey(),
                };
                pl
            ]
            .into_boxed_slice()
        })
        .collect();
    let mut wrs: Vec<Box<[sys::ibv_send_wr]>> = (0..nq)
        .map(|_| vec![sys::ibv_send_wr::default(); pl].into_boxed_slice())
        .collect();
    for q in 0..nq {
        let sge_ptr = sges[q].as_mut_ptr();
        let list = &mut wrs[q];
        let base = list.as_mut_ptr();
        for (j, wr) in list.iter_mut().enumerate() {
            // SAFETY: j < pl, inside both boxed slices.
            wr.sg_list = unsafe { sge_ptr.add(j) };
            wr.num_sge = 1;
            wr.opcode = opcode;
            wr.wr.rdma.remote_addr = side.rem[q].vaddr;
            wr.wr.rdma.rkey = side.rem[q].rkey;
            wr.next = if j + 1 < pl {
                // SAFETY: j + 1 < pl, inside the slice.
                unsafe { base.add(j + 1) }
            } else {
                std::ptr::null_mut()
            };
        }
    }
    let duration = p.args.duration.map(Duration::from_secs);
    let iters = p.iters;
    let tot = if duration.is_some() {
        0
    } else {
        iters * nq as u64
    };
    let keep_times = duration.is_none();
    let mut posted = vec![0u64; if keep_times { tot as usize } else { 0 }];
    let mut completed = vec![0u64; if keep_times { tot as usize } else { 0 }];
    let clock = side.clock;
    let stall = clock.ticks_in(STALL);
    let mut scnt = vec![0u64; nq];
    let mut ccnt = vec![0u64; nq];
    let mut since_signal = vec![0u64; nq];
    let (mut totscnt, mut totccnt) = (0u64, 0u64);
    let mut wcs = [WorkCompletion::default(); 16];
    let phases = p.args.duration.map(Phases::start);
    let mut sampled = 0u64;
    let mut stopped = false;
    let mut last_progress = clock.ticks();
    let cq_mod = p.cq_mod as u64;
    let tx_depth = p.tx_depth as u64;
    let (mut signaled_posted, mut signaled_done) = (0u64, 0u64);
    let mut relax = Relax::default();
    loop {
        let running = match &phases {
            // Once over, for good: posting must stop (the peer stops receiving).
            Some(ph) => {
                stopped = stopped || ph.ended(Instant::now());
                !stopped
            }
            None => totscnt < tot,
        };
        if !running && signaled_done == signaled_posted {
            break;
        }
        if running {
            for q in 0..nq {
                while (duration.is_some() || scnt[q] < iters)
                    && scnt[q] - ccnt[q] + pl as u64 <= tx_depth
                {
                    // As perftest checks its alarm's state before each post: a post
                    // may take long (rxe sends in the caller's context).
                    if let Some(ph) = &phases {
                        if stopped || ph.ended(Instant::now()) {
                            stopped = true;
                            break;
                        }
                    }
                    let list = &mut wrs[q];
                    for (j, wr) in list.iter_mut().enumerate() {
                        let s = scnt[q] + j as u64;
                        since_signal[q] += 1;
                        let signal =
                            (s + 1) % cq_mod == 0 || (duration.is_none() && s == iters - 1);
                        let mut flags = 0;
                        if signal {
                            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                            wr.wr_id = ((q as u64) << 48) | since_signal[q];
                            since_signal[q] = 0;
                            signaled_posted += 1;
                        } else {
                            wr.wr_id = (q as u64) << 48;
                        }
                        if inline {
                            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
                        }
                        wr.send_flags = flags;
                    }
                    if keep_times {
                        posted[totscnt as usize] = clock.ticks();
                    }
                    // SAFETY: the list and its SGEs live in boxed slices that outlive
                    // every signaled completion (all polled before this function
                    // returns); unsignaled requests before them completed earlier. The
                    // buffers belong to the region, which outlives the QPs.
                    unsafe { side.qps[q].post_send_raw(list.as_mut_ptr()) }
                        .map_err(|e| format!("Couldn't post send: qp {q} scnt={}: {e}", scnt[q]))?;
                    scnt[q] += pl as u64;
                    totscnt += pl as u64;
                }
            }
        }
        let n = side.send_cq.poll(&mut wcs)?.len();
        if n == 0 {
            relax.idle();
            if clock.ticks().wrapping_sub(last_progress) > stall {
                return Err(format!(
                    "no completion for {} s ({totccnt} of {totscnt} completed)",
                    STALL.as_secs()
                )
                .into());
            }
            continue;
        }
        relax.busy();
        let t = clock.ticks();
        last_progress = t;
        let in_window = phases.is_some_and(|ph| ph.sampling(Instant::now()));
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(completion_error(wc, "send"));
            }
            signaled_done += 1;
            let q = (wc.wr_id() >> 48) as usize;
            let covers = wc.wr_id() & 0xffff_ffff_ffff;
            ccnt[q] += covers;
            let from = totccnt;
            totccnt += covers;
            if in_window {
                sampled += covers;
            }
            if keep_times {
                let to = totccnt.min(tot);
                for slot in &mut completed[from.min(tot) as usize..to as usize] {
                    *slot = t;
                }
            }
        }
    }
    if let Some(ph) = &phases {
        return Ok(duration_report(size, sampled, ph, p.args.report_gbits));
    }
    let t0 = posted.first().copied().unwrap_or(0);
    let to_ns = |v: &[u64]| -> Vec<f64> {
        v.iter()
            .map(|&t| clock.ns(t.wrapping_sub(t0) as i64 as u64))
            .collect()
    };
    Ok(report::bw_report(
        size,
        &to_ns(&posted),
        &to_ns(&completed),
        p.cq_mod as usize,
        pl,
        p.no_peak,
        p.args.report_gbits,
    ))
}

/// Posts the first receives of a SEND test: `min(rx_depth, iters)` per QP (`rx_depth`
/// in duration mode).
fn post_initial_recvs(side: &Side, size: u64) -> AnyResult<()> {
    let n = if side.p.args.duration.is_some() {
        side.p.rx_depth as u64
    } else {
        (side.p.rx_depth as u64).min(side.p.iters)
    };
    for q in 0..side.qps.len() {
        for _ in 0..n {
            post_recv(side, q, size)?;
        }
    }
    Ok(())
}

fn post_recv(side: &Side, q: usize, size: u64) -> AnyResult<()> {
    let mut sge = sys::ibv_sge {
        addr: side.recv_addr(q),
        length: size as u32,
        lkey: side.mr.lkey(),
    };
    let mut wr = sys::ibv_recv_wr {
        wr_id: q as u64,
        sg_list: &mut sge,
        num_sge: 1,
        ..Default::default()
    };
    // SAFETY: `wr` and `sge` live across the call; the receive buffer belongs to the
    // region, which outlives the QPs (both in `Side`, the region dropped after them).
    unsafe { side.qps[q].post_recv_raw(&mut wr) }
        .map_err(|e| format!("Couldn't post recv Qp={q}: {e}"))?;
    Ok(())
}

/// The SEND bandwidth server (`run_iter_bw_server`): receives `iters` per QP,
/// reposting while more are expected; timed from the first receive. With `-D` the
/// phases start at the first receive, every receive is reposted, and those of the
/// sampled window count.
fn bw_server_recv(side: &mut Side, size: u64) -> AnyResult<BwReport> {
    let p = side.p.clone();
    let nq = side.qps.len();
    let timed = p.args.duration;
    let tot = p.iters * nq as u64;
    let mut posted = vec![(p.rx_depth as u64).min(p.iters); nq];
    let mut rcnt = 0u64;
    let mut wcs = [WorkCompletion::default(); 16];
    // The data path reads the cheap clock (the time-stamp counter): reading the
    // system clock on every empty poll slowed this loop by a tenth (HPET guests).
    let clock = side.clock;
    let stall = clock.ticks_in(STALL);
    let mut first: Option<Instant> = None;
    let mut phases: Option<Phases> = None;
    let mut sampled = 0u64;
    let mut relax = Relax::default();
    let mut last_progress = clock.ticks();
    loop {
        match &phases {
            Some(ph) if ph.ended(Instant::now()) => break,
            None if timed.is_none() && rcnt >= tot => break,
            _ => {}
        }
        let n = side.recv_cq.poll(&mut wcs)?.len();
        if n == 0 {
            relax.idle();
            if clock.ticks().wrapping_sub(last_progress) > stall {
                return Err(
                    format!("no receive for {} s ({rcnt} of {tot})", STALL.as_secs()).into(),
                );
            }
            continue;
        }
        relax.busy();
        last_progress = clock.ticks();
        first.get_or_insert_with(Instant::now);
        if let (Some(secs), None) = (timed, &phases) {
            phases = Some(Phases::start(secs));
        }
        let in_window = phases.is_some_and(|ph| ph.sampling(Instant::now()));
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(completion_error(wc, "receive"));
            }
            rcnt += 1;
            if in_window {
                sampled += 1;
            }
            let q = wc.wr_id() as usize;
            if timed.is_some() || posted[q] < p.iters {
                post_recv(side, q, size)?;
                posted[q] += 1;
            }
        }
    }
    if let Some(ph) = &phases {
        return Ok(duration_report(size, sampled, ph, p.args.report_gbits));
    }
    let secs = first.map_or(1e-9, |f| f.elapsed().as_secs_f64()).max(1e-9);
    let factor = if p.args.report_gbits {
        125e6
    } else {
        1048576.0
    };
    Ok(BwReport {
        size,
        iters: tot,
        bw_peak: 0.0,
        bw_avg: size as f64 * tot as f64 / (secs * factor),
        msg_rate: tot as f64 / secs / 1e6,
    })
}

fn single_wr(
    side: &Side,
    size: u64,
    opcode: sys::ibv_wr_opcode,
    sge: &mut sys::ibv_sge,
) -> sys::ibv_send_wr {
    let mut wr = sys::ibv_send_wr {
        wr_id: 0,
        sg_list: sge,
        num_sge: 1,
        opcode,
        send_flags: sys::ibv_send_flags::IBV_SEND_SIGNALED.0,
        ..Default::default()
    };
    if opcode != sys::ibv_wr_opcode::IBV_WR_RDMA_READ && size <= side.p.inline_size as u64 {
        wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    wr.wr.rdma.remote_addr = side.rem[0].vaddr;
    wr.wr.rdma.rkey = side.rem[0].rkey;
    wr
}

fn poll_one(clock: &Clock, cq: &CompletionQueue, what: &str) -> AnyResult<()> {
    poll_one_until(clock, cq, what, None).map(|_| ())
}

/// Polls for one completion; `Ok(false)` when `phases` ended first.
fn poll_one_until(
    clock: &Clock,
    cq: &CompletionQueue,
    what: &str,
    phases: Option<&Phases>,
) -> AnyResult<bool> {
    let mut wc = [WorkCompletion::default(); 1];
    let start = clock.ticks();
    let mut spins = 0u32;
    let mut relax = Relax::default();
    loop {
        if let Some(wc) = cq.poll(&mut wc)?.first() {
            if !wc.is_ok() {
                return Err(completion_error(wc, what));
            }
            return Ok(true);
        }
        relax.idle();
        spins = spins.wrapping_add(1);
        if phases.is_some_and(|ph| spins % 16 == 0 && ph.ended(Instant::now())) {
            return Ok(false);
        }
        if spins % 4096 == 0 && clock.ticks().wrapping_sub(start) > clock.ticks_in(STALL) {
            return Err(format!("no {what} completion for {} s", STALL.as_secs()).into());
        }
    }
}

/// What a latency run measured: every post time (iterations), or with `-D` the
/// iterations of the sampled window.
pub enum LatRun {
    /// Post times in clock ticks, one per iteration.
    Posted(Vec<u64>),
    /// Duration mode: iterations counted in the window, and the phases.
    Sampled(u64, Phases),
}

/// `run_iter_lat_write`: each side writes the iteration number into the last byte of
/// the peer's buffer and waits for the peer's write into its own. With `-D` both sides
/// go on until the end of their own run and count the completions of the window.
fn lat_write(side: &Side, size: u64) -> AnyResult<LatRun> {
    let phases = side.p.args.duration.map(Phases::start);
    let timed = phases.is_some();
    let iters = if timed { u64::MAX } else { side.p.iters };
    let base_ptr = side.mr.addr() as *mut u8;
    // SAFETY: both offsets are inside the region (size <= slot, 2 slots per QP).
    let post_buf = unsafe { base_ptr.add(size as usize - 1) };
    // SAFETY: as above.
    let poll_buf = unsafe { base_ptr.add((side.qps.len() as u64 * side.slot + size - 1) as usize) };
    let mut sge = sys::ibv_sge {
        addr: side.send_addr(0),
        length: size as u32,
        lkey: side.mr.lkey(),
    };
    let mut wr = single_wr(side, size, sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE, &mut sge);
    let mut posted = vec![0u64; if timed { 0 } else { iters as usize }];
    let (mut scnt, mut ccnt, mut rcnt) = (0u64, 0u64, 0u64);
    let mut sampled = 0u64;
    let server = !side.p.is_client;
    let clock = side.clock;
    let stall = clock.ticks_in(STALL);
    'run: while scnt < iters || ccnt < iters || rcnt < iters {
        if phases.is_some_and(|ph| ph.ended(Instant::now())) {
            break;
        }
        if rcnt < iters && !(scnt < 1 && server) {
            rcnt += 1;
            let start = clock.ticks();
            let mut spins = 0u32;
            let mut relax = Relax::default();
            // SAFETY: poll_buf points into the registered region, which the peer writes
            // by RDMA; a volatile read observes its writes.
            while unsafe { std::ptr::read_volatile(poll_buf) } != rcnt as u8 {
                spins = spins.wrapping_add(1);
                if timed && spins % 16 == 0 && phases.is_some_and(|ph| ph.ended(Instant::now())) {
                    break 'run;
                }
                if spins % 65536 == 0 && clock.ticks().wrapping_sub(start) > stall {
                    return Err(format!(
                        "the peer's write {rcnt} did not arrive within {} s",
                        STALL.as_secs()
                    )
                    .into());
                }
                relax.idle();
            }
        }
        if scnt < iters {
            if !timed {
                posted[scnt as usize] = clock.ticks();
            }
            scnt += 1;
            // SAFETY: post_buf is inside the region; the previous write that read it
            // has completed (polled below before the next iteration).
            unsafe { std::ptr::write_volatile(post_buf, scnt as u8) };
            // SAFETY: `wr` and `sge` outlive the completion, polled right below.
            unsafe { side.qps[0].post_send_raw(&mut wr) }
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
        }
        if ccnt < iters {
            poll_one(&clock, &side.send_cq, "RDMA WRITE")?;
            ccnt += 1;
            if phases.is_some_and(|ph| ph.sampling(Instant::now())) {
                sampled += 1;
            }
        }
    }
    Ok(match phases {
        Some(ph) => LatRun::Sampled(sampled, ph),
        None => LatRun::Posted(posted),
    })
}

/// `run_iter_lat`: the client READs, one at a time.
fn lat_read(side: &Side, size: u64) -> AnyResult<LatRun> {
    let phases = side.p.args.duration.map(Phases::start);
    let mut sge = sys::ibv_sge {
        addr: side.send_addr(0),
        length: size as u32,
        lkey: side.mr.lkey(),
    };
    let mut wr = single_wr(side, size, sys::ibv_wr_opcode::IBV_WR_RDMA_READ, &mut sge);
    let clock = side.clock;
    let post = |wr: &mut sys::ibv_send_wr| -> AnyResult<()> {
        // SAFETY: `wr` and `sge` outlive the completion, polled right after.
        unsafe { side.qps[0].post_send_raw(wr) }.map_err(|e| format!("Couldn't post send: {e}"))?;
        poll_one(&clock, &side.send_cq, "RDMA READ")
    };
    if let Some(ph) = phases {
        let mut sampled = 0u64;
        while !ph.ended(Instant::now()) {
            post(&mut wr)?;
            if ph.sampling(Instant::now()) {
                sampled += 1;
            }
        }
        return Ok(LatRun::Sampled(sampled, ph));
    }
    let mut posted = vec![0u64; side.p.iters as usize];
    for slot in posted.iter_mut() {
        *slot = clock.ticks();
        post(&mut wr)?;
    }
    Ok(LatRun::Posted(posted))
}

/// `run_iter_lat_send`: SEND ping-pong, the client first. With `-D` every receive is
/// reposted and those of the window count.
fn lat_send(side: &Side, size: u64) -> AnyResult<LatRun> {
    let p = &side.p;
    let phases = p.args.duration.map(Phases::start);
    let timed = phases.is_some();
    let iters = if timed { u64::MAX } else { p.iters };
    let rx_depth = (p.rx_depth as u64).min(iters);
    let mut sge = sys::ibv_sge {
        addr: side.send_addr(0),
        length: size as u32,
        lkey: side.mr.lkey(),
    };
    let mut wr = single_wr(side, size, sys::ibv_wr_opcode::IBV_WR_SEND, &mut sge);
    let mut posted = vec![0u64; if timed { 0 } else { iters as usize }];
    let (mut scnt, mut rcnt) = (0u64, 0u64);
    let mut sampled = 0u64;
    let client = p.is_client;
    let clock = side.clock;
    while scnt < iters || rcnt < iters {
        if phases.is_some_and(|ph| ph.ended(Instant::now())) {
            break;
        }
        if rcnt < iters && !(scnt < 1 && client) {
            if !poll_one_until(&clock, &side.recv_cq, "receive", phases.as_ref())? {
                break;
            }
            rcnt += 1;
            if phases.is_some_and(|ph| ph.sampling(Instant::now())) {
                sampled += 1;
            }
            if timed || rcnt + rx_depth <= iters {
                post_recv(side, 0, size)?;
            }
        }
        if phases.is_some_and(|ph| ph.ended(Instant::now())) {
            break;
        }
        if scnt < iters {
            if !timed {
                posted[scnt as usize] = clock.ticks();
            }
            scnt += 1;
            // SAFETY: `wr` and `sge` outlive the completion, polled right below (every
            // send is signaled: the latency tools' moderation is 1).
            unsafe { side.qps[0].post_send_raw(&mut wr) }
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
            poll_one(&clock, &side.send_cq, "send")?;
        }
    }
    Ok(match phases {
        Some(ph) => LatRun::Sampled(sampled, ph),
        None => LatRun::Posted(posted),
    })
}
