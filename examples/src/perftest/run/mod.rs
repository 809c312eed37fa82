//! The six tools' common program, in four steps: `setup` (the device, the
//! out-of-band connection and its first exchanges, the queue pairs), `exchange` (the
//! keys, the connection of the queue pairs, the addresses printed), then the data
//! paths and their reports: `bw` (bandwidth with `-t` in flight, `-Q` moderation and
//! `-l` post lists) or `lat` (latency ping-pong). `timing` holds the clocks they
//! share ([`Clock`], [`Phases`], [`Relax`]).
//!
//! # Why the data paths post raw
//! perftest measures the cost of the verbs themselves, and its users compare our
//! numbers with its own. Its data paths are reproduced as it writes them: work
//! requests built once and reposted unchanged, chained into post lists (`-l`),
//! signaled one in `-Q`, over one region carved into a slot per queue pair, and the
//! write latency test spinning on the last byte of its slot, which the peer writes.
//! [`rdma_safe::LeasedQp`] lends a buffer per request and accounts for each one,
//! which is a different program to time; so these paths (`bw`, `lat` and the
//! receives they repost) keep `post_send_raw`/`post_recv_raw` and raw pointers into
//! the region on purpose, each with its `// SAFETY:` argument. Everything
//! around them (setup, the exchanges, the RDMA CM link) goes through the safe layer.

mod bw;
mod events;
mod exchange;
mod lat;
mod setup;
mod timing;

pub use lat::LatRun;
pub use timing::{
    Clock, Every, Phases, Relax, EMPTY_POLLS_BEFORE_YIELD, LATENCY_EMPTY_POLLS_BEFORE_YIELD,
};

use super::params::{Args, Params, TestKind};
use super::protocol::KeyData;
use super::rdma_cm::CmQps;
use rdma_safe::qp::Rts;
use rdma_safe::sys;
use rdma_safe::{CompletionQueue, MemoryRegion, QueuePair, WorkCompletion};
use setup::Resources;
use std::sync::Arc;
use std::time::Duration;

/// Errors of a run.
pub type AnyResult<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// How long a data path may wait without progress before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// Entry point of a tool: parses perftest's command line, runs, exits 1 on error.
/// As perftest, it also exits 1 after `-h` and `-V` (its parser's HELP_EXIT and
/// VERSION_EXIT make `main` return FAILURE), and on a command line it cannot
/// parse (clap would exit 2). A command line perftest refuses is refused in its
/// words and way ([`Refusal::report`](super::params::Refusal::report)).
pub fn main(verb: super::Verb, kind: TestKind) -> ! {
    let args = Args::parse_ordered(std::env::args_os()).unwrap_or_else(|e| {
        let _ = e.print();
        std::process::exit(1)
    });
    if args.version {
        println!("Version: {}", super::protocol::VERSION);
        std::process::exit(1);
    }
    let p = Params::new(verb, kind, args).unwrap_or_else(|refusal| {
        refusal.report();
        std::process::exit(1)
    });
    match run(p) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            // perftest's runtime messages start with one space (most of ours do).
            let msg = e.to_string();
            let pad = if msg.starts_with(' ') { "" } else { " " };
            eprintln!("{pad}{msg}");
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
    /// With `-e`: the completion channel the data paths sleep on.
    events: Option<events::Events>,
}

impl Side {
    fn send_addr(&self, q: usize) -> u64 {
        self.mr.addr() + q as u64 * self.slot
    }

    fn recv_addr(&self, q: usize) -> u64 {
        self.mr.addr() + (self.qps.len() + q) as u64 * self.slot
    }

    /// The receives a SEND test posts first per QP: `min(rx_depth, iters)`
    /// (`rx_depth` in duration mode).
    fn initial_recvs(&self) -> u64 {
        if self.p.args.duration.is_some() {
            self.p.rx_depth as u64
        } else {
            (self.p.rx_depth as u64).min(self.p.iters)
        }
    }

    /// Posts the first receives of a SEND test ([`Side::initial_recvs`] per QP).
    fn post_initial_recvs(&self, size: u64) -> AnyResult<()> {
        let n = self.initial_recvs();
        for q in 0..self.qps.len() {
            for _ in 0..n {
                self.post_recv(q, size)?;
            }
        }
        Ok(())
    }

    /// Posts one receive of `size` bytes into QP `q`'s receive slot.
    fn post_recv(&self, q: usize, size: u64) -> AnyResult<()> {
        let mut sge = sys::ibv_sge {
            addr: self.recv_addr(q),
            length: size as u32,
            lkey: self.mr.lkey(),
        };
        let mut wr = sys::ibv_recv_wr {
            wr_id: q as u64,
            sg_list: &mut sge,
            num_sge: 1,
            ..Default::default()
        };
        // Raw on purpose: perftest's own data path (see the module doc of `run`).
        // SAFETY: `wr` and `sge` live across the call; the receive buffer belongs to
        // the region, which outlives the QPs (both in `Side`, the region dropped after
        // them).
        unsafe { self.qps[q].post_recv_raw(&mut wr) }
            .map_err(|e| format!("Couldn't post recv Qp={q}: {e}"))?;
        Ok(())
    }
}

/// One run: setup, the key exchange and connection, the test, the disconnection.
fn run(p: Params) -> AnyResult<()> {
    let dev = setup::Device::open(&p)?;
    let p = Params {
        inline_size: dev.inline_size,
        ..p
    };
    let mut comm = setup::connect(&p)?;
    let (cycle_buffer, mtu) = setup::preliminaries(&mut comm, &dev)?;
    let slot = setup::slot_size(&p, cycle_buffer);
    let (res, pending, cm) = setup::queue_pairs(&p, &dev, &mut comm, slot)?;
    let Resources {
        mr,
        send_cq,
        recv_cq,
        channel,
        ..
    } = res;
    let events = channel.map(|ch| events::Events::new(ch, &send_cq, &recv_cq));
    let keys = exchange::local_keys(&dev, &pending, &mr, slot);
    let p = Params {
        json: exchange::print_test_info(&p, &dev, mtu),
        ..p
    };
    let (qps, rem) = exchange::connect(&p, &dev, &mut comm, pending, &keys, mtu)?;
    let mut side = Side {
        clock: Clock::calibrate(),
        qps,
        cm,
        p: p.clone(),
        mr,
        send_cq,
        recv_cq,
        rem,
        slot,
        events,
    };
    if let Some(ev) = &side.events {
        ev.arm(p.verb == super::Verb::Send)?;
    }
    match p.kind {
        TestKind::Bw => bw::run(&side, comm, &keys[0])?,
        TestKind::Lat => lat::run(&side, comm, &keys[0])?,
    }
    side.rem.clear();
    if let Some(cm) = &side.cm {
        // rdma_cm_disconnect_nodes: the C client waits for its Disconnected events.
        cm.disconnect(Duration::from_secs(3));
    }
    Ok(())
}

/// With `--cpu_util`, what a table's header adds (bandwidth and latency alike).
fn cpu_header(p: &Params) -> &'static str {
    if p.cpu_util {
        super::report::CPU_HEADER
    } else {
        ""
    }
}

/// With `--cpu_util`, what a whole row adds (not a figure alone, as perftest).
fn cpu_row(p: &Params) -> String {
    if p.cpu_util && p.full() {
        super::report::cpu_column(super::cpu::utilization())
    } else {
        String::new()
    }
}

/// The error for a failed completion, in perftest's words.
fn completion_error(wc: &WorkCompletion, what: &str) -> Box<dyn std::error::Error> {
    format!(
        " Completion with error at {what}:\n Failed status {}: wr_id {} syndrom 0x{:x}",
        rdma_safe::cq::status_text(wc.status()),
        wc.wr_id(),
        wc.0.vendor_err
    )
    .into()
}
