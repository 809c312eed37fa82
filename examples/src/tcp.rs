//! The out-of-band TCP connection of the C tools' ports, with their error messages: a
//! client retries for a while so that it may start before its server listens.

use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// Connects to `host:port`, retrying every 100 ms for up to `retry_for`.
pub fn connect(host: &str, port: u16, retry_for: Duration) -> Result<TcpStream, String> {
    let deadline = Instant::now() + retry_for;
    loop {
        match TcpStream::connect((host, port)) {
            Ok(s) => return Ok(s),
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("Couldn't connect to {host}:{port}: {e}")),
        }
    }
}

/// Listens on `port` (all addresses) and accepts one client.
pub fn accept(port: u16) -> Result<TcpStream, String> {
    let listener = TcpListener::bind(("0.0.0.0", port))
        .map_err(|e| format!("Couldn't listen to port {port}: {e}"))?;
    listener
        .accept()
        .map(|(s, _)| s)
        .map_err(|e| format!("accept() failed: {e}"))
}
