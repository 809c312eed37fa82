//! `ibv_rc_pingpong`: the rdma-core example, ported. Two processes connect RC queue
//! pairs through a TCP exchange of LID/QPN/PSN/GID (52 bytes each way, the C format)
//! and bounce a SEND back and forth `-n` times; both print the C program's lines.
//!
//! ```text
//! ibv_rc_pingpong [-p port] [-d dev] [-i ib-port] [-s size] [-m mtu] [-r rx-depth]
//!                 [-n iters] [-l sl] [-e] [-g gid-idx] [-o] [-c] [-t] [-j] [host]
//! ```
//! `-t` reads the device's completion timestamps (an extended CQ) and prints the
//! receive-to-receive clock cycles as the C program; `-j` (device memory) checks the
//! device's `max_dm_size` as the C program and stops there: a device without device
//! memory (rxe) gets C's message and the figure, one with it is told that this port
//! does not place the buffer in device memory.
//! It interoperates with the C `ibv_rc_pingpong` both ways (on RoCE both need `-g`).

use clap::Parser;
use examples::pingpong::{mtu_to_enum, Dest, MSG_SIZE};
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys;
use rdma_safe::{
    Access, CompletionChannel, CompletionQueue, Context, Gid, InitAttr, MemoryRegion,
    ProtectionDomain, QpConfig, QueuePair, RemoteEndpoint, RtrAttr, RtsAttr, WcFlags,
    WorkCompletion,
};
use std::io::{Read, Write};
use std::net::{Ipv6Addr, TcpListener};
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
    /// validate received buffer
    #[arg(short = 'c', long = "chk")]
    chk: bool,
    /// get CQE with timestamp
    #[arg(short = 't', long = "ts")]
    ts: bool,
    /// use device memory
    #[arg(short = 'j', long = "dm")]
    dm: bool,
    /// server to connect to (none: be the server)
    servername: Option<String>,
}

const RECV_WRID: u64 = 1;
const SEND_WRID: u64 = 2;

/// Errors of this program.
type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = Args::parse();
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
    let mtu = mtu_to_enum(args.mtu).ok_or("invalid MTU (256, 512, 1024, 2048 or 4096)")?;
    if args.size == 0 {
        return Err("size must be at least 1".into());
    }
    if args.rx_depth < 2 {
        return Err("rx-depth must be at least 2".into());
    }
    if args.odp && args.dm {
        return Err("DM memory region can't be on demand".into());
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as usize;

    let ctx = Context::open(args.ib_dev.as_deref())?;
    let pd = ProtectionDomain::new(&ctx)?;
    if args.ts || args.dm {
        // pp_init_ctx: the extended device query decides, before any resource.
        let attr = ctx.query_device()?;
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
    }
    let mut access = Access::LOCAL_WRITE;
    if args.odp {
        access = Access::from_bits(access.bits() | Access::ON_DEMAND.bits());
    }
    let mut mr = MemoryRegion::new(&pd, args.size, access)?;
    // The C program fills the buffer with 0x7b.
    mr.as_mut_slice()?.fill(0x7b);

    let channel = if args.events {
        Some(CompletionChannel::new(&ctx)?)
    } else {
        None
    };
    let cq = match &channel {
        _ if args.ts => CompletionQueue::new_ex(
            &ctx,
            args.rx_depth + 1,
            channel.as_ref(),
            WcFlags::COMPLETION_TIMESTAMP,
        )?,
        Some(ch) => CompletionQueue::with_channel(&ctx, args.rx_depth + 1, ch, 0)?,
        None => CompletionQueue::new(&ctx, args.rx_depth + 1)?,
    };
    let ts_mask = if args.ts {
        ctx.query_device()?.completion_timestamp_mask()
    } else {
        0
    };
    let mut config = QpConfig::rc(&cq);
    config.max_send_wr = 1;
    config.max_recv_wr = args.rx_depth;
    let qp = QueuePair::new(&pd, &config)?;
    let inline = qp.caps().max_inline_data as usize >= args.size;
    let qp = qp.to_init(&InitAttr {
        port: args.ib_port,
        pkey_index: 0,
        access: Access::NONE,
        qkey: 0,
    })?;

    let mut routs = post_recv(&qp, &mr, args.size, args.rx_depth)?;
    if routs < args.rx_depth {
        return Err(format!("Couldn't post receive ({routs})").into());
    }
    if let Some(ch) = &channel {
        let _ = ch;
        cq.req_notify(false)?;
    }

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
        qpn: qp.qp_num(),
        psn: rdma_safe::random_psn(),
        gid: gid.0,
    };
    print_dest("local address: ", &me);

    let connect = |qp: QueuePair<Init>, rem: &Dest| -> AnyResult<QueuePair<Rts>> {
        let remote_gid = Gid(rem.gid);
        let grh = !remote_gid.interface_id_is_zero();
        let mut rtr = RtrAttr::new(
            RemoteEndpoint {
                qpn: rem.qpn,
                psn: rem.psn,
                lid: rem.lid,
                gid: grh.then_some(remote_gid),
            },
            rdma_safe::Mtu::from_code(mtu)
                .unwrap_or(rdma_safe::Mtu::B4096)
                .into(),
        );
        rtr.port = args.ib_port;
        rtr.sl = args.sl;
        rtr.hop_limit = 1;
        rtr.sgid_index = args.gid_idx.unwrap_or(0) as u8;
        rtr.max_dest_rd_atomic = 1;
        rtr.min_rnr_timer = 12;
        let qp = qp
            .to_rtr(&rtr)
            .map_err(|e| format!("Failed to modify QP to RTR: {}", e.error))?;
        let rts = RtsAttr::new(me.psn);
        let qp = qp
            .to_rts(&rts)
            .map_err(|e| format!("Failed to modify QP to RTS: {}", e.error))?;
        Ok(qp)
    };

    let (qp, rem) = match &args.servername {
        Some(host) => {
            let rem = client_exchange(host, args.port, &me)?;
            let qp = connect(qp, &rem)?;
            (qp, rem)
        }
        None => {
            let listener = TcpListener::bind(("0.0.0.0", args.port))
                .map_err(|e| format!("Couldn't listen to port {}: {e}", args.port))?;
            let (mut sock, _) = listener.accept()?;
            let mut msg = [0u8; MSG_SIZE];
            sock.read_exact(&mut msg)
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            let rem = Dest::decode(&msg)?;
            let qp = connect(qp, &rem)?;
            sock.write_all(&me.encode())
                .map_err(|e| format!("Couldn't send local address: {e}"))?;
            let mut done = [0u8; 5];
            sock.read_exact(&mut done)
                .map_err(|e| format!("Couldn't read remote address: {e}"))?;
            (qp, rem)
        }
    };
    print_dest("remote address:", &rem);

    let is_client = args.servername.is_some();
    let start = Instant::now();
    let mut pending = RECV_WRID;
    let (mut scnt, mut rcnt) = (0u32, 0u32);
    if is_client {
        if args.chk {
            mark(&mut mr, args.size, page)?;
        }
        post_send(&qp, &mr, args.size, inline)?;
        pending |= SEND_WRID;
    }
    let mut wcs = [WorkCompletion::default(); 2];
    let mut ts = TsParams::default();
    // Pure busy polling, as C does: every completion is produced inside the peer's
    // post (rxe runs it in process context), so yielding only adds latency (measured
    // in the guest: 3-6% slower round trips with a yield every 128 empty polls).
    while rcnt < args.iters || scnt < args.iters {
        if args.events {
            if !cq.wait(Some(Duration::from_secs(60)))? {
                return Err("no completion event within 60 s".into());
            }
            cq.req_notify(false)?;
        }
        // (wr_id, status, completion timestamp) of up to two completions.
        let mut got = [(0u64, sys::ibv_wc_status::IBV_WC_SUCCESS, 0u64); 2];
        let n = if args.ts {
            let mut n = 0;
            cq.poll_ex(2, |wc| {
                got[n] = (wc.wr_id(), wc.status(), wc.completion_ts().unwrap_or(0));
                n += 1;
            })?;
            n
        } else {
            let polled = cq.poll(&mut wcs)?;
            for (g, wc) in got.iter_mut().zip(polled.iter()) {
                *g = (wc.wr_id(), wc.status(), 0);
            }
            polled.len()
        };
        if n == 0 {
            std::hint::spin_loop();
        }
        for &(wr_id, status, stamp) in &got[..n] {
            if status != sys::ibv_wc_status::IBV_WC_SUCCESS {
                return Err(format!(
                    "Failed status {} ({}) for wr_id {}",
                    rdma_safe::cq::status_text(status),
                    status.0,
                    wr_id
                )
                .into());
            }
            if wr_id == RECV_WRID && args.ts {
                ts.record(stamp, ts_mask);
            }
            match wr_id {
                SEND_WRID => scnt += 1,
                RECV_WRID => {
                    routs -= 1;
                    if routs <= 1 {
                        routs += post_recv(&qp, &mr, args.size, args.rx_depth - routs)?;
                        if routs < args.rx_depth {
                            return Err(format!("Couldn't post receive ({routs})").into());
                        }
                    }
                    rcnt += 1;
                }
                other => return Err(format!("Completion for unknown wr_id {other}").into()),
            }
            pending &= !wr_id;
            if scnt < args.iters && pending == 0 {
                post_send(&qp, &mr, args.size, inline)?;
                pending = RECV_WRID | SEND_WRID;
            }
        }
    }
    let usec = start.elapsed().as_secs_f64() * 1e6;
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
    if !is_client && args.chk {
        check(&mr, args.size, page)?;
    }
    drop(qp);
    Ok(())
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

/// With `-c`, the client marks the first byte of every page before its first send.
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

/// Posts `n` receives of the whole buffer; returns how many were posted.
fn post_recv<S: rdma_safe::qp::CanRecv>(
    qp: &QueuePair<S>,
    mr: &MemoryRegion,
    size: usize,
    n: u32,
) -> AnyResult<u32> {
    let mut sge = mr.local(0..size)?.to_sge();
    for i in 0..n {
        let mut wr = sys::ibv_recv_wr {
            wr_id: RECV_WRID,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        // SAFETY: `wr` and `sge` live across the call; the region outlives the QP's use
        // of it (the QP is dropped before the region at the end of `run`).
        if unsafe { qp.post_recv_raw(&mut wr) }.is_err() {
            return Ok(i);
        }
    }
    Ok(n)
}

fn post_send(qp: &QueuePair<Rts>, mr: &MemoryRegion, size: usize, inline: bool) -> AnyResult<()> {
    let mut sge = mr.local(0..size)?.to_sge();
    let mut flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
    if inline {
        flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
    }
    let mut wr = sys::ibv_send_wr {
        wr_id: SEND_WRID,
        sg_list: &mut sge,
        num_sge: 1,
        opcode: sys::ibv_wr_opcode::IBV_WR_SEND,
        send_flags: flags,
        ..Default::default()
    };
    // SAFETY: `wr` and `sge` live across the call; the buffer stays registered until
    // the QP is dropped, and the next send is posted only after this one completed.
    unsafe { qp.post_send_raw(&mut wr) }.map_err(|e| format!("Couldn't post send: {e}"))?;
    Ok(())
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
