//! Running peer programs as child processes with timeouts, and parsing perftest's
//! result rows: what the interop tests and the benchmark need.

use std::io::Read;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What a finished (or killed) child left.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Its exit status; `None` when it was killed for timing out.
    pub status: Option<ExitStatus>,
    /// Everything it wrote to stdout.
    pub stdout: String,
    /// Everything it wrote to stderr.
    pub stderr: String,
}

impl Outcome {
    /// True when it exited with status 0.
    pub fn ok(&self) -> bool {
        self.status.is_some_and(|s| s.success())
    }
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(s) => writeln!(f, "status: {s}")?,
            None => writeln!(f, "status: killed after timing out")?,
        }
        writeln!(f, "stdout:\n{}", self.stdout)?;
        write!(f, "stderr:\n{}", self.stderr)
    }
}

/// A running child whose output is collected by two threads.
pub struct Running {
    child: Child,
    out: Option<JoinHandle<String>>,
    err: Option<JoinHandle<String>>,
}

fn collect(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    })
}

/// Starts `program args...` with stdin closed and stdout/stderr captured.
pub fn spawn(program: &str, args: &[String]) -> std::io::Result<Running> {
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let out = child.stdout.take().map(collect);
    let err = child.stderr.take().map(collect);
    Ok(Running { child, out, err })
}

impl Running {
    /// True while the child runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits at most `timeout`, killing the child if it is still running then.
    pub fn wait(mut self, timeout: Duration) -> Outcome {
        let deadline = Instant::now() + timeout;
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                    break None;
                }
            }
        };
        let stdout = self.out.take().map(|h| h.join().unwrap_or_default());
        let stderr = self.err.take().map(|h| h.join().unwrap_or_default());
        Outcome {
            status,
            stdout: stdout.unwrap_or_default(),
            stderr: stderr.unwrap_or_default(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Starts `program` with `args` as a server listening on TCP `port`, connects to it
/// as a peer would and sends `bytes`, then returns how the server ended (killed after
/// `timeout`): for tests that feed a server a malformed out-of-band message.
pub fn feed_server(
    program: &str,
    args: &[String],
    port: u16,
    bytes: &[u8],
    timeout: Duration,
) -> Outcome {
    use std::io::Write;
    let srv = spawn_listening(program, args, port);
    let sent = std::net::TcpStream::connect(("127.0.0.1", port)).and_then(|mut s| {
        s.write_all(bytes)?;
        Ok(s)
    });
    let out = srv.wait(timeout);
    assert!(
        sent.is_ok(),
        "cannot send to {program} on port {port}: {sent:?}\n{out}"
    );
    out
}

/// Starts a server (`program args...`, as [`spawn`]) and waits up to 15 s for it
/// to listen on TCP `port` (or to end); panics if it cannot start.
pub fn spawn_listening(program: &str, args: &[String], port: u16) -> Running {
    let mut srv = spawn(program, args).unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    let start = std::time::Instant::now();
    while !listening(port) && start.elapsed() < Duration::from_secs(15) && srv.running() {
        std::thread::sleep(Duration::from_millis(50));
    }
    srv
}

/// True when some socket listens on TCP `port` (from `/proc/net/tcp` and `tcp6`),
/// checked without connecting (a probe connection would be taken for the client).
pub fn listening(port: u16) -> bool {
    let needle = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|path| {
        std::fs::read_to_string(path).is_ok_and(|text| {
            text.lines().skip(1).any(|line| {
                let cols: Vec<&str> = line.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&needle) && cols[3] == "0A"
            })
        })
    })
}

/// True when an RDMA CM id listens on `port` (`rdma resource show cm_id`, iproute2's
/// `rdma` tool, lists ids in state LISTEN with their source address), checked without
/// connecting: a perftest `-R` server takes the first connection for its client.
pub fn cm_listening(port: u16) -> bool {
    let Ok(out) = std::process::Command::new("rdma")
        .args(["resource", "show", "cm_id"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    else {
        return false;
    };
    cm_listens_in(&String::from_utf8_lossy(&out.stdout), port)
}

/// Whether `rdma resource show cm_id` output lists a listener on `port`.
pub fn cm_listens_in(text: &str, port: u16) -> bool {
    let suffix = format!(":{port}");
    text.lines().any(|line| {
        let words: Vec<&str> = line.split_whitespace().collect();
        let listens = words.windows(2).any(|w| w == ["state", "LISTEN"]);
        let on_port = words
            .windows(2)
            .any(|w| w[0] == "src-addr" && w[1].ends_with(&suffix));
        listens && on_port
    })
}

/// (server, client) programs of an interop run: the C tool `c_tool` on one side and
/// its Rust port `ours` on the other.
pub fn server_and_client<'a>(
    c_tool: &'a str,
    ours: &'a str,
    rust_is_client: bool,
) -> (&'a str, &'a str) {
    if rust_is_client {
        (c_tool, ours)
    } else {
        (ours, c_tool)
    }
}

/// Runs a server and then a client (once the server listens on TCP `port`), each with
/// `timeout`; both are killed if they overrun. Returns (server, client).
pub fn run_pair(
    server: (&str, Vec<String>),
    client: (&str, Vec<String>),
    port: u16,
    timeout: Duration,
) -> (Outcome, Outcome) {
    run_pair_when(server, client, || listening(port), timeout)
}

/// As [`run_pair`], with `ready` telling when the server is ready for its client
/// (e.g. [`cm_listening`] for perftest's `-R`); the client starts anyway after 15 s.
///
/// A C perftest tool checks its clock before it reports, and under emulation that
/// check sometimes fails ("Correlation coefficient r^2: ... < 0.9", then "Can't
/// produce a report"), whatever the other side did. Only then is the pair run again,
/// up to three times in all.
pub fn run_pair_when(
    server: (&str, Vec<String>),
    client: (&str, Vec<String>),
    ready: impl Fn() -> bool,
    timeout: Duration,
) -> (Outcome, Outcome) {
    let mut attempt = 1;
    loop {
        let (s, c) = run_pair_once(server.clone(), client.clone(), &ready, timeout);
        if attempt == 3 || !(clock_check_failed(&s) || clock_check_failed(&c)) {
            return (s, c);
        }
        eprintln!("perftest refused to report (its clock check failed): running the pair again");
        attempt += 1;
    }
}

/// True when a C perftest tool stopped because its clock check failed.
pub fn clock_check_failed(o: &Outcome) -> bool {
    o.stderr.contains("Correlation coefficient") && o.stderr.contains("Can't produce a report")
}

fn run_pair_once(
    server: (&str, Vec<String>),
    client: (&str, Vec<String>),
    ready: &impl Fn() -> bool,
    timeout: Duration,
) -> (Outcome, Outcome) {
    let failed = |what: &str, e: std::io::Error| Outcome {
        status: None,
        stdout: String::new(),
        stderr: format!("could not start {what}: {e}"),
    };
    let mut srv = match spawn(server.0, &server.1) {
        Ok(s) => s,
        Err(e) => {
            return (
                failed(server.0, e),
                failed("client (server failed)", std::io::Error::other("skipped")),
            )
        }
    };
    let start = Instant::now();
    while !ready() && srv.running() && start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let cli = match spawn(client.0, &client.1) {
        Ok(c) => c.wait(timeout),
        Err(e) => failed(client.0, e),
    };
    let srv = srv.wait(if cli.ok() {
        timeout
    } else {
        Duration::from_secs(5)
    });
    (srv, cli)
}

/// The numbers of the first row after a header containing `header_word`.
pub fn row_after(text: &str, header_word: &str) -> Option<Vec<f64>> {
    let mut lines = text.lines();
    lines.find(|l| l.contains(header_word))?;
    let row = lines.find(|l| !l.trim().is_empty())?;
    row.split_whitespace().map(|w| w.parse().ok()).collect()
}

/// The numbers of every row after a header containing `header_word`, up to the next
/// dashed line (the rows of `-a`, one per size).
pub fn rows_after(text: &str, header_word: &str) -> Vec<Vec<f64>> {
    let mut lines = text.lines();
    if lines.find(|l| l.contains(header_word)).is_none() {
        return Vec::new();
    }
    lines
        .take_while(|l| !l.starts_with("---"))
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().map(|w| w.parse().ok()).collect())
        .collect()
}

/// A bandwidth row: bytes, iterations, peak, average, message rate.
pub fn bw_row(text: &str) -> Option<[f64; 5]> {
    let v = row_after(text, "BW average")?;
    v.try_into().ok()
}

/// A latency row: bytes, iterations, min, max, typical, avg, stdev, 99%, 99.9%.
pub fn lat_row(text: &str) -> Option<[f64; 9]> {
    let v = row_after(text, "t_typical")?;
    v.try_into().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_perftests_clock_refusal_is_run_again() {
        let out = |stderr: &str| Outcome {
            status: None,
            stdout: String::new(),
            stderr: stderr.into(),
        };
        assert!(clock_check_failed(&out(
            "Correlation coefficient r^2: 0.872753 < 0.9\nCan't produce a report\n"
        )));
        assert!(!clock_check_failed(&out(
            " the peer closed the rdma_cm link: connection reset\n"
        )));
        assert!(!clock_check_failed(&out("Can't produce a report\n")));
    }

    #[test]
    fn parses_perftest_rows() {
        let bw = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]\n 65536      200              58.85              55.40  \t\t   0.000886\n";
        assert_eq!(bw_row(bw), Some([65536.0, 200.0, 58.85, 55.40, 0.000886]));
        let lat = " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] \n 2       200          10.72          155.75       11.26    \t       13.48       \t9.72   \t\t102.48  \t\t155.75 \n";
        assert_eq!(lat_row(lat).unwrap()[4], 11.26);
        assert_eq!(bw_row("nothing"), None);
        let all = format!("{bw} 131072     200              58.85              55.40  \t\t   0.000443\n---\n 1 2 3\n");
        let rows = rows_after(&all, "BW average");
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1][0], 131072.0);
        assert!(rows_after("nothing", "BW average").is_empty());
    }

    #[test]
    fn finds_rdma_cm_listeners() {
        let text = "link rxe0/- cm-idn 0 state LISTEN ps TCP pid 139 comm ib_write_bw src-addr 0.0.0.0:18515 \n\
                    link rxe0/1 cm-idn 1 state CONNECT ps TCP pid 140 comm ib_write_bw src-addr 198.18.0.1:18516 dst-addr 198.18.0.1:40000\n";
        assert!(cm_listens_in(text, 18515));
        assert!(!cm_listens_in(text, 18516), "connected, not listening");
        assert!(!cm_listens_in(text, 1851));
        assert!(!cm_listens_in("", 18515));
    }

    #[test]
    fn a_timed_out_child_is_killed() {
        let r = spawn("sleep", &["5".to_string()]).unwrap();
        let o = r.wait(Duration::from_millis(100));
        assert!(o.status.is_none());
    }
}
