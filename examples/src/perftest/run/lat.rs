//! The latency tests (`run_iter_lat*`): one message in flight, each post timed with
//! the time-stamp counter, and their reports.

use super::timing::{Phases, Relax};
use super::{completion_error, AnyResult, Side, STALL};
use crate::perftest::connect::Comm;
use crate::perftest::json;
use crate::perftest::params::{Params, Verb};
use crate::perftest::protocol::KeyData;
use crate::perftest::report::{self, RESULT_LINE};
use rdma_safe::sys;
use rdma_safe::{CompletionQueue, WorkCompletion};
use std::time::Instant;

/// The latency tests after the connection: WRITE and SEND ping-pong on both sides,
/// READ on the client alone (its server waits in the final handshake).
pub(super) fn run(side: &Side, mut comm: Comm, k0: &KeyData) -> AnyResult<()> {
    let p = &side.p;
    match p.verb {
        Verb::Write => {
            print_header(side);
            for size in p.sizes() {
                // perftest's runs ask for the clock's rate too (`get_cpu_mhz`).
                super::timing::warn_cpu_freq(p.args.cpu_freq);
                let posted = lat_write(side, size)?;
                print_lat(side, size, &posted, 2.0)?;
            }
            print_end(p);
            drop(comm);
        }
        Verb::Read if !p.is_client => {
            comm.set_timeout(None);
            comm.close(k0)?;
            print_end(p);
        }
        Verb::Read => {
            print_header(side);
            for size in p.sizes() {
                // perftest's runs ask for the clock's rate too (`get_cpu_mhz`).
                super::timing::warn_cpu_freq(p.args.cpu_freq);
                let posted = lat_read(side, size)?;
                print_lat(side, size, &posted, 1.0)?;
            }
            comm.close(k0)?;
            print_end(p);
        }
        Verb::Send => {
            print_header(side);
            for size in p.sizes() {
                side.post_initial_recvs(size)?;
                comm.handshake(k0)?;
                // perftest's runs ask for the clock's rate too (`get_cpu_mhz`).
                super::timing::warn_cpu_freq(p.args.cpu_freq);
                let posted = lat_send(side, size)?;
                print_lat(side, size, &posted, 2.0)?;
            }
            print_end(p);
            comm.close(k0)?;
        }
    }
    Ok(())
}

/// The line above the results and their header.
fn print_header(side: &Side) {
    if side.p.full() {
        println!("{RESULT_LINE}");
        let header = report::lat_header(side.p.args.duration.is_some());
        println!("{header}{}", super::cpu_header(&side.p));
    }
}

/// The dashed line after the table, unless `--output` asks for figures alone.
fn print_end(p: &Params) {
    if p.full() {
        println!("{RESULT_LINE}");
    }
}

/// Prints one size's row: statistics of the posts' gaps, or with `-D` the window's
/// average.
fn print_lat(side: &Side, size: u64, run: &LatRun, rtt: f64) -> AnyResult<()> {
    let (clock, iters) = (&side.clock, side.p.iters);
    super::timing::warn_cpu_freq(side.p.args.cpu_freq);
    match run {
        LatRun::Posted(posted) => {
            let args = &side.p.args;
            let t0 = posted.first().copied().unwrap_or(0);
            // Post times in cycles with -C, else in nanoseconds; `q` makes a gap
            // the unit's one-way time.
            let (times, q, units): (Vec<f64>, f64, &str) = if args.report_cycles {
                let cycles = posted.iter().map(|&t| t.wrapping_sub(t0) as f64);
                (cycles.collect(), rtt, "cycles")
            } else {
                let ns = posted.iter().map(|&t| clock.ns(t.wrapping_sub(t0)));
                (ns.collect(), 1000.0 * rtt, "usec")
            };
            let s = report::lat_stats_per(&times, q)
                .ok_or("too few iterations for latency statistics")?;
            let (unsorted, histogram) = (args.report_unsorted, args.report_histogram);
            print!(
                "{}",
                report::lat_samples(&times, q, unsorted, histogram, units)
            );
            if (unsorted || histogram) && side.p.full() {
                println!("{RESULT_LINE}");
                println!("{}", report::lat_header(false));
            }
            if let Some(j) = &side.p.json {
                j.write(&json::lat_results(&side.p, size, iters, &s));
            }
            if side.p.full() {
                println!("{}", report::lat_row(size, iters, &s));
            } else {
                println!("{}", report::figure(s.avg));
            }
        }
        LatRun::Sampled(count, ph) => {
            // print_report_lat_duration
            if *count == 0 {
                return Err("no iteration completed in the sampled window".into());
            }
            let secs = ph.window_secs();
            let latency = secs * 1e6 / rtt / *count as f64;
            let tps = *count as f64 / secs;
            if let Some(j) = &side.p.json {
                j.write(&json::lat_dur_results(&side.p, size, *count, latency, tps));
            }
            if side.p.full() {
                let row = report::lat_dur_row(size, *count, latency, tps);
                println!("{row}{}", super::cpu_row(&side.p));
            } else {
                println!("{}", report::figure(latency));
            }
        }
    }
    Ok(())
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

fn poll_one(side: &Side, cq: &CompletionQueue, what: &str) -> AnyResult<()> {
    poll_one_until(side, cq, what, None).map(|_| ())
}

/// Polls for one completion, spinning or (`-e`) sleeping on the channel between
/// polls; `Ok(false)` when `phases` ended first.
fn poll_one_until(
    side: &Side,
    cq: &CompletionQueue,
    what: &str,
    phases: Option<&Phases>,
) -> AnyResult<bool> {
    let clock = &side.clock;
    let mut wc = [WorkCompletion::default(); 1];
    let start = clock.ticks();
    let mut spins = 0u32;
    let mut relax = Relax::latency();
    loop {
        if let Some(wc) = cq.poll(&mut wc)?.first() {
            if !wc.is_ok() {
                return Err(completion_error(wc, what));
            }
            return Ok(true);
        }
        if let Some(ev) = &side.events {
            ev.wait(what)?;
            continue;
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
    let phases = Phases::of(&side.p);
    let timed = phases.is_some();
    let iters = if timed { u64::MAX } else { side.p.iters };
    let base_ptr = side.mr.addr() as *mut u8;
    // Raw on purpose: perftest's own data path (see the module doc of `run`).
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
            let mut relax = Relax::latency();
            // Raw on purpose: perftest's own data path (see the module doc of `run`).
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
            // Raw on purpose: perftest's own data path (see the module doc of `run`).
            // SAFETY: post_buf is inside the region; the previous write that read it
            // has completed (polled below before the next iteration).
            unsafe { std::ptr::write_volatile(post_buf, scnt as u8) };
            // Raw on purpose: perftest's own data path (see the module doc of `run`).
            // SAFETY: the provider copies `wr` and `sge` into the queue; the region
            // they name outlives every request (`Side` drops its queue pairs first, also
            // when a poll fails with the request still posted).
            unsafe { side.qps[0].post_send_raw(&mut wr) }
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
        }
        if ccnt < iters {
            poll_one(side, &side.send_cq, "RDMA WRITE")?;
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
    let phases = Phases::of(&side.p);
    let mut sge = sys::ibv_sge {
        addr: side.send_addr(0),
        length: size as u32,
        lkey: side.mr.lkey(),
    };
    let mut wr = single_wr(side, size, sys::ibv_wr_opcode::IBV_WR_RDMA_READ, &mut sge);
    let clock = side.clock;
    let post = |wr: &mut sys::ibv_send_wr| -> AnyResult<()> {
        // Raw on purpose: perftest's own data path (see the module doc of `run`).
        // SAFETY: the provider copies `wr` and `sge` into the queue; the region
        // they name outlives every request (`Side` drops its queue pairs first, also
        // when a poll fails with the request still posted).
        unsafe { side.qps[0].post_send_raw(wr) }.map_err(|e| format!("Couldn't post send: {e}"))?;
        poll_one(side, &side.send_cq, "RDMA READ")
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
/// reposted and those of the window count; the run's clock starts at the side's first
/// receive (the client's first reply), as perftest's `set_on_first_rx_packet` does.
fn lat_send(side: &Side, size: u64) -> AnyResult<LatRun> {
    let p = &side.p;
    let timed = Phases::wanted(p);
    let mut phases: Option<Phases> = None;
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
            if !poll_one_until(side, &side.recv_cq, "receive", phases.as_ref())? {
                break;
            }
            if timed && phases.is_none() {
                phases = Phases::of(p);
            }
            rcnt += 1;
            if phases.is_some_and(|ph| ph.sampling(Instant::now())) {
                sampled += 1;
            }
            if timed || rcnt + rx_depth <= iters {
                side.post_recv(0, size)?;
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
            // Raw on purpose: perftest's own data path (see the module doc of `run`).
            // SAFETY: the provider copies `wr` and `sge` into the queue; the region
            // they name outlives every request (`Side` drops its queue pairs first, also
            // when a poll fails with the request still posted).
            unsafe { side.qps[0].post_send_raw(&mut wr) }
                .map_err(|e| format!("Couldn't post send: scnt={scnt}: {e}"))?;
            poll_one(side, &side.send_cq, "send")?;
        }
    }
    Ok(match phases {
        Some(ph) => LatRun::Sampled(sampled, ph),
        None => LatRun::Posted(posted),
    })
}
