//! kiara-scale: how a KIARA server grows with its sessions. One client transport
//! opens `--sessions` sessions to a `kiara-echo-server` in steps, and after each
//! step prints how fast they were established and what each new session cost in
//! memory, on both sides, as the kernel counts it: resident and pinned
//! (registered) KiB per session. With every session connected it then measures
//! 64-byte round trips over all of them in turn (a different session each time).
//!
//! ```text
//! kiara-echo-server -a 198.18.0.1 --max-sessions 1100 & pid=$!
//! kiara-scale 198.18.0.1 --sessions 1024 --server-pid $pid
//! ```

use clap::Parser;
use examples::stats::{percentile, ProcMemory};
use kiara_ib::message::checksum;
use kiara_ib::{Config, Linger, Message, Session, Transport};
use std::time::{Duration, Instant};

/// Command line.
#[derive(Parser, Debug)]
#[command(about = "How a KIARA server grows with its sessions")]
struct Args {
    /// Address of the kiara-echo-server.
    server: String,
    /// TCP port of the bootstrap connection.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    dev: examples::kiara::DeviceArgs,
    /// Sessions to open.
    #[arg(short = 'n', long, default_value_t = 1024)]
    sessions: usize,
    /// Sessions opened per step (one table row each).
    #[arg(long, default_value_t = 128)]
    step: usize,
    /// Threads opening sessions at once.
    #[arg(long, default_value_t = 8)]
    parallel: usize,
    /// Round trips of 64 bytes once all sessions are open (session i % n each).
    #[arg(long, default_value_t = 2048)]
    round_trips: usize,
    /// The server's process id: its memory is read from /proc (same machine).
    #[arg(long)]
    server_pid: Option<u32>,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args) {
        eprintln!("kiara-scale: {e}");
        std::process::exit(1);
    }
}

fn run(args: &Args) -> Result<(), String> {
    let transport = Transport::new(Config {
        max_sessions: args.sessions.max(1),
        ..args.dev.config()
    });
    let addr = format!("{}:{}", args.server, args.port);
    let mut sessions = Vec::with_capacity(args.sessions);
    println!(
        "{:>9} {:>11} {:>13} {:>16} {:>13} {:>16}",
        "sessions",
        "sessions/s",
        "server KiB/s",
        "server pin KiB/s",
        "client KiB/s",
        "client pin KiB/s"
    );
    let mut before = memory(args)?;
    while sessions.len() < args.sessions {
        let n = args.step.min(args.sessions - sessions.len());
        let began = Instant::now();
        sessions.extend(open(&transport, &addr, n, args.parallel)?);
        let rate = n as f64 / began.elapsed().as_secs_f64();
        let after = memory(args)?;
        print_step(sessions.len(), rate, n, before, after);
        before = after;
    }
    round_trips(&transport, &sessions, args.round_trips)?;
    let began = Instant::now();
    let count = sessions.len();
    for s in sessions {
        transport
            .disconnect(s)
            .map_err(|e| format!("disconnect: {e}"))?;
    }
    println!(
        "closed {count} sessions in {:.2} s",
        began.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The server's memory (zeros without `--server-pid`) and ours.
fn memory(args: &Args) -> Result<(ProcMemory, ProcMemory), String> {
    let server = match args.server_pid {
        Some(pid) => ProcMemory::read(Some(pid)).map_err(|e| format!("server pid {pid}: {e}"))?,
        None => ProcMemory::default(),
    };
    let client = ProcMemory::read(None).map_err(|e| format!("/proc/self/status: {e}"))?;
    Ok((server, client))
}

/// One table row: the step's rate and what each of its `n` sessions added.
fn print_step(
    total: usize,
    rate: f64,
    n: usize,
    (s0, c0): (ProcMemory, ProcMemory),
    (s1, c1): (ProcMemory, ProcMemory),
) {
    let per = |a: u64, b: u64| (b as f64 - a as f64) / n as f64;
    println!(
        "{total:>9} {rate:>11.1} {:>13.1} {:>16.1} {:>13.1} {:>16.1}",
        per(s0.rss_kib, s1.rss_kib),
        per(s0.pinned_kib, s1.pinned_kib),
        per(c0.rss_kib, c1.rss_kib),
        per(c0.pinned_kib, c1.pinned_kib)
    );
}

/// Opens `n` sessions to `addr` from `parallel` threads.
fn open(
    transport: &Transport,
    addr: &str,
    n: usize,
    parallel: usize,
) -> Result<Vec<Session>, String> {
    let threads = parallel.clamp(1, n.max(1));
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let count = n / threads + usize::from(t < n % threads);
                s.spawn(move || {
                    (0..count)
                        .map(|_| transport.connect(addr).map_err(|e| format!("connect: {e}")))
                        .collect::<Result<Vec<_>, _>>()
                })
            })
            .collect();
        let mut all = Vec::with_capacity(n);
        for h in handles {
            all.extend(h.join().map_err(|_| "a connecting thread panicked")??);
        }
        Ok(all)
    })
}

/// `count` echoes of 64 bytes, each on the next session in turn; every echo is
/// checked. Prints the round trip's median, p99 and p99.9.
fn round_trips(transport: &Transport, sessions: &[Session], count: usize) -> Result<(), String> {
    if sessions.is_empty() || count == 0 {
        return Ok(());
    }
    let mut rtts = Vec::with_capacity(count);
    for i in 0..count {
        let session = &sessions[i % sessions.len()];
        let payload: Vec<u8> = (0..64u32).map(|b| (b as usize ^ i) as u8).collect();
        let sum = checksum(&payload);
        let began = Instant::now();
        transport
            .send(session, Message::new(payload), Linger::Block)
            .map_err(|e| format!("send on session {}: {e}", session.id()))?;
        let echo = transport
            .recv(session, Linger::Timeout(Duration::from_secs(60)))
            .map_err(|e| format!("recv on session {}: {e}", session.id()))?
            .ok_or_else(|| format!("no echo on session {} within 60 s", session.id()))?;
        rtts.push(began.elapsed().as_secs_f64() * 1e6);
        if checksum(echo.bytes()) != sum {
            return Err(format!("echo {i} on session {} differs", session.id()));
        }
    }
    rtts.sort_by(f64::total_cmp);
    println!(
        "round trips over {} sessions: {count} x 64 B, median {:.1} us, p99 {:.1} us, p99.9 {:.1} us",
        sessions.len(),
        percentile(&rtts, 50.0),
        percentile(&rtts, 99.0),
        percentile(&rtts, 99.9)
    );
    Ok(())
}
