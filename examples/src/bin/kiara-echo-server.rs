//! `kiara-echo-server`: a KIARA InfiniBand server that sends every message back on
//! the session it came from, with the message's checksum as metadata.
//!
//! ```text
//! kiara-echo-server [-a <address>] [-p <port>] [-d <device>] [--ib-port <port>] [-x <gid index>]
//!                   [--ack-timeout <s>] [--peer-timeout <s>]
//! ```

use clap::Parser;
use kiara_ib::message::checksum;
use kiara_ib::{Config, Linger, Transport};

/// Command line.
#[derive(Parser, Debug)]
#[command(
    name = "kiara-echo-server",
    about = "KIARA echo server over InfiniBand/RoCE"
)]
struct Args {
    /// Address to listen on.
    #[arg(short = 'a', long, default_value = "0.0.0.0")]
    address: String,
    /// TCP port of the bootstrap connection.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    #[command(flatten)]
    dev: examples::kiara::DeviceArgs,
    /// Exit after this many seconds (default: serve until killed).
    #[arg(short = 't', long)]
    time: Option<u64>,
    /// How long a waiting thread polls the completion queue before it sleeps,
    /// in microseconds (0: never spin).
    #[arg(long, default_value_t = 2000)]
    busy_poll: u64,
    /// Messages up to this many bytes travel inside the SEND (eager).
    #[arg(short = 'e', long, default_value_t = 4096)]
    eager: u32,
    /// Only receive (no echo): the peer of `kiara-echo-client --one-way`.
    #[arg(long)]
    sink: bool,
    /// Seconds a client may take to fetch and acknowledge a reply before its
    /// session is closed (`Config::ack_timeout`).
    #[arg(long, default_value_t = 120)]
    ack_timeout: u64,
    /// Seconds a client's host may stay silent before its sessions are closed
    /// (`Config::peer_timeout`; 0: never).
    #[arg(long, default_value_t = 30)]
    peer_timeout: u64,
    /// Live sessions at most (`Config::max_sessions`): a client beyond is refused.
    #[arg(long, default_value_t = 256)]
    max_sessions: usize,
    /// Receive slots of a shared receive queue every client's session receives
    /// into (`Config::shared_receive_slots`; 0: each session has its own).
    #[arg(long, default_value_t = 0)]
    shared_receive_slots: u32,
}

fn main() {
    let args = Args::parse();
    let config = Config {
        eager_threshold: args.eager,
        busy_poll: std::time::Duration::from_micros(args.busy_poll),
        ack_timeout: std::time::Duration::from_secs(args.ack_timeout),
        peer_timeout: std::time::Duration::from_secs(args.peer_timeout),
        max_sessions: args.max_sessions,
        shared_receive_slots: args.shared_receive_slots,
        ..args.dev.config()
    };
    // Orderly session ends are routine; everything else is worth a line.
    let log = std::sync::Arc::new(|line: &str| {
        if !line.contains(" ended: ") {
            eprintln!("kiara-echo-server: {line}");
        }
    });
    let server = Transport::with_logger(config, log);
    let sink = args.sink;
    let registered = server.register_callback(move |msg, session, transport| {
        if sink {
            return;
        }
        // The reply is the message itself, with its checksum as metadata.
        let sum = checksum(msg.bytes()).to_be_bytes();
        let reply = match msg.with_meta(&sum) {
            Ok(reply) => reply,
            Err(e) => return eprintln!("kiara-echo-server: {e}"),
        };
        if let Err(e) = transport.send(session, reply, Linger::NoWait) {
            eprintln!("kiara-echo-server: reply to session {}: {e}", session.id());
        }
    });
    let bound = registered.and_then(|()| server.bind((args.address.as_str(), args.port)));
    match bound {
        Ok(addr) => println!("kiara-echo-server: listening on {addr}"),
        Err(e) => {
            eprintln!("kiara-echo-server: {e}");
            std::process::exit(1);
        }
    }
    match args.time {
        Some(secs) => {
            std::thread::sleep(std::time::Duration::from_secs(secs));
            if let Err(e) = server.unbind() {
                eprintln!("kiara-echo-server: unbind: {e}");
                std::process::exit(1);
            }
            println!("kiara-echo-server: unbound");
        }
        None => loop {
            std::thread::park();
        },
    }
}
