//! `rdma_loopback`: two RC queue pairs on one device, connected to each other, move
//! bytes with SEND, RDMA WRITE and RDMA READ; every transfer is verified byte for byte
//! and timed.
//!
//! ```text
//! rdma_loopback [-d <dev>] [-i <port>] [-g <gid index>] [-s <bytes>] [-n <iterations>]
//! ```

use clap::Parser;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys;
use rdma_safe::{
    Access, CompletionQueue, InitAttr, Lease, LeasedQp, MemoryRegion, ProtectionDomain, QpConfig,
    QueuePair, RemoteEndpoint, Result, RtrAttr, RtsAttr, SendOp, WorkCompletion,
};
use std::time::{Duration, Instant};

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "rdma_loopback",
    about = "verified SEND / RDMA WRITE / RDMA READ between two local QPs"
)]
struct Args {
    /// RDMA device (default: RDMA_DEVICE, else the first device)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// port of the device
    #[arg(short = 'i', long = "ib-port", default_value_t = 1)]
    ib_port: u8,
    /// GID index (default: RDMA_GID_INDEX, else the first RoCE v2 IPv4 GID, else 0)
    #[arg(short = 'g', long = "gid-idx")]
    gid_index: Option<u32>,
    /// message size in bytes
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// iterations per operation
    #[arg(short = 'n', long = "iters", default_value_t = 200)]
    iters: u32,
}

fn main() {
    let args = Args::parse();
    if let Err(err) = run(&args) {
        eprintln!("rdma_loopback: {err}");
        std::process::exit(1);
    }
}

/// One side: a QP and a registered buffer twice the message size, which is lent to
/// the queue pair while a transfer may use it.
struct Side {
    conn: LeasedQp,
    mr: Option<MemoryRegion>,
}

impl Side {
    fn new(qp: QueuePair<Rts>, mr: MemoryRegion) -> AnyResult<Side> {
        let conn = LeasedQp::new(qp).map_err(|e| e.error)?;
        Ok(Side { conn, mr: Some(mr) })
    }

    /// The buffer, between transfers.
    fn region(&self) -> &MemoryRegion {
        self.mr
            .as_ref()
            .expect("every transfer gives the buffer back")
    }

    fn region_mut(&mut self) -> &mut MemoryRegion {
        self.mr
            .as_mut()
            .expect("every transfer gives the buffer back")
    }

    /// The buffer, to lend it to a request.
    fn lend(&mut self) -> MemoryRegion {
        self.mr
            .take()
            .expect("every transfer gives the buffer back")
    }
}

/// Errors of this program: a verb's, or a check that failed.
type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn run(args: &Args) -> AnyResult<()> {
    let sel =
        rdma_safe::Selection::from_env(args.ib_dev.clone(), args.ib_port, args.gid_index).open()?;
    // On InfiniBand without -x: GID 0 (the queue pairs still address by LID).
    let (gid_index, gid) = match sel.gid {
        Some(pair) => pair,
        None => (0, sel.ctx.query_gid(args.ib_port, 0)?),
    };
    let (ctx, port) = (sel.ctx, sel.port);
    println!(
        "device {} port {} ({}), GID[{gid_index}] {gid}, active MTU {:?}",
        ctx.name(),
        args.ib_port,
        if port.is_ethernet() {
            "RoCE"
        } else {
            "InfiniBand"
        },
        port.active_mtu()
    );
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::new(&ctx, 256)?;
    let (a, b) = connected_pair(args, &pd, &cq, &port, (gid_index, gid))?;
    println!("QP {:#x} <-> QP {:#x}: RTS", a.qp_num(), b.qp_num());

    let len = args.size.max(1);
    let mut a = Side::new(a, MemoryRegion::new(&pd, 2 * len, Access::ALL_REMOTE)?)?;
    let mut b = Side::new(b, MemoryRegion::new(&pd, 2 * len, Access::ALL_REMOTE)?)?;
    for (name, opcode) in [
        ("SEND", sys::ibv_wr_opcode::IBV_WR_SEND),
        ("RDMA_WRITE", sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE),
        ("RDMA_READ", sys::ibv_wr_opcode::IBV_WR_RDMA_READ),
    ] {
        let started = Instant::now();
        for iter in 0..args.iters {
            verified_transfer(&mut a, &mut b, opcode, len, iter, &cq)
                .map_err(|e| format!("{name} iteration {iter}: {e}"))?;
        }
        let secs = started.elapsed().as_secs_f64();
        let bytes = len as f64 * args.iters as f64;
        println!(
            "{name:<10} {len:>8} bytes x {:>5}: verified, {:>8.2} MB/s, {:>8.1} us per transfer",
            args.iters,
            bytes / secs / 1e6,
            secs * 1e6 / args.iters as f64
        );
    }
    println!("all transfers verified");
    Ok(())
}

/// Two RC queue pairs on `port`, connected to each other and ready to send.
fn connected_pair(
    args: &Args,
    pd: &std::sync::Arc<ProtectionDomain>,
    cq: &std::sync::Arc<CompletionQueue>,
    port: &rdma_safe::PortAttr,
    (gid_index, gid): (u32, rdma_safe::Gid),
) -> AnyResult<(QueuePair<Rts>, QueuePair<Rts>)> {
    let config = QpConfig::rc(cq);
    let init = InitAttr {
        port: args.ib_port,
        ..Default::default()
    };
    let a = QueuePair::new(pd, &config)?.to_init(&init)?;
    let b = QueuePair::new(pd, &config)?.to_init(&init)?;
    let endpoint = |qp: &QueuePair<Init>, psn| RemoteEndpoint {
        qpn: qp.qp_num(),
        psn,
        lid: port.lid(),
        gid: Some(gid),
    };
    let (ea, eb) = (endpoint(&a, 0x1000), endpoint(&b, 0x2000));
    let connect = |qp: QueuePair<Init>, peer: RemoteEndpoint, own_psn| -> Result<QueuePair<Rts>> {
        let mut rtr = RtrAttr::new(peer, port.active_mtu());
        rtr.port = args.ib_port;
        rtr.sgid_index = gid_index as u8;
        Ok(qp.to_rtr(&rtr)?.to_rts(&RtsAttr::new(own_psn))?)
    };
    Ok((connect(a, eb, ea.psn)?, connect(b, ea, eb.psn)?))
}

/// One `opcode` transfer of `len` bytes from `a` to `b` (from `b` into `a` for a
/// READ), with fresh bytes for iteration `iter`, checked byte for byte.
fn verified_transfer(
    a: &mut Side,
    b: &mut Side,
    opcode: sys::ibv_wr_opcode,
    len: usize,
    iter: u32,
    cq: &CompletionQueue,
) -> AnyResult<()> {
    let mut wcs = [WorkCompletion::default(); 16];
    let read = opcode == sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
    // Fresh data each round, so that a stale buffer cannot pass the check.
    let seed = iter as usize * 31 + opcode.0 as usize;
    let (src, dst) = if read {
        (&mut *b, &mut *a)
    } else {
        (&mut *a, &mut *b)
    };
    // Both regions are remotely writable: volatile copies, never slices.
    let mut data = vec![0; len];
    fill(&mut data, seed);
    src.region_mut().write_at(0, &data)?;
    dst.region_mut().write_at(len, &vec![0; len])?;
    transfer(a, b, opcode, len, cq, &mut wcs)?;
    let (src, dst) = if read { (&*b, &*a) } else { (&*a, &*b) };
    let (sent, got) = (src.region().to_vec(), dst.region().to_vec());
    if sent[..len] != got[len..] {
        return Err("data differs".into());
    }
    Ok(())
}

fn fill(buf: &mut [u8], seed: usize) {
    for (i, byte) in buf.iter_mut().enumerate() {
        *byte = (i.wrapping_mul(7) ^ seed) as u8;
    }
}

/// Moves `len` bytes from the first half of the source's buffer into the second half of
/// the destination's, and waits for the completions, which give the buffers back.
fn transfer(
    a: &mut Side,
    b: &mut Side,
    opcode: sys::ibv_wr_opcode,
    len: usize,
    cq: &CompletionQueue,
    wcs: &mut [WorkCompletion],
) -> AnyResult<()> {
    let mut expected = 1;
    // A is the initiator: it sends/writes its first half, or reads B's first half.
    let (op, range) = match opcode {
        sys::ibv_wr_opcode::IBV_WR_SEND => {
            let region = b.lend();
            b.conn
                .post_recv(2, region, len..2 * len)
                .map_err(|e| e.error)?;
            expected = 2;
            (SendOp::Send, 0..len)
        }
        sys::ibv_wr_opcode::IBV_WR_RDMA_READ => {
            (SendOp::Read(b.region().remote(0..len)?), len..2 * len)
        }
        _ => (SendOp::Write(b.region().remote(len..2 * len)?), 0..len),
    };
    let lease = Lease::Owned(a.lend());
    a.conn
        .post_send(1, op, lease, range, true)
        .map_err(|e| e.error)?;

    let deadline = Instant::now() + Duration::from_secs(10);
    let mut seen = 0;
    while seen < expected {
        for wc in cq.poll_completions(wcs)? {
            wc.result()?;
            let side = if wc.qp_num() == a.conn.qp().qp_num() {
                &mut *a
            } else {
                &mut *b
            };
            for (_, lease) in side.conn.complete(wc)? {
                if let Lease::Owned(mr) = lease {
                    side.mr = Some(mr);
                }
            }
            seen += 1;
        }
        if Instant::now() > deadline {
            return Err("timed out waiting for completions".into());
        }
    }
    Ok(())
}
