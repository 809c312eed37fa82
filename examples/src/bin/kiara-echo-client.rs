//! `kiara-echo-client`: connects several clients to a `kiara-echo-server`, sends
//! messages of each size, checks every echo (bytes and checksum) and prints the
//! throughput and round-trip latency per size.
//!
//! ```text
//! kiara-echo-client <server address> [-p <port>] [-c <clients>] [-n <messages>] [-s <sizes>]
//!                   [-d <device>] [--ib-port <port>] [-x <gid index>]
//! ```

use clap::Parser;
use examples::perftest::run::Clock;
use examples::stats::percentile;
use kiara_ib::message::checksum;
use kiara_ib::{Config, Linger, Session, Transport};
use std::time::{Duration, Instant};

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "kiara-echo-client",
    about = "KIARA echo client: verified round trips per size"
)]
struct Args {
    /// Server address.
    server: String,
    /// Server's TCP port.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Concurrent clients (one session each).
    #[arg(short = 'c', long, default_value_t = 4)]
    clients: usize,
    /// Messages per client and size.
    #[arg(short = 'n', long, default_value_t = 50)]
    messages: usize,
    /// Message sizes in bytes, comma-separated.
    #[arg(
        short = 's',
        long,
        value_delimiter = ',',
        default_value = "64,4096,65536,1048576"
    )]
    sizes: Vec<usize>,
    /// One-way throughput instead of echoes: messages stream to a
    /// `kiara-echo-server --sink` with up to `--window` in flight per client.
    #[arg(long)]
    one_way: bool,
    /// How long a waiting thread polls the completion queue before it sleeps,
    /// in microseconds (0: never spin).
    #[arg(long, default_value_t = 2000)]
    busy_poll: u64,
    /// Messages up to this many bytes travel inside the SEND (eager).
    #[arg(short = 'e', long, default_value_t = 4096)]
    eager: u32,
    /// Sends in flight per client with `--one-way`. The default, 64, keeps the
    /// receiver's reads fed the way `ib_read_bw`'s 128-deep send queue does; 16
    /// left it idle between messages (about 0.94 x `ib_read_bw` at 64 KiB in
    /// the guest, against 1.0 x with 64).
    #[arg(short = 'w', long, default_value_t = 64)]
    window: usize,
    #[command(flatten)]
    dev: examples::kiara::DeviceArgs,
}

fn main() {
    let args = Args::parse();
    if args.one_way {
        return one_way(&args);
    }
    println!(
        "{:>10} {:>8} {:>12} {:>14} {:>14} {:>14}",
        "#bytes", "#msgs", "MB/s (echo)", "rtt median us", "rtt 99% us", "rtt 99.9% us"
    );
    for &size in &args.sizes {
        match run_size(&args, size) {
            Ok((rtts, secs)) => {
                let n = rtts.len();
                let mb_s = (2 * size * n) as f64 / secs / 1e6;
                println!(
                    "{:>10} {:>8} {:>12.2} {:>14.1} {:>14.1} {:>14.1}",
                    size,
                    n,
                    mb_s,
                    percentile(&rtts, 50.0),
                    percentile(&rtts, 99.0),
                    percentile(&rtts, 99.9)
                );
            }
            Err(e) => {
                eprintln!("kiara-echo-client: size {size}: {e}");
                std::process::exit(1);
            }
        }
    }
    println!("kiara-echo-client: every echo verified");
}

/// A transport configured from the command line, with `--clients` sessions to the
/// server.
fn connect_all(args: &Args) -> Result<(Transport, Vec<kiara_ib::Session>), String> {
    let transport = Transport::new(Config {
        eager_threshold: args.eager,
        busy_poll: Duration::from_micros(args.busy_poll),
        ..args.dev.config()
    });
    let addr = (args.server.as_str(), args.port);
    let sessions = (0..args.clients)
        .map(|_| transport.connect(addr).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((transport, sessions))
}

/// Sends one request of a round trip. An eager one (at most `eager` bytes, inside
/// the SEND) does not wait for its own completion: the echo proves the server has
/// it, as `ib_send_lat` waits for the reply and not for its SEND, and nothing but
/// a closed session, which `recv` reports, can fail it. A read message waits until
/// the server has fetched it, so a refusal is reported at once. A session with no
/// room for the request is waited on either way.
fn send_request(
    transport: &Transport,
    session: &Session,
    payload: &[u8],
    eager: u32,
) -> Result<(), String> {
    let linger = if payload.len() <= eager as usize {
        Linger::NoWait
    } else {
        Linger::Block
    };
    match transport.send(session, payload, linger) {
        Err(kiara_ib::Error::Full) => transport.send(session, payload, Linger::Block),
        sent => sent,
    }
    .map(drop)
    .map_err(|e| e.to_string())
}

/// Distinct payloads a client cycles through: fewer for large sizes (memory).
fn payload_ring(size: usize) -> usize {
    if size <= 64 << 10 {
        16
    } else {
        2
    }
}

/// One round of `clients` x `messages` echoes of `size` bytes: round-trip times in
/// microseconds (sorted) and the wall time in seconds.
fn run_size(args: &Args, size: usize) -> Result<(Vec<f64>, f64), String> {
    let (transport, sessions) = connect_all(args)?;
    // Round trips are timed with the time-stamp counter, as perftest does: on a
    // machine whose system clock is an emulated device, reading it costs about a
    // microsecond, inside the interval being measured.
    let clock = Clock::calibrate();
    let started = Instant::now();
    let mut rtts = std::thread::scope(|s| {
        let workers: Vec<_> = sessions
            .iter()
            .enumerate()
            .map(|(c, session)| {
                let transport = &transport;
                s.spawn(move || -> Result<Vec<f64>, String> {
                    // The payloads and their checksums are made before the loop, as
                    // perftest prepares its buffers: consecutive messages differ, so
                    // an echo of the wrong message is caught.
                    let ring: Vec<(Vec<u8>, u64)> = (0..payload_ring(size))
                        .map(|k| {
                            let p: Vec<u8> = (0..size).map(|b| (b ^ k ^ (c << 4)) as u8).collect();
                            let sum = checksum(&p);
                            (p, sum)
                        })
                        .collect();
                    let mut rtts = Vec::with_capacity(args.messages);
                    for i in 0..args.messages {
                        let (payload, sum) = &ring[i % ring.len()];
                        let t = clock.ticks();
                        send_request(transport, session, payload, args.eager)?;
                        let echo = transport
                            .recv(session, Linger::Timeout(Duration::from_secs(60)))
                            .map_err(|e| e.to_string())?
                            .ok_or("no echo within 60 s")?;
                        rtts.push(clock.ns(clock.ticks().wrapping_sub(t)) / 1e3);
                        if echo.bytes() != payload.as_slice() {
                            return Err(format!("client {c} message {i}: echo differs"));
                        }
                        if echo.meta() != sum.to_be_bytes() {
                            return Err(format!("client {c} message {i}: checksum differs"));
                        }
                    }
                    Ok(rtts)
                })
            })
            .collect();
        let mut all = Vec::new();
        for w in workers {
            all.extend(
                w.join()
                    .map_err(|_| "a client thread panicked".to_string())??,
            );
        }
        Ok::<_, String>(all)
    })?;
    let secs = started.elapsed().as_secs_f64();
    for session in sessions {
        transport.disconnect(session).map_err(|e| e.to_string())?;
    }
    rtts.sort_by(f64::total_cmp);
    Ok((rtts, secs))
}

/// Streams messages of each size and prints the one-way throughput.
fn one_way(args: &Args) {
    println!("{:>10} {:>8} {:>14}", "#bytes", "#msgs", "MB/s (one way)");
    for &size in &args.sizes {
        let result = (|| -> Result<f64, String> {
            let window = window_for(args, size)?;
            let (transport, sessions) = connect_all(args)?;
            // Zero copy: the messages are regions registered with the transport.
            let regions = (0..args.clients * window)
                .map(|_| {
                    let mut mr = transport.register(size.max(1)).map_err(|e| e.to_string())?;
                    mr.as_mut_slice().map_err(|e| e.to_string())?.fill(0x5a);
                    Ok(std::sync::Arc::new(mr))
                })
                .collect::<Result<Vec<_>, String>>()?;
            let stream = Stream {
                transport: &transport,
                regions: &regions,
                window,
                size,
            };
            // Warm up (the receiver's buffer pool, the wait estimates), then measure.
            stream.all(&sessions, 2 * window)?;
            let started = Instant::now();
            stream.all(&sessions, args.messages)?;
            let secs = started.elapsed().as_secs_f64();
            for session in sessions {
                transport.disconnect(session).map_err(|e| e.to_string())?;
            }
            Ok((size * args.messages * args.clients) as f64 / secs / 1e6)
        })();
        match result {
            Ok(mb_s) => println!(
                "{:>10} {:>8} {:>14.2}",
                size,
                args.messages * args.clients,
                mb_s
            ),
            Err(e) => {
                eprintln!("kiara-echo-client: size {size}: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// Sends in flight per client at `size` bytes: `--window`, cut to half of what the
/// server may hold of a session (`Config::max_receiving_bytes`, its default). A
/// message the server has acknowledged still counts there until its callback is
/// done, so a window of the whole budget would see sends refused as busy.
fn window_for(args: &Args, size: usize) -> Result<usize, String> {
    let held = Config::default().max_receiving_bytes;
    if size as u64 > held {
        return Err(format!(
            "{size} bytes is more than the server holds of a session \
             (max_receiving_bytes, {held}): it would refuse every message"
        ));
    }
    let fits = (held / 2 / size.max(1) as u64).max(1);
    Ok(args.window.min(fits as usize).max(1))
}

/// One size's stream: every session sends from its share of `regions`.
struct Stream<'a> {
    transport: &'a Transport,
    regions: &'a [std::sync::Arc<rdma_safe::MemoryRegion>],
    window: usize,
    size: usize,
}

impl Stream<'_> {
    /// Every session streams `count` messages, with up to `window` in flight, on a
    /// thread of its own.
    fn all(&self, sessions: &[kiara_ib::Session], count: usize) -> Result<(), String> {
        std::thread::scope(|s| {
            let workers: Vec<_> = sessions
                .iter()
                .enumerate()
                .map(|(c, session)| s.spawn(move || self.one(c, session, count)))
                .collect();
            for w in workers {
                w.join()
                    .map_err(|_| "a client thread panicked".to_string())??;
            }
            Ok(())
        })
    }

    /// Client `c` streams `count` messages on `session`.
    fn one(&self, c: usize, session: &kiara_ib::Session, count: usize) -> Result<(), String> {
        let mut inflight = std::collections::VecDeque::new();
        for i in 0..count {
            if inflight.len() == self.window {
                self.settle(c, session, &mut inflight)?;
            }
            let slot = i % self.window;
            inflight.push_back((self.send(c, session, slot)?, slot));
        }
        while !inflight.is_empty() {
            self.settle(c, session, &mut inflight)?;
        }
        Ok(())
    }

    /// Sends region `slot` of client `c`.
    fn send(
        &self,
        c: usize,
        session: &kiara_ib::Session,
        slot: usize,
    ) -> Result<kiara_ib::SendHandle, String> {
        let region = self.regions[c * self.window + slot].clone();
        let msg =
            kiara_ib::Message::from_region(region, 0..self.size).map_err(|e| e.to_string())?;
        self.transport
            .send(session, msg, Linger::NoWait)
            .map_err(|e| e.to_string())
    }

    /// Waits for the oldest send. One the server refused as busy (it still held
    /// as many bytes as it may) goes again after a millisecond, up to 5,000 times.
    fn settle(
        &self,
        c: usize,
        session: &kiara_ib::Session,
        inflight: &mut std::collections::VecDeque<(kiara_ib::SendHandle, usize)>,
    ) -> Result<(), String> {
        let Some((mut handle, slot)) = inflight.pop_front() else {
            return Ok(());
        };
        for _ in 0..5_000 {
            match handle.wait(Some(Duration::from_secs(60))) {
                Ok(()) => return Ok(()),
                Err(e) if e.is_busy() => {
                    std::thread::sleep(Duration::from_millis(1));
                    handle = self.send(c, session, slot)?;
                }
                Err(e) => return Err(e.to_string()),
            }
        }
        Err("the server stayed busy for 5,000 tries".into())
    }
}
