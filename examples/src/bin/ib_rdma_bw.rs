//! `ib_rdma_bw`: the old perftest RDMA WRITE bandwidth test (removed from perftest in
//! 2012), ported. A 45-byte address exchange over TCP, an RDMA WRITE loop with up to
//! `-t` writes in flight, `-b` for both directions at once, and the peak/average
//! bandwidth and service-demand report, each line prefixed with the process id.
//!
//! On RoCE the exchange carries the GID too (78 bytes; see
//! `examples::perftest::legacy`), and the path MTU is the smaller of 2048 (the C
//! program's) and the port's active MTU.
//!
//! ```text
//! ib_rdma_bw [-p port] [-d dev] [-i ib-port] [-g gid-idx] [-s size] [-t tx-depth]
//!            [-n iters] [-S sl] [-b] [host]
//! ```

use clap::Parser;
use examples::perftest::legacy::{c_g, read_dest_within, LegacyDest};
use examples::perftest::report::c_alt_hex;
use examples::perftest::run::{Clock, Relax};
use rdma_safe::qp::Init;
use rdma_safe::sys;
use rdma_safe::Deadline;
use rdma_safe::{
    Access, CompletionQueue, Gid, InitAttr, Lease, LeasedQp, MemoryRegion, ProtectionDomain,
    QpConfig, QueuePair, RemoteEndpoint, RemoteSlice, RtrAttr, RtsAttr, SendOp, WorkCompletion,
};
use std::io::Write;
use std::net::{Ipv6Addr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

/// Command line, as the C program's.
#[derive(Parser, Debug)]
#[command(
    name = "ib_rdma_bw",
    about = "RDMA WRITE bandwidth (port of the old perftest ib_rdma_bw)"
)]
struct Args {
    /// listen on/connect to port
    #[arg(short = 'p', long = "port", default_value_t = 18515)]
    port: u16,
    /// use IB device (default: RDMA_DEVICE, else the first device found)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// use port of IB device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (default on Ethernet: RDMA_GID_INDEX, else the RoCE v2 IPv4 GID; on InfiniBand: none)
    #[arg(short = 'g', long = "gid-idx")]
    gid_idx: Option<u32>,
    /// size of message to exchange
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: u32,
    /// size of tx queue
    #[arg(short = 't', long = "tx-depth", default_value_t = 100)]
    tx_depth: u32,
    /// number of exchanges (at least 2)
    #[arg(short = 'n', long = "iters", default_value_t = 1000)]
    iters: u32,
    /// SL
    #[arg(short = 'S', long = "sl", default_value_t = 0)]
    sl: u8,
    /// Type Of Service (accepted; used with RDMA CM only)
    #[arg(short = 'T', long = "tos", default_value_t = 0)]
    tos: u8,
    /// measure bidirectional bandwidth
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// use RDMA CM (not supported by this port)
    #[arg(short = 'c', long = "cma")]
    cma: bool,
    /// server to connect to (none: be the server)
    servername: Option<String>,
}

type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = Args::parse();
    let pid = std::process::id();
    if let Err(e) = run(&args, pid) {
        eprintln!("{pid}: {e}");
        std::process::exit(1);
    }
}

/// One exchange: the client writes then reads, the server reads then writes, all
/// within `allowed`.
fn exchange(
    sock: &mut TcpStream,
    client: bool,
    mine: &LegacyDest,
    allowed: Duration,
) -> AnyResult<LegacyDest> {
    let deadline = Deadline::after(allowed, "the address exchange");
    if client {
        deadline.write_all(sock, &mine.encode(), "address")?;
        read_dest_within(sock, &deadline)
    } else {
        let rem = read_dest_within(sock, &deadline)?;
        deadline.write_all(sock, &mine.encode(), "address")?;
        Ok(rem)
    }
}

/// How long each address exchange before the run may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(60);

/// How long the exchange after the run may take once this side is done: the
/// server of a one-way run waits there for the client's whole run, as C's
/// blocking read does (no limit: a client that dies closes the connection).
const RUN_TIMEOUT: Duration = Duration::MAX;

/// `LID %#04x, QPN %#06x, PSN %#06x<sep>RKey %#08x VAddr %#016Lx`, plus the GID
/// when one is used. The C program puts a comma before RKey only on the remote line.
fn addr_line(d: &LegacyDest, sep: &str) -> String {
    let gid = d
        .gid
        .map(|g| format!(", GID {}", Ipv6Addr::from(g)))
        .unwrap_or_default();
    format!(
        "LID {}, QPN {}, PSN {}{sep}RKey {} VAddr {}{gid}",
        c_alt_hex(d.lid as u64, 4),
        c_alt_hex(d.qpn as u64, 6),
        c_alt_hex(d.psn as u64, 6),
        c_alt_hex(d.rkey as u64, 8),
        c_alt_hex(d.vaddr, 16)
    )
}

fn run(args: &Args, pid: u32) -> AnyResult<()> {
    if args.cma {
        return Err("-c (RDMA CM) is not supported by this port".into());
    }
    if args.iters < 2 || args.size == 0 || args.tx_depth == 0 {
        return Err("iterations must be at least 2, size and tx depth at least 1".into());
    }
    println!(
        "{pid}: | port={} | ib_port={} | size={} | tx_depth={} | sl={} | iters={} | duplex={} | cma={} |",
        args.port, args.ib_port, args.size, args.tx_depth, args.sl, args.iters,
        args.bidirectional as i32, args.cma as i32
    );
    let Setup {
        port,
        gid_index,
        mr,
        qp,
        me,
    } = Setup::open(args)?;
    let client = args.servername.is_some();
    let mut sock = match &args.servername {
        Some(host) => examples::tcp::connect(host, args.port, Duration::from_secs(5))?,
        None => examples::tcp::accept(args.port)?,
    };
    let me = &me;
    let rem = exchange(&mut sock, client, me, EXCHANGE_TIMEOUT)?;
    println!("{pid}: Local address:  {}", addr_line(me, " "));
    println!("{pid}: Remote address: {}\n", addr_line(&rem, ", "));
    let mut conn = connect(args, qp, (&port, gid_index), me, &rem)?;
    // An additional handshake is required after moving the QP to RTR.
    exchange(&mut sock, client, me, EXCHANGE_TIMEOUT)?;

    if !client && !args.bidirectional {
        exchange(&mut sock, client, me, RUN_TIMEOUT)?;
        sock.write_all(b"done\0")?;
        return Ok(());
    }

    let clock = Clock::calibrate();
    let source = Arc::new(mr);
    let times = write_loop(args, &clock, &mut conn, &source, &rem)?;
    // The peer may still be writing (a bidirectional run) or reading our writes.
    exchange(&mut sock, client, me, RUN_TIMEOUT)?;
    sock.write_all(b"done\0")?;
    drop(conn);
    report(
        pid,
        &clock,
        args.size as u64,
        args.bidirectional,
        &times.posted,
        &times.completed,
    );
    Ok(())
}

/// The device, the buffer (the source in its first half, the peer's target in its
/// second), the queue pair in INIT and this side's address.
struct Setup {
    port: rdma_safe::PortAttr,
    gid_index: Option<u32>,
    mr: MemoryRegion,
    qp: QueuePair<Init>,
    me: LegacyDest,
}

impl Setup {
    fn open(args: &Args) -> AnyResult<Setup> {
        let sel = rdma_safe::Selection::from_env(args.ib_dev.clone(), args.ib_port, args.gid_idx)
            .open()?;
        let (gid_index, gid) = (sel.gid_index(), sel.gid.map(|(_, g)| g));
        let (ctx, port) = (sel.ctx, sel.port);
        if gid_index.is_none() && port.lid() == 0 {
            return Err("Local lid 0x0 detected. Is an SM running?".into());
        }
        let size = args.size as usize;
        let pd = ProtectionDomain::new(&ctx)?;
        let mr = MemoryRegion::new(
            &pd,
            2 * size,
            Access::from_bits(Access::LOCAL_WRITE.bits() | Access::REMOTE_WRITE.bits()),
        )?;
        let cq = CompletionQueue::new(&ctx, args.tx_depth + 1)?;
        let mut config = QpConfig::rc(&cq);
        config.max_send_wr = args.tx_depth;
        config.max_recv_wr = 1;
        let qp = QueuePair::new(&pd, &config)?.to_init(&InitAttr {
            port: args.ib_port,
            pkey_index: 0,
            access: Access::REMOTE_WRITE,
            qkey: 0,
        })?;
        let me = LegacyDest {
            lid: port.lid(),
            qpn: qp.qp_num(),
            psn: rdma_safe::random_psn(),
            rkey: mr.rkey(),
            vaddr: mr.addr() + size as u64,
            gid: gid.map(|g| g.0),
        };
        Ok(Setup {
            port,
            gid_index,
            mr,
            qp,
            me,
        })
    }
}

/// RTR towards `rem` with the smaller of 2048 and the port's MTU (and the GID at
/// `gid_index`, if one is used), then RTS.
fn connect(
    args: &Args,
    qp: QueuePair<Init>,
    (port, gid_index): (&rdma_safe::PortAttr, Option<u32>),
    me: &LegacyDest,
    rem: &LegacyDest,
) -> AnyResult<LeasedQp> {
    let mtu = if port.active_mtu().0 < sys::ibv_mtu::IBV_MTU_2048.0 {
        port.active_mtu()
    } else {
        sys::ibv_mtu::IBV_MTU_2048
    };
    let mut rtr = RtrAttr::new(
        RemoteEndpoint {
            qpn: rem.qpn,
            psn: rem.psn,
            lid: rem.lid,
            gid: rem.gid.filter(|_| gid_index.is_some()).map(Gid),
        },
        mtu,
    );
    rtr.port = args.ib_port;
    rtr.sl = args.sl;
    rtr.sgid_index = gid_index.unwrap_or(0) as u8;
    let qp = qp
        .to_rtr(&rtr)
        .map_err(|e| format!("Failed to modify QP to RTR: {}", e.error))?
        .to_rts(&RtsAttr::new(me.psn))
        .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
    Ok(LeasedQp::new(qp).map_err(|e| e.error)?)
}

/// When each write was posted and completed, in clock ticks.
struct Times {
    posted: Vec<u64>,
    completed: Vec<u64>,
}

/// `-n` RDMA WRITEs of the source (the region's first `-s` bytes) to the peer's
/// buffer, up to `-t` in flight, every one signaled; each holds the source until its
/// completion.
fn write_loop(
    args: &Args,
    clock: &Clock,
    conn: &mut LeasedQp,
    source: &Arc<MemoryRegion>,
    rem: &LegacyDest,
) -> AnyResult<Times> {
    let iters = args.iters as usize;
    let mut times = Times {
        posted: vec![0; iters],
        completed: vec![0; iters],
    };
    let op = SendOp::Write(RemoteSlice {
        addr: rem.vaddr,
        len: args.size as u64,
        rkey: rem.rkey,
    });
    let cq = conn.qp().send_cq().clone();
    let side = if args.servername.is_some() {
        "client"
    } else {
        "server"
    };
    let (mut scnt, mut ccnt) = (0usize, 0usize);
    let mut wcs = [WorkCompletion::default(); 1];
    let stall = clock.ticks_in(Duration::from_secs(30));
    while scnt < iters || ccnt < iters {
        while scnt < iters && scnt - ccnt < args.tx_depth as usize {
            times.posted[scnt] = clock.ticks();
            let lease = Lease::Shared(source.clone());
            conn.post_send(3, op, lease, 0..args.size as usize, true)
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
            scnt += 1;
        }
        if ccnt < iters {
            let start = clock.ticks();
            let mut relax = Relax::default();
            let wc = loop {
                if let Some(wc) = cq.poll_completions(&mut wcs)?.next() {
                    break wc;
                }
                relax.idle();
                if clock.ticks().wrapping_sub(start) > stall {
                    return Err(format!("no completion for 30 s: scnt={scnt}, ccnt={ccnt}").into());
                }
            };
            times.completed[ccnt] = clock.ticks();
            let status = wc.status();
            let wr_id = conn.complete(wc)?.wr_id();
            if status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!(
                    "{side} completion error: {} (wr_id {wr_id}), scnt={scnt}, ccnt={ccnt}",
                    rdma_safe::cq::status_text(status),
                )
                .into());
            }
            ccnt += 1;
        }
    }
    Ok(times)
}

/// The C program's report: peak over every window, average, service demand.
fn report(pid: u32, clock: &Clock, size: u64, duplex: bool, posted: &[u64], completed: &[u64]) {
    let n = posted.len();
    let (mut opt_i, mut opt_j) = (0, 0);
    let mut opt = completed[0].wrapping_sub(posted[0]);
    for (i, &p) in posted.iter().enumerate() {
        for (j, &c) in completed.iter().enumerate().skip(i) {
            let t = c.wrapping_sub(p) / (j - i + 1) as u64;
            if t < opt {
                opt = t;
                opt_i = i;
                opt_j = j;
            }
        }
    }
    let ticks_per_sec = 1e9 / clock.ns(1_000_000) * 1_000_000.0;
    let tsize = if duplex { 2 * size } else { size };
    let total = completed[n - 1].wrapping_sub(posted[0]);
    println!(
        "\n{pid}: Bandwidth peak (#{opt_i} to #{opt_j}): {} MB/sec",
        c_g(tsize as f64 * ticks_per_sec / opt.max(1) as f64 / 1048576.0)
    );
    println!(
        "{pid}: Bandwidth average: {} MB/sec",
        c_g(tsize as f64 * n as f64 * ticks_per_sec / total.max(1) as f64 / 1048576.0)
    );
    println!(
        "{pid}: Service Demand peak (#{opt_i} to #{opt_j}): {} cycles/KB",
        opt * 1024 / tsize
    );
    println!(
        "{pid}: Service Demand Avg  : {} cycles/KB",
        total * 1024 / (tsize * n as u64)
    );
}
