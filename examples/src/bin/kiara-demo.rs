//! `kiara-demo`: the KIARA demonstration. Starts `kiara-echo-server` and then
//! `kiara-echo-client` with several clients (both are sibling binaries), prints the
//! client's per-size throughput and latency table, and stops the server.
//!
//! ```text
//! kiara-demo [-a <address>] [-p <port>] [-c <clients>] [-n <messages>] [-s <sizes>]
//! ```

use clap::Parser;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};

/// Command line.
#[derive(Parser, Debug)]
#[command(name = "kiara-demo", about = "KIARA echo server and clients, measured")]
struct Args {
    /// Address the server listens on (default: RDMA_IP, else 198.18.0.1).
    #[arg(short = 'a', long)]
    address: Option<String>,
    /// TCP port of the bootstrap connection.
    #[arg(short = 'p', long, default_value_t = 18515)]
    port: u16,
    /// Concurrent clients.
    #[arg(short = 'c', long, default_value_t = 4)]
    clients: usize,
    /// Messages per client and size.
    #[arg(short = 'n', long, default_value_t = 20)]
    messages: usize,
    /// Message sizes in bytes, comma-separated.
    #[arg(short = 's', long, default_value = "64,4096,65536,1048576,8388608")]
    sizes: String,
}

fn sibling(name: &str) -> PathBuf {
    let me = std::env::current_exe().expect("own path");
    me.with_file_name(name)
}

fn main() -> ExitCode {
    let args = Args::parse();
    let address = args
        .address
        .clone()
        .or_else(|| std::env::var("RDMA_IP").ok())
        .unwrap_or_else(|| "198.18.0.1".into());
    let port = args.port.to_string();
    let mut server = match Command::new(sibling("kiara-echo-server"))
        .args(["-a", &address, "-p", &port])
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(child) => child,
        Err(e) => {
            eprintln!("kiara-demo: cannot start kiara-echo-server: {e}");
            return ExitCode::FAILURE;
        }
    };
    // Wait for the server's "listening" line before starting the clients.
    let mut lines = BufReader::new(server.stdout.take().expect("piped")).lines();
    match lines.next() {
        Some(Ok(line)) if line.contains("listening") => println!("{line}"),
        other => {
            eprintln!("kiara-demo: the server did not start: {other:?}");
            let _ = server.kill();
            return ExitCode::FAILURE;
        }
    }
    println!(
        "kiara-demo: {} clients x {} messages per size, each echoed and verified",
        args.clients, args.messages
    );
    let status = Command::new(sibling("kiara-echo-client"))
        .args([
            address.as_str(),
            "-p",
            &port,
            "-c",
            &args.clients.to_string(),
            "-n",
            &args.messages.to_string(),
            "-s",
            &args.sizes,
        ])
        .status();
    let _ = server.kill();
    let _ = server.wait();
    match status {
        Ok(s) if s.success() => ExitCode::SUCCESS,
        Ok(s) => {
            eprintln!("kiara-demo: the client failed ({s})");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("kiara-demo: cannot start kiara-echo-client: {e}");
            ExitCode::FAILURE
        }
    }
}
