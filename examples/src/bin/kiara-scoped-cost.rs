//! `kiara-scoped-cost`: what kiara-ib's scoped remote access costs per read message,
//! measured on the device step by step, for `cargo xtask bench`.
//!
//! kiara-ib gives a peer RDMA READ on one message only (docs/kiara-protocol.md,
//! section 5): per read message the sender registers a region over exactly the
//! message's bytes, binds a type 2 window to it, and after the peer's ACK posts a
//! LOCAL_INV and deregisters the region. This program does the same on two
//! connected queue pairs of one device, times each step over many messages, and
//! compares the alternative: the reader invalidating the window with its ACK
//! (SEND_WITH_INV) instead of the sender's LOCAL_INV, which kiara-ib's readers do
//! by default except on Soft-RoCE (`Config::invalidating_acks`).
//!
//! ```text
//! kiara-scoped-cost [-d <dev>] [-g <gid index>] [-s <bytes>] [-n <messages>]
//! ```
//!
//! Output: one line per step, `<step> <median usec> <p90 usec>`, then the totals of
//! both designs, and kiara's when the exact region is reused (a pool buffer keeps it
//! for its next message of the same length). Every 100th message the peer READs the bytes through the window
//! (they must match); after the last one it READs again after the invalidation,
//! which must fail: the steps timed are the ones that work.
//!
//! It posts with the raw API on purpose, unlike the other ports: what it times is
//! kiara-ib's own raw path (memory-window binds, LOCAL_INV, SEND_WITH_INV and a
//! region registered over a pooled buffer's bytes, none of which `LeasedQp` offers),
//! and routing its READs and ACKs through the safe layer would add bookkeeping kiara
//! does not do to the steps being measured. Each `unsafe` block says so.

use clap::Parser;
use rdma_safe::qp::{Init, Rts};
use rdma_safe::sys::ibv_wc_status;
use rdma_safe::{
    Access, CompletionQueue, InitAttr, MemoryRegion, MemoryWindow, MwType, ProtectionDomain,
    QpConfig, QueuePair, RecvWr, RemoteEndpoint, RemoteSlice, RtrAttr, RtsAttr, SendWr,
    WorkCompletion,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "kiara-scoped-cost",
    about = "per-message cost of kiara-ib's scoped remote access"
)]
struct Args {
    /// RDMA device (default: RDMA_DEVICE, else the first device)
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// GID index (default: RDMA_GID_INDEX, else the first RoCE v2 IPv4 GID)
    #[arg(short = 'g', long = "gid-idx")]
    gid_index: Option<u32>,
    /// message size in bytes
    #[arg(short = 's', long = "size", default_value_t = 65536)]
    size: usize,
    /// messages
    #[arg(short = 'n', long = "iters", default_value_t = 2000)]
    iters: usize,
}

/// Errors of this program: a verb's, or a check that failed.
type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args = Args::parse();
    if let Err(err) = run(&args) {
        eprintln!("kiara-scoped-cost: {err}");
        std::process::exit(1);
    }
}

/// The two sides: `sender` owns the message (kiara's sender), `reader` READs it.
struct Pair {
    pd: Arc<ProtectionDomain>,
    cq: Arc<CompletionQueue>,
    sender: QueuePair<Rts>,
    reader: QueuePair<Rts>,
}

/// Times of one message's steps, in microseconds.
#[derive(Default)]
struct Steps {
    register: Vec<f64>,
    bind: Vec<f64>,
    local_inv: Vec<f64>,
    deregister: Vec<f64>,
    ack_send: Vec<f64>,
    ack_send_with_inv: Vec<f64>,
}

fn run(args: &Args) -> AnyResult<()> {
    let pair = connect(args)?;
    let len = args.size.max(1);
    // A pool buffer as kiara registers it: local access, windows capped to READ.
    let mut pooled = MemoryRegion::new(&pair.pd, len, Access::LOCAL_WRITE | Access::MW_BIND)?;
    pooled.set_window_rights(Access::REMOTE_READ);
    pooled.write_at(0, &pattern(len))?;
    let mut landing = MemoryRegion::new(&pair.pd, len + 64, Access::LOCAL_WRITE)?;
    let mut window = MemoryWindow::new(&pair.pd, MwType::Type2)?;
    let result = measure(args, &pair, &pooled, &mut window, &mut landing);
    // The window, then the queue pairs, go before the regions: after a step that
    // failed, a receive into `landing` or a READ into it may still be posted.
    drop(window);
    drop(pair);
    result
}

/// Runs `args.iters` messages and reports their steps' times; the regions outlive
/// the queue pairs (see `run`).
fn measure(
    args: &Args,
    pair: &Pair,
    pooled: &MemoryRegion,
    window: &mut MemoryWindow,
    landing: &mut MemoryRegion,
) -> AnyResult<()> {
    let len = args.size.max(1);
    let mut steps = Steps::default();
    for i in 0..args.iters {
        let check = i % 100 == 0;
        message(pair, pooled, window, landing, check, &mut steps)?;
        let first_plain = i % 2 == 0;
        ack_alternatives(pair, pooled, window, landing, first_plain, &mut steps)?;
    }
    verify_invalidation(pair, pooled, window, landing)?;
    report(len, args.iters, &steps);
    Ok(())
}

/// A READ through an invalidated window fails with a remote access error (and puts
/// the reader's queue pair in error: hence only once, at the end).
fn verify_invalidation(
    pair: &Pair,
    pooled: &MemoryRegion,
    window: &mut MemoryWindow,
    landing: &mut MemoryRegion,
) -> AnyResult<()> {
    let view = Arc::new(exact_view(&pair.pd, pooled)?);
    let rkey = bind(pair, window, &view)?;
    let remote = RemoteSlice {
        addr: view.remote(0..view.len())?.addr,
        len: view.len() as u64,
        rkey,
    };
    expect_read(pair, landing, remote, ibv_wc_status::IBV_WC_SUCCESS)?;
    let mut inv = SendWr::local_invalidate(3, rkey).signaled();
    // Raw on purpose (kiara's step, timed). SAFETY: a LOCAL_INV names no local buffer.
    unsafe { pair.sender.post_send(&mut inv)? };
    wait(&pair.cq, 1)?;
    expect_read(pair, landing, remote, ibv_wc_status::IBV_WC_REM_ACCESS_ERR)
}

/// One read message, kiara's way: exact region, bind, (the peer's READ), LOCAL_INV,
/// deregistration.
fn message(
    pair: &Pair,
    pooled: &MemoryRegion,
    window: &mut MemoryWindow,
    landing: &mut MemoryRegion,
    check: bool,
    steps: &mut Steps,
) -> AnyResult<()> {
    let t = Instant::now();
    let view = Arc::new(exact_view(&pair.pd, pooled)?);
    steps.register.push(micros(t));
    let t = Instant::now();
    let rkey = bind(pair, window, &view)?;
    steps.bind.push(micros(t));
    let remote = RemoteSlice {
        addr: view.remote(0..view.len())?.addr,
        len: view.len() as u64,
        rkey,
    };
    if check {
        expect_read(pair, landing, remote, ibv_wc_status::IBV_WC_SUCCESS)?;
        if landing.to_vec()[..view.len()] != pattern(view.len())[..] {
            return Err("the READ through the window returned other bytes".into());
        }
    }
    let t = Instant::now();
    let mut inv = SendWr::local_invalidate(3, rkey).signaled();
    // Raw on purpose (kiara's step, timed). SAFETY: a LOCAL_INV names no local buffer.
    unsafe { pair.sender.post_send(&mut inv)? };
    wait(&pair.cq, 1)?;
    steps.local_inv.push(micros(t));
    drop(view);
    let t = Instant::now();
    // Raw on purpose (kiara's step, timed). SAFETY: the window's invalidation
    // completed (waited for above).
    drop(unsafe { window.release_region() });
    steps.deregister.push(micros(t));
    Ok(())
}

/// The ACK both ways: a plain SEND (kiara: the sender then posts its LOCAL_INV) and
/// a SEND_WITH_INV that invalidates the window at the sender (the alternative), in
/// turns first (the first of two back-to-back round trips tends to be slower).
fn ack_alternatives(
    pair: &Pair,
    pooled: &MemoryRegion,
    window: &mut MemoryWindow,
    landing: &mut MemoryRegion,
    first_plain: bool,
    steps: &mut Steps,
) -> AnyResult<()> {
    let view = Arc::new(exact_view(&pair.pd, pooled)?);
    let rkey = bind(pair, window, &view)?;
    let order = if first_plain {
        [None, Some(rkey)]
    } else {
        [Some(rkey), None]
    };
    for invalidate in order {
        post_ack_receive(pair, landing)?;
        let ack = pooled.local(0..16)?;
        let mut sges = [ack];
        let wr = match invalidate {
            Some(rkey) => SendWr::send_with_invalidate(4, &mut sges, rkey),
            None => SendWr::send(4, &mut sges),
        };
        let t = Instant::now();
        // Raw on purpose (the ACK's round trip is timed; SEND_WITH_INV is not in the safe
        // layer). SAFETY: the ACK's bytes are in `pooled`, which outlives the
        // completions waited for next.
        unsafe { pair.reader.post_send(&mut wr.signaled())? };
        wait(&pair.cq, 2)?;
        let spent = micros(t);
        match invalidate {
            Some(_) => steps.ack_send_with_inv.push(spent),
            None => steps.ack_send.push(spent),
        }
    }
    // Raw on purpose (kiara's step). SAFETY: the window was invalidated by the
    // SEND_WITH_INV just completed.
    drop(unsafe { window.release_region() });
    Ok(())
}

/// A region over exactly the message's bytes, as kiara's `exact_view`.
fn exact_view(pd: &Arc<ProtectionDomain>, pooled: &MemoryRegion) -> AnyResult<MemoryRegion> {
    let at = pooled.remote(0..pooled.len())?.addr as *mut u8;
    // Raw on purpose (kiara's exact view, timed). SAFETY: the bytes are `pooled`'s,
    // which outlives every view (views are released before the next message) and
    // is not written meanwhile.
    let mut view = unsafe { MemoryRegion::register_raw(pd, at, pooled.len(), Access::MW_BIND) }?;
    view.set_window_rights(Access::REMOTE_READ);
    Ok(view)
}

/// Binds `window` to all of `view` for READ, waits for the bind; returns the key.
fn bind(pair: &Pair, window: &mut MemoryWindow, view: &Arc<MemoryRegion>) -> AnyResult<u32> {
    let (wr, rkey) = SendWr::bind_mw(1, window, view, 0..view.len(), Access::REMOTE_READ)?;
    // Raw on purpose (kiara's bind, timed). SAFETY: a bind names no local buffer;
    // the window keeps the view alive.
    unsafe { pair.sender.post_send(&mut wr.signaled())? };
    wait(&pair.cq, 1)?;
    Ok(rkey)
}

/// The reader READs `remote` into `landing`; the completion must have `expect`.
fn expect_read(
    pair: &Pair,
    landing: &mut MemoryRegion,
    remote: RemoteSlice,
    expect: ibv_wc_status,
) -> AnyResult<()> {
    landing.write_at(0, &vec![0; remote.len as usize])?;
    let mut sges = [landing.local(0..remote.len as usize)?];
    let mut wr = SendWr::rdma_read(2, &mut sges, remote).signaled();
    // Raw on purpose (the peer's READ as kiara posts it). SAFETY: `landing` outlives
    // the completion waited for below.
    unsafe { pair.reader.post_send(&mut wr)? };
    let status = wait_status(&pair.cq)?;
    if status != expect {
        return Err(format!("a READ through the window: {status:?}, expected {expect:?}").into());
    }
    Ok(())
}

/// Posts the sender's receive for one ACK (into the end of `landing`).
fn post_ack_receive(pair: &Pair, landing: &MemoryRegion) -> AnyResult<()> {
    let mut sges = [landing.local(landing.len() - 64..landing.len())?];
    let mut wr = RecvWr::new(5, &mut sges);
    // Raw on purpose (on the sender, which binds raw). SAFETY: `landing` outlives the
    // receive's completion, waited for by the caller.
    unsafe { pair.sender.post_recv(&mut wr)? };
    Ok(())
}

/// Waits for `n` successful completions.
fn wait(cq: &CompletionQueue, n: usize) -> AnyResult<()> {
    for _ in 0..n {
        let status = wait_status(cq)?;
        if status != ibv_wc_status::IBV_WC_SUCCESS {
            return Err(format!("a work request failed: {status:?}").into());
        }
    }
    Ok(())
}

/// Waits for one completion (spinning, as kiara's waiters do) and returns its status.
fn wait_status(cq: &CompletionQueue) -> AnyResult<ibv_wc_status> {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut wcs = [WorkCompletion::default(); 1];
    loop {
        if let Some(wc) = cq.poll(&mut wcs)?.first() {
            return Ok(wc.status());
        }
        if Instant::now() > deadline {
            return Err("no completion within 10 s".into());
        }
    }
}

/// Connects two RC queue pairs of one device to each other.
fn connect(args: &Args) -> AnyResult<Pair> {
    let sel = rdma_safe::Selection::from_env(args.ib_dev.clone(), 1, args.gid_index).open()?;
    let (gid_index, gid) = sel
        .gid
        .ok_or("the port has no GID to use (InfiniBand: pass -x)")?;
    let (ctx, port) = (sel.ctx, sel.port);
    let pd = ProtectionDomain::new(&ctx)?;
    let cq = CompletionQueue::new(&ctx, 64)?;
    let config = QpConfig::rc(&cq);
    let a = QueuePair::new(&pd, &config)?.to_init(&InitAttr::default())?;
    let b = QueuePair::new(&pd, &config)?.to_init(&InitAttr::default())?;
    let endpoint = |qp: &QueuePair<Init>, psn| RemoteEndpoint {
        qpn: qp.qp_num(),
        psn,
        lid: port.lid(),
        gid: Some(gid),
    };
    let (ea, eb) = (endpoint(&a, 0x1000), endpoint(&b, 0x2000));
    let rts = |qp: QueuePair<Init>, peer: RemoteEndpoint, own| -> AnyResult<QueuePair<Rts>> {
        let mut rtr = RtrAttr::new(peer, port.active_mtu());
        rtr.sgid_index = gid_index as u8;
        rtr.max_dest_rd_atomic = 1;
        let mut rts = RtsAttr::new(own);
        rts.max_rd_atomic = 1;
        Ok(qp.to_rtr(&rtr)?.to_rts(&rts)?)
    };
    Ok(Pair {
        sender: rts(a, eb, ea.psn)?,
        reader: rts(b, ea, eb.psn)?,
        pd,
        cq,
    })
}

/// The message's bytes: a pattern the READ must bring back.
fn pattern(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i.wrapping_mul(7) ^ (i >> 8)) as u8)
        .collect()
}

/// Microseconds since `t`.
fn micros(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e6
}

/// The `q` quantile (0..=1) of `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(((v.len().saturating_sub(1)) as f64 * q).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// Prints the per-step medians and the totals of both designs.
fn report(len: usize, iters: usize, s: &Steps) {
    println!("scoped access per read message: {len} bytes, {iters} messages");
    println!("{:<28} {:>12} {:>12}", "step", "median us", "p90 us");
    let rows = [
        ("register exact region", &s.register),
        ("bind window", &s.bind),
        ("local invalidate", &s.local_inv),
        ("deregister", &s.deregister),
        ("ack as SEND", &s.ack_send),
        ("ack as SEND_WITH_INV", &s.ack_send_with_inv),
    ];
    for (name, v) in rows {
        println!(
            "{name:<28} {:>12.2} {:>12.2}",
            quantile(v, 0.5),
            quantile(v, 0.9)
        );
    }
    let m = |v: &Vec<f64>| quantile(v, 0.5);
    let common = m(&s.register) + m(&s.bind) + m(&s.deregister);
    let local = common + m(&s.local_inv);
    let remote = common + (m(&s.ack_send_with_inv) - m(&s.ack_send)).max(0.0);
    println!("{:<28} {local:>12.2}", "total LOCAL_INV (kiara)");
    // kiara keeps a pool buffer's exact region for its next message of the same
    // length: a steady stream of one size pays only the bind and the invalidation.
    let reused = m(&s.bind) + m(&s.local_inv);
    println!("{:<28} {reused:>12.2}", "total region reused");
    println!("{:<28} {remote:>12.2}", "total SEND_WITH_INV");
}
