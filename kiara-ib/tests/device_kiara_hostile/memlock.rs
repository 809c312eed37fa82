//! (o) A server whose memlock limit is below what its budgets let the peers pin:
//! a message it cannot register a buffer for is refused as busy, and no session
//! closes for it; a send of its own that the limit refuses fails alone.
//!
//! The server runs in a child process of this test binary with a 12 MiB memlock
//! limit and no `CAP_IPC_LOCK` (as `rdma-safe/tests/device_mr.rs` does); its
//! budgets are the defaults (1 GiB). Its callback answers each message with its
//! length and checksum, or with the reply it asks for. The clients run here,
//! with no limit.

use super::*;
use std::io::BufRead;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver};

/// `CAP_IPC_LOCK` from `<linux/capability.h>`.
const CAP_IPC_LOCK: libc::c_ulong = 14;
/// The server's memlock limit: room for an 8 MiB buffer and the sessions' slots
/// (under 1 MiB), not for a cached 8 MiB buffer beside a new 4 MiB one, and not
/// for a 16 MiB one.
const LIMIT: u64 = 12 << 20;
/// Marks the child process.
const CHILD: &str = "KIARA_MEMLOCK_CHILD";
/// How often the server's pool may let its cache go after a failed registration
/// (`pool::EVICT_EVERY`), with a margin.
const EVICT_EVERY: Duration = Duration::from_millis(1_200);
/// This test's name, for the child's command line.
const NAME: &str =
    "memlock::hostile_o_a_memlock_limit_below_the_budgets_refuses_and_closes_nothing";

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_o_a_memlock_limit_below_the_budgets_refuses_and_closes_nothing() {
    if std::env::var_os(CHILD).is_some() {
        return serve_until_stdin_closes();
    }
    let (mut child, stdin, lines) = start_server();
    let mut seen = Vec::new();
    let addr: SocketAddr = wait_line(&lines, "ADDR ", &mut seen).parse().unwrap();
    let client = Transport::new(Config::default());
    let a = client.connect(addr).unwrap();
    let b = client.connect(addr).unwrap();
    round_trip(&client, &a, 8 * MIB).expect("8 MiB fits the limit");
    round_trip(&client, &b, 64 * KIB).expect("the other session");
    // The server's pool keeps the 8 MiB buffer: a new 4 MiB one fits only once
    // the pool has let it go.
    round_trip(&client, &a, 4 * MIB).expect("4 MiB, once the cache is let go");
    let err = round_trip(&client, &a, 16 * MIB).expect_err("16 MiB is over the limit");
    assert!(err.is_busy(), "refused as busy: {err}");
    // The server's own send that the limit refuses fails, and only it: a 6 MiB
    // reply pins its 8 MiB buffer, and its window's view the 6 MiB again. The
    // view is registered at the bind: the descriptor's slot goes as a CREDIT
    // that withdraws the message, and the client's session counts it. The
    // buffer fits once the pool lets its cache go, which it does at most once a
    // second (`pool::EVICT_EVERY`): the 4 MiB message above was the last time.
    std::thread::sleep(EVICT_EVERY);
    let failed = ask_for(&client, &a, 6 * MIB);
    let text = String::from_utf8_lossy(failed.bytes());
    assert!(text.starts_with("send failed: "), "{text:.100}");
    assert!(text.contains("the message was not sent"), "{text}");
    assert!(text.contains("ulimit -l"), "{text}");
    let reply = ask_for(&client, &a, MIB);
    assert!(
        reply.bytes() == noise(MIB as u64, MIB),
        "the 1 MiB reply intact"
    );
    // Nothing closed: both sessions go on.
    round_trip(&client, &a, MIB).expect("the refused session goes on");
    round_trip(&client, &b, 64 * KIB).expect("the other session goes on");
    seen.extend(lines.try_iter());
    drop(stdin);
    let status = child.wait().unwrap();
    let rest: Vec<String> = lines.iter().collect();
    assert!(status.success(), "the server failed: {rest:?}");
    let log: Vec<&String> = seen
        .iter()
        .chain(&rest)
        .filter(|l| l.starts_with("LOG "))
        .collect();
    let warned = log.iter().any(|l| l.contains("memlock limit (12288 KiB)"));
    assert!(warned, "no memlock warning at the start: {log:?}");
    let refused: Vec<&&String> = log
        .iter()
        .filter(|l| l.contains("refused message"))
        .collect();
    assert_eq!(refused.len(), 1, "one refusal logged: {log:?}");
    assert!(refused[0].contains("16777216 bytes"), "{}", refused[0]);
    assert!(refused[0].contains("ulimit -l"), "{}", refused[0]);
    let closed = seen.iter().filter(|l| l.contains(" closed: ")).count();
    assert_eq!(closed, 0, "a session closed: {seen:?}");
    client.disconnect(a).unwrap();
    client.disconnect(b).unwrap();
}

/// Sends `len` bytes of noise on `session` and checks the server's answer (the
/// length and checksum it read); the send's error if it failed.
fn round_trip(client: &Transport, session: &Session, len: usize) -> Result<(), kiara_ib::Error> {
    let bytes = noise(len as u64, len);
    let expected = format!("{len} {}", checksum(&bytes));
    client.send(session, bytes, Linger::Timeout(STEP))?;
    let answer = client
        .recv(session, Linger::Timeout(STEP))
        .unwrap()
        .expect("an answer within STEP");
    assert_eq!(String::from_utf8_lossy(answer.bytes()), expected);
    Ok(())
}

/// Asks the server for a reply of `len` bytes of noise; its answer.
fn ask_for(client: &Transport, session: &Session, len: usize) -> Message {
    let ask = Message::new(vec![0u8; 8])
        .with_meta(len.to_string().as_bytes())
        .unwrap();
    client.send(session, ask, Linger::Timeout(STEP)).unwrap();
    client
        .recv(session, Linger::Timeout(STEP))
        .unwrap()
        .expect("an answer within STEP")
}

/// The child: a server that answers every message with its length and checksum
/// (the message is let go first, so its buffer is back in the pool), or, when
/// its metadata asks for N bytes, with N bytes of noise (or why that send
/// failed); it logs on stdout, and stops when its stdin closes.
fn serve_until_stdin_closes() {
    let log: Arc<dyn Fn(&str) + Send + Sync> = Arc::new(|line: &str| println!("LOG {line}"));
    let server = Transport::with_logger(Config::default(), log);
    server
        .register_callback(|msg, session, t| {
            let asked: Option<usize> = std::str::from_utf8(msg.meta())
                .ok()
                .and_then(|m| m.parse().ok());
            let answer = format!("{} {}", msg.len(), checksum(msg.bytes()));
            drop(msg);
            let answer = match asked {
                None => answer,
                Some(len) => match t.send(session, noise(len as u64, len), Linger::NoWait) {
                    Ok(handle) => {
                        // A callback may not wait: a thread tells the client if the
                        // send failed (its bytes are registered at the bind).
                        let (t, session) = (t.clone(), session.clone());
                        std::thread::spawn(move || {
                            if let Err(e) = handle.wait(Some(STEP)) {
                                let text = format!("send failed: {e}").into_bytes();
                                t.send(&session, text, Linger::Timeout(STEP)).unwrap();
                            }
                        });
                        return;
                    }
                    Err(e) => format!("send failed: {e}"),
                },
            };
            t.send(session, answer.into_bytes(), Linger::NoWait)
                .unwrap();
        })
        .unwrap();
    let addr = server.bind((server_ip().as_str(), 0)).unwrap();
    println!("ADDR {addr}");
    std::io::stdin().read_to_end(&mut Vec::new()).unwrap();
    server.unbind().unwrap();
}

/// Starts the child with the memlock limit: it, its stdin, and its stdout's lines.
fn start_server() -> (Child, ChildStdin, Receiver<String>) {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([NAME, "--exact", "--include-ignored", "--nocapture"])
        .env(CHILD, "1")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: LIMIT,
                rlim_max: LIMIT,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Root would pass the limit with CAP_IPC_LOCK: dropped from the bounding
            // set, the exec'd child has it in no set.
            libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
            Ok(())
        });
    }
    let mut child = cmd.spawn().unwrap();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            eprintln!("server: {line}");
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    (child, stdin, rx)
}

/// The rest of the first line that starts with `prefix`; the lines before it go
/// to `seen`.
fn wait_line(lines: &Receiver<String>, prefix: &str, seen: &mut Vec<String>) -> String {
    loop {
        let line = lines
            .recv_timeout(STEP)
            .unwrap_or_else(|_| panic!("no {prefix:?} line from the server: {seen:?}"));
        if let Some(rest) = line.strip_prefix(prefix) {
            return rest.to_string();
        }
        seen.push(line);
    }
}
