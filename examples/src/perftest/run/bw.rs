//! The bandwidth tests (`run_iter_bw*`): many requests in flight, completions
//! moderated, and their reports; `endless` runs them without an end.

mod endless;

use super::timing::{Clock, Phases, Relax};
use super::{completion_error, cpu_header, cpu_row, AnyResult, Side, STALL};
use crate::perftest::connect::{Comm, SETUP_TIMEOUT};
use crate::perftest::json;
use crate::perftest::params::{Output, Params, Verb};
use crate::perftest::protocol::{BwReport, KeyData};
use crate::perftest::report::{self, RESULT_LINE};
use rdma_safe::sys;
use rdma_safe::WorkCompletion;
use std::time::Instant;

/// The bandwidth tests after the connection.
pub(super) fn run(side: &Side, comm: Comm, k0: &KeyData) -> AnyResult<()> {
    if side.p.full() {
        println!("{RESULT_LINE}");
        println!(
            "{}{}",
            report::bw_header(side.p.args.report_gbits),
            cpu_header(&side.p)
        );
    }
    if let Some(every) = side.p.endless_every() {
        return endless::run(side, comm, k0, every);
    }
    match (side.p.verb, side.p.is_client, side.p.duplex) {
        (Verb::Send, _, _) => send_bw(side, comm, k0),
        (_, _, true) => rdma_bw_duplex(side, comm, k0),
        (_, true, false) => rdma_bw_client(side, comm, k0),
        (_, false, false) => rdma_bw_server(comm, k0, &side.p),
    }
}

/// Prints one size's result: its row (with `-b`, both sides' figures summed), or
/// the one figure `--output` asks for.
fn print_result(p: &Params, mine: &BwReport, rem: Option<&BwReport>) {
    let gbits = p.args.report_gbits;
    let sum = rem.map_or(*mine, |r| report::bw_sum(mine, r));
    write_json(p, mine, &sum);
    let line = match (p.output, rem) {
        (Output::Bandwidth, _) => report::figure(sum.bw_avg),
        (Output::MessageRate, _) => report::figure(sum.msg_rate),
        (_, Some(r)) => report::bw_duplex_row(mine, r, gbits),
        (_, None) => report::bw_row(mine, gbits),
    };
    println!("{line}{}", cpu_row(p));
}

/// `--report-both` after a bidirectional run of one size (not with `-a`): this
/// side's figures and the peer's, each under its own header, as C prints them
/// (whatever `--output` says).
fn print_both(p: &Params, mine: &BwReport, rem: &BwReport) {
    if !(p.args.report_both && p.duplex && !p.args.all) {
        return;
    }
    let gbits = p.args.report_gbits;
    for (title, rep) in [("Local", mine), ("Remote", rem)] {
        println!("{RESULT_LINE}");
        println!("\n {title} results: ");
        println!("{RESULT_LINE}");
        println!("{}{}", report::bw_header(gbits), cpu_header(p));
        print_result(p, rep, None);
    }
}

/// With `--out_json`, the file rewritten with `sum` (as perftest's
/// `print_full_bw_report`, with six decimals where this side's own average,
/// `mine`, is under 0.1 Gb/s).
fn write_json(p: &Params, mine: &BwReport, sum: &BwReport) {
    if let Some(j) = &p.json {
        let ext = p.args.report_gbits && mine.bw_avg < 0.1;
        j.write(&json::bw_results(p, sum, ext));
    }
}

/// The dashed line after the table, unless `--output` asks for figures alone.
fn print_end(p: &Params) {
    if p.full() {
        println!("{RESULT_LINE}");
    }
}

/// READ and WRITE, the client: every size, then its last report to the server.
fn rdma_bw_client(side: &Side, mut comm: Comm, k0: &KeyData) -> AnyResult<()> {
    let mut last = BwReport::default();
    for size in side.p.sizes() {
        last = bw_client(side, size)?;
        super::timing::warn_cpu_freq(side.p.args.cpu_freq);
        print_result(&side.p, &last, None);
    }
    print_end(&side.p);
    comm.handshake(k0)?;
    comm.reports(&last)?;
    comm.close(k0)?;
    Ok(())
}

/// READ and WRITE, the server: waits (without a time limit) for the client's end,
/// then prints the client's report.
fn rdma_bw_server(mut comm: Comm, k0: &KeyData, p: &Params) -> AnyResult<()> {
    comm.set_timeout(None);
    comm.handshake(k0)?;
    comm.set_timeout(Some(SETUP_TIMEOUT));
    let rep = comm.reports(&BwReport::default())?;
    print_result(p, &rep, None);
    comm.close(k0)?;
    print_end(p);
    Ok(())
}

/// READ and WRITE with `-b`, both sides alike: per size a handshake starts both
/// runs (with `-a` another ends them), the reports are swapped, and each side
/// prints the sum. The exchanges wait without a time limit, as the peer's run may
/// take longer than ours.
fn rdma_bw_duplex(side: &Side, mut comm: Comm, k0: &KeyData) -> AnyResult<()> {
    let p = &side.p;
    comm.set_timeout(None);
    for size in p.sizes() {
        comm.handshake(k0)?;
        let mine = bw_client(side, size)?;
        if p.args.all {
            comm.handshake(k0)?;
        }
        super::timing::warn_cpu_freq(p.args.cpu_freq);
        let rem = comm.reports(&mine)?;
        print_result(p, &mine, Some(&rem));
        print_both(p, &mine, &rem);
    }
    comm.set_timeout(Some(SETUP_TIMEOUT));
    print_end(p);
    comm.close(k0)?;
    Ok(())
}

/// SEND, both sides: per size, the receiving sides post their receives, a
/// handshake starts the size, and each side prints its own figures; with `-b`
/// (unless timed by `-D`) the reports are swapped and each side prints the sum.
fn send_bw(side: &Side, mut comm: Comm, k0: &KeyData) -> AnyResult<()> {
    let p = &side.p;
    for size in p.sizes() {
        if !p.is_client || p.duplex {
            side.post_initial_recvs(size)?;
        }
        comm.set_timeout(None);
        comm.handshake(k0)?;
        let rep = match (p.duplex, p.is_client) {
            (true, _) => bw_both_ways(side, size)?,
            (false, true) => bw_client(side, size)?,
            (false, false) => bw_server_recv(side, size)?,
        };
        super::timing::warn_cpu_freq(p.args.cpu_freq);
        if p.duplex && p.args.duration.is_none() {
            let rem = comm.reports(&rep)?;
            print_result(p, &rep, Some(&rem));
            print_both(p, &rep, &rem);
        } else {
            print_result(p, &rep, None);
            // With -D no report is swapped: the peer's figures are unknown (C
            // prints whatever its struct held).
            print_both(p, &rep, &BwReport::default());
        }
        if p.args.all {
            comm.handshake(k0)?;
        }
    }
    comm.set_timeout(Some(SETUP_TIMEOUT));
    print_end(p);
    comm.close(k0)?;
    Ok(())
}

/// The bandwidth client (`run_iter_bw`): keeps up to `tx_depth` requests in flight per
/// QP, posts lists of `post_list`, signals every `cq_mod`-th.
fn bw_client(side: &Side, size: u64) -> AnyResult<BwReport> {
    bw_client_then(side, size, |_| Ok(()))
}

/// [`bw_client`], calling `each` with the requests completed so far on every turn
/// of its loop.
#[inline(always)]
fn bw_client_then(
    side: &Side,
    size: u64,
    mut each: impl FnMut(u64) -> AnyResult<()>,
) -> AnyResult<BwReport> {
    let mut c = BwClient::new(side, size, true);
    let mut wcs = [WorkCompletion::default(); 16];
    let mut relax = Relax::default();
    loop {
        each(c.totccnt)?;
        let running = c.running();
        if !running && c.signaled_done == c.signaled_posted {
            break;
        }
        if running {
            c.post()?;
        }
        let n = side.send_cq.poll(&mut wcs)?.len();
        if n == 0 {
            match &side.events {
                Some(ev) => ev.wait("send")?,
                None => {
                    relax.idle();
                    c.check_stall()?;
                }
            }
            continue;
        }
        relax.busy();
        c.complete(&wcs[..n])?;
    }
    Ok(c.report())
}

/// SEND with `-b` (`run_iter_bi`): each side sends as the client does and
/// receives as the server does, polling both queues in turn, until all its sends
/// are complete and all the peer's have arrived. The server sends nothing before
/// the client's first message arrives; with `-D` its phases start then, the run
/// ends with them, and its window counts sends and receives alike.
fn bw_both_ways(side: &Side, size: u64) -> AnyResult<BwReport> {
    // Without the peak, perftest times the whole loop: from before the first
    // receive to after the last one.
    let start = Instant::now();
    // The server's clock of `-D` starts at the first receive.
    let mut held = !side.p.is_client;
    let mut c = BwClient::new(side, size, !held);
    let mut r = Receiver::new(side, size);
    let timed = side.p.args.duration;
    let mut wcs = [WorkCompletion::default(); 16];
    let mut relax = Relax::default();
    loop {
        let sent = !c.running() && c.signaled_done == c.signaled_posted;
        match (&c.phases, timed) {
            (Some(ph), Some(_)) if c.stopped || ph.ended(Instant::now()) => break,
            (_, None) if sent && r.count >= r.tot => break,
            _ => {}
        }
        if !held && !c.stopped {
            c.post()?;
        }
        let got = r.poll(&mut wcs, c.phases.as_ref())?;
        if got > 0 && held {
            held = false;
            c.phases = Phases::of(&side.p);
        }
        let n = side.send_cq.poll(&mut wcs)?.len();
        if n == 0 && got == 0 {
            match &side.events {
                Some(ev) => ev.wait("send or receive")?,
                None => {
                    relax.idle();
                    c.check_stall()
                        .map_err(|e| format!("{e}; {} of {} received", r.count, r.tot))?;
                }
            }
            continue;
        }
        relax.busy();
        // Also the clock of progress when only receives came.
        c.complete(&wcs[..n])?;
    }
    if let (Some(ph), Some(_)) = (&c.phases, timed) {
        let count = c.sampled + r.sampled;
        return Ok(duration_report(size, count, ph, side.p.args.report_gbits));
    }
    if side.p.no_peak {
        return Ok(average_report(
            size,
            r.tot,
            start.elapsed().as_secs_f64(),
            side.p.args.report_gbits,
        ));
    }
    Ok(c.report())
}

/// The receiving half of a bidirectional SEND run: counts what arrives, and
/// reposts while more is expected (always with `-D`).
struct Receiver<'a> {
    side: &'a Side,
    size: u64,
    /// Receives posted per QP.
    posted: Vec<u64>,
    /// Received in all, and expected in all (without `-D`).
    count: u64,
    tot: u64,
    /// `-D`: receives inside the sampled window.
    sampled: u64,
}

impl<'a> Receiver<'a> {
    /// The state after `Side::post_initial_recvs`.
    fn new(side: &'a Side, size: u64) -> Receiver<'a> {
        let p = &side.p;
        Receiver {
            side,
            size,
            posted: vec![side.initial_recvs(); side.qps.len()],
            count: 0,
            tot: p.iters * side.qps.len() as u64,
            sampled: 0,
        }
    }

    /// One poll of the receive queue: counts and reposts what arrived; returns how
    /// many did.
    fn poll(&mut self, wcs: &mut [WorkCompletion], phases: Option<&Phases>) -> AnyResult<usize> {
        let n = self.side.recv_cq.poll(wcs)?.len();
        if n == 0 {
            return Ok(0);
        }
        let timed = self.side.p.args.duration.is_some();
        let in_window = timed && phases.is_some_and(|ph| ph.sampling(Instant::now()));
        for wc in &wcs[..n] {
            if !wc.is_ok() {
                return Err(completion_error(wc, "receive"));
            }
            self.count += 1;
            if in_window {
                self.sampled += 1;
            }
            let q = wc.wr_id() as usize;
            if q >= self.posted.len() {
                return Err(format!("a receive completion names QP {q}").into());
            }
            if timed || self.posted[q] < self.side.p.iters {
                self.side.post_recv(q, self.size)?;
                self.posted[q] += 1;
            }
        }
        Ok(n)
    }
}

/// Each QP's chained list of `post_list` send requests and their SGEs, in boxed
/// slices that never move (the requests point at their SGEs and at each other).
struct PostLists {
    /// Read by the device through `wrs`' pointers.
    _sges: Vec<Box<[sys::ibv_sge]>>,
    wrs: Vec<Box<[sys::ibv_send_wr]>>,
}

impl PostLists {
    /// Lists of `size`-byte requests from each QP's send slot to the peer's buffer.
    fn new(side: &Side, size: u64, opcode: sys::ibv_wr_opcode) -> PostLists {
        let pl = side.p.post_list as usize;
        let nq = side.qps.len();
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
        PostLists { _sges: sges, wrs }
    }
}

/// The bandwidth client's state: its lists, the counts per QP and in all, and the
/// times of posts and completions (without `-D`).
struct BwClient<'a> {
    side: &'a Side,
    size: u64,
    lists: PostLists,
    /// Requests per list.
    pl: u64,
    iters: u64,
    cq_mod: u64,
    tx_depth: u64,
    inline: bool,
    /// `-D`: the phases, and whether posting has stopped for good.
    phases: Option<Phases>,
    stopped: bool,
    /// `--run_infinitely`: posting never stops.
    endless: bool,
    /// Requests to post in all (0 with `-D` or `--run_infinitely`).
    tot: u64,
    /// Whether post and completion times are kept (not with `-D` or
    /// `--run_infinitely`).
    keep_times: bool,
    posted: Vec<u64>,
    completed: Vec<u64>,
    /// Per QP: posted, completed, posted since the last signaled request.
    scnt: Vec<u64>,
    ccnt: Vec<u64>,
    since_signal: Vec<u64>,
    totscnt: u64,
    totccnt: u64,
    signaled_posted: u64,
    signaled_done: u64,
    /// `-D`: completions inside the sampled window.
    sampled: u64,
    clock: Clock,
    stall: u64,
    last_progress: u64,
}

impl<'a> BwClient<'a> {
    /// The state before the first post; the phases of `-D` start now, unless
    /// `phases_now` is false (they are set when they start).
    fn new(side: &'a Side, size: u64, phases_now: bool) -> BwClient<'a> {
        let p = &side.p;
        let nq = side.qps.len();
        let opcode = match p.verb {
            Verb::Send => sys::ibv_wr_opcode::IBV_WR_SEND,
            Verb::Write => sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE,
            Verb::Read => sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
        };
        let lists = PostLists::new(side, size, opcode);
        let endless = p.args.run_infinitely;
        let unbounded = p.args.duration.is_some() || endless;
        let tot = if unbounded { 0 } else { p.iters * nq as u64 };
        let keep_times = !unbounded;
        let clock = side.clock;
        BwClient {
            side,
            size,
            lists,
            pl: p.post_list as u64,
            iters: p.iters,
            cq_mod: p.cq_mod as u64,
            tx_depth: p.tx_depth as u64,
            inline: p.verb != Verb::Read && size <= p.inline_size as u64,
            phases: if phases_now { Phases::of(p) } else { None },
            stopped: false,
            endless,
            tot,
            keep_times,
            posted: vec![0u64; if keep_times { tot as usize } else { 0 }],
            completed: vec![0u64; if keep_times { tot as usize } else { 0 }],
            scnt: vec![0u64; nq],
            ccnt: vec![0u64; nq],
            since_signal: vec![0u64; nq],
            totscnt: 0,
            totccnt: 0,
            signaled_posted: 0,
            signaled_done: 0,
            sampled: 0,
            clock,
            stall: clock.ticks_in(STALL),
            last_progress: clock.ticks(),
        }
    }

    /// Whether more is to be posted; with `-D`, once over, for good (the peer stops
    /// receiving).
    #[inline(always)]
    fn running(&mut self) -> bool {
        match &self.phases {
            Some(ph) => {
                self.stopped = self.stopped || ph.ended(Instant::now());
                !self.stopped
            }
            None => self.endless || self.totscnt < self.tot,
        }
    }

    /// Posts lists on every QP while its requests in flight stay within `tx_depth`.
    #[inline(always)]
    fn post(&mut self) -> AnyResult<()> {
        let unbounded = self.phases.is_some() || self.endless;
        for q in 0..self.scnt.len() {
            while (unbounded || self.scnt[q] < self.iters)
                && self.scnt[q] - self.ccnt[q] + self.pl <= self.tx_depth
            {
                // As perftest checks its alarm's state before each post: a post may
                // take long (rxe sends in the caller's context).
                if let Some(ph) = &self.phases {
                    if self.stopped || ph.ended(Instant::now()) {
                        self.stopped = true;
                        break;
                    }
                }
                self.arm(q);
                if self.keep_times {
                    self.posted[self.totscnt as usize] = self.clock.ticks();
                }
                let list = &mut self.lists.wrs[q];
                // Raw on purpose: perftest's own data path (see the module doc of `run`).
                // SAFETY: `ibv_post_send` copies the work requests and their SGE
                // lists into the send queue before it returns, so the lists need
                // live only for the call (they do). The buffers they name belong to
                // the region, which `Side` drops after its queue pairs, so the
                // device is done with them on every path out, errors included.
                unsafe { self.side.qps[q].post_send_raw(list.as_mut_ptr()) }.map_err(|e| {
                    format!("Couldn't post send: qp {q} scnt={}: {e}", self.scnt[q])
                })?;
                self.scnt[q] += self.pl;
                self.totscnt += self.pl;
            }
        }
        Ok(())
    }

    /// Sets the flags and ids of QP `q`'s next list: every `cq_mod`-th request (and
    /// the last) is signaled, its id carrying the QP and the requests it covers.
    #[inline(always)]
    fn arm(&mut self, q: usize) {
        let unbounded = self.phases.is_some() || self.endless;
        for (j, wr) in self.lists.wrs[q].iter_mut().enumerate() {
            let s = self.scnt[q] + j as u64;
            self.since_signal[q] += 1;
            let signal = (s + 1) % self.cq_mod == 0 || (!unbounded && s == self.iters - 1);
            let mut flags = 0;
            if signal {
                flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
                wr.wr_id = ((q as u64) << 48) | self.since_signal[q];
                self.since_signal[q] = 0;
                self.signaled_posted += 1;
            } else {
                wr.wr_id = (q as u64) << 48;
            }
            if self.inline {
                flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
            }
            wr.send_flags = flags;
        }
    }

    /// Fails after `STALL` without a completion.
    #[inline(always)]
    fn check_stall(&self) -> AnyResult<()> {
        if self.clock.ticks().wrapping_sub(self.last_progress) > self.stall {
            return Err(format!(
                "no completion for {} s ({} of {} completed)",
                STALL.as_secs(),
                self.totccnt,
                self.totscnt
            )
            .into());
        }
        Ok(())
    }

    /// Counts polled completions: each covers the requests its id names.
    #[inline(always)]
    fn complete(&mut self, wcs: &[WorkCompletion]) -> AnyResult<()> {
        let t = self.clock.ticks();
        self.last_progress = t;
        let in_window = self.phases.is_some_and(|ph| ph.sampling(Instant::now()));
        for wc in wcs {
            if !wc.is_ok() {
                return Err(completion_error(wc, "send"));
            }
            self.signaled_done += 1;
            let q = (wc.wr_id() >> 48) as usize;
            let covers = wc.wr_id() & 0xffff_ffff_ffff;
            self.ccnt[q] += covers;
            let from = self.totccnt;
            self.totccnt += covers;
            if in_window {
                self.sampled += covers;
            }
            if self.keep_times {
                let to = self.totccnt.min(self.tot);
                for slot in &mut self.completed[from.min(self.tot) as usize..to as usize] {
                    *slot = t;
                }
            }
        }
        Ok(())
    }

    /// The figures: over the sampled window with `-D`, else from the post and
    /// completion times.
    fn report(&self) -> BwReport {
        let p = &self.side.p;
        if let Some(ph) = &self.phases {
            return duration_report(self.size, self.sampled, ph, p.args.report_gbits);
        }
        let t0 = self.posted.first().copied().unwrap_or(0);
        let to_ns = |v: &[u64]| -> Vec<f64> {
            v.iter()
                .map(|&t| self.clock.ns(t.wrapping_sub(t0) as i64 as u64))
                .collect()
        };
        report::bw_report(
            self.size,
            &to_ns(&self.posted),
            &to_ns(&self.completed),
            p.cq_mod as usize,
            self.pl as usize,
            p.no_peak,
            p.args.report_gbits,
        )
    }
}

/// Average figures, no peak: `count` messages of `size` in `secs`.
fn average_report(size: u64, count: u64, secs: f64, gbits: bool) -> BwReport {
    let secs = secs.max(1e-9);
    let factor = if gbits { 125e6 } else { 1048576.0 };
    BwReport {
        size,
        iters: count,
        bw_peak: 0.0,
        bw_avg: size as f64 * count as f64 / (secs * factor),
        msg_rate: count as f64 / secs / 1e6,
    }
}

/// Bandwidth figures of a duration run: `count` messages of `size` in the window.
fn duration_report(size: u64, count: u64, phases: &Phases, gbits: bool) -> BwReport {
    average_report(size, count, phases.window_secs(), gbits)
}

/// The SEND bandwidth server (`run_iter_bw_server`): receives `iters` per QP,
/// reposting while more are expected; timed from the first receive. With `-D` the
/// phases start at the first receive, every receive is reposted, and those of the
/// sampled window count.
fn bw_server_recv(side: &Side, size: u64) -> AnyResult<BwReport> {
    bw_server_recv_then(side, size, |_| Ok(()))
}

/// [`bw_server_recv`], calling `each` with the messages received so far on every
/// turn of its loop; with `--run_infinitely` it receives until an error.
#[inline(always)]
fn bw_server_recv_then(
    side: &Side,
    size: u64,
    mut each: impl FnMut(u64) -> AnyResult<()>,
) -> AnyResult<BwReport> {
    let p = side.p.clone();
    let nq = side.qps.len();
    let endless = p.args.run_infinitely;
    let timed = p.args.duration.filter(|_| !endless);
    let tot = p.iters * nq as u64;
    let mut posted = vec![side.initial_recvs(); nq];
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
        each(rcnt)?;
        match &phases {
            Some(ph) if ph.ended(Instant::now()) => break,
            None if timed.is_none() && !endless && rcnt >= tot => break,
            _ => {}
        }
        let n = side.recv_cq.poll(&mut wcs)?.len();
        if n == 0 {
            if let Some(ev) = &side.events {
                ev.wait("receive")?;
                continue;
            }
            relax.idle();
            if clock.ticks().wrapping_sub(last_progress) > stall {
                let of = if endless {
                    "received in all".to_string()
                } else {
                    format!("of {tot}")
                };
                return Err(format!("no receive for {} s ({rcnt} {of})", STALL.as_secs()).into());
            }
            continue;
        }
        relax.busy();
        last_progress = clock.ticks();
        first.get_or_insert_with(Instant::now);
        if let (Some(_), None) = (timed, &phases) {
            phases = Phases::of(&p);
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
            if timed.is_some() || endless || posted[q] < p.iters {
                side.post_recv(q, size)?;
                posted[q] += 1;
            }
        }
    }
    if let Some(ph) = &phases {
        return Ok(duration_report(size, sampled, ph, p.args.report_gbits));
    }
    let secs = first.map_or(0.0, |f| f.elapsed().as_secs_f64());
    Ok(average_report(size, tot, secs, p.args.report_gbits))
}
