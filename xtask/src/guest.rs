//! Booting the Soft-RoCE guest in QEMU and running a shell script in it.
//!
//! The guest shares the host's root read-only (9p tag `host`), the workspace's
//! `target/` writable at the same path (tag `target`) and a per-run scratch
//! directory as `/tmp` (tag `scratch`). Its `/init` (see [`crate::initramfs`])
//! brings up `rxe0` on `dummy0`, then runs, chrooted into the host root, a
//! script this module writes under `target/vm/run/`. That script and `/init`
//! report back through marker lines on the serial console,
//! `@@XTASK-<nonce>:<KEY>=<VALUE>@@`, which the host reads from QEMU's stdout:
//! `START` (the command begins), `EXIT` (its status), `SETUP-FAILED`, and any
//! keys the caller's script uses.

use std::collections::VecDeque;
use std::fs;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use crate::error::{Context, Error, Result};
use crate::hosts::{HostNet, WIRE_FD};
use crate::initramfs::GUEST_IP;
use crate::kernel::Kernel;
use crate::process::{describe, sh_quote};
use crate::step;
use crate::trouble::KernelTrouble;
use crate::workspace::Workspace;
use crate::GuestOptions;

/// Number of virtual CPUs. TCG only: KVM guests hang in firmware on this project's hosts.
pub const CPUS: u32 = 2;

/// Number of virtual CPUs of each of two hosts: the two share this machine's two cores.
pub const HOST_CPUS: u32 = 1;

/// The RDMA device the guest creates.
pub const GUEST_DEVICE: &str = "rxe0";

/// The GID index of the RoCE v2 IPv4 address on `rxe0` (index 0 is the IPv6 link-local one).
pub const GUEST_GID_INDEX: &str = "1";

/// Environment variable: when set to 1, show the whole boot log, not only the command's output.
pub const VERBOSE_ENV: &str = "XTASK_VM_VERBOSE";

/// QEMU options that never change: no default devices, no display or
/// monitor, the serial console on stdio, exit instead of rebooting.
#[rustfmt::skip]
const QEMU_FIXED_ARGS: &[&str] = &[
    "-nodefaults", "-no-user-config",
    "-display", "none",
    "-vga", "none",
    "-monitor", "none",
    "-serial", "stdio",
    "-no-reboot",
];

/// The guest's clock: the time-stamp counter, as on hardware. Under TCG the kernel's
/// boot-time check calls the vCPUs' counters unsynchronized and falls back to the
/// emulated HPET, whose every reading is a system call and a device access (2.5 µs
/// against 0.2 µs, measured in the guest). The counters are in step: a ping-pong
/// between two pinned threads bounded their offset to ±50 ns. See docs/softroce.md.
const CLOCK_ARGS: &str = "tsc=reliable";

/// The single guest's network: no NIC at all (one of two hosts has its wire instead).
const QEMU_NO_NIC: &[&str] = &["-nic", "none"];

/// How many recent console lines are kept to explain a failure.
const TAIL_LINES: usize = 40;

/// How long QEMU may take to power off after the command finished.
const POWEROFF_GRACE: Duration = Duration::from_secs(30);

/// What the guest needs to boot.
#[derive(Debug, Clone)]
pub struct Assets {
    /// The kernel and its modules.
    pub kernel: Kernel,
    /// The initramfs archive.
    pub initramfs: PathBuf,
}

/// A marker found in a console line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker<'a> {
    /// Output before the marker on the same line (a command's last line without a newline).
    pub before: &'a str,
    /// The marker's key, e.g. `EXIT`.
    pub key: &'a str,
    /// The marker's value, e.g. `0`.
    pub value: &'a str,
}

/// Finds the marker `@@XTASK-<nonce>:<KEY>=<VALUE>@@` in `line`.
pub fn parse_marker<'a>(line: &'a str, nonce: &str) -> Option<Marker<'a>> {
    let open = format!("@@XTASK-{nonce}:");
    let start = line.find(&open)?;
    let rest = &line[start + open.len()..];
    let end = rest.find("@@")?;
    let (key, value) = rest[..end].split_once('=')?;
    if key.is_empty()
        || !key
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b == b'-' || b == b'_')
    {
        return None;
    }
    Some(Marker {
        before: &line[..start],
        key,
        value,
    })
}

/// A random hex string, different for every run.
fn new_nonce() -> String {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("{:016x}", h.finish())
}

/// One guest run: its marker nonce and its directory `target/vm/run/<pid>/`
/// (the script and the guest's `/tmp`), removed when dropped. One of two hosts
/// also has its place on the wire, and its directory is below the pair's.
#[derive(Debug)]
pub struct GuestRun {
    ws: Workspace,
    nonce: String,
    dir: PathBuf,
    net: Option<HostNet>,
}

/// This process's run directory, `target/vm/run/<pid>/`, created empty after
/// removing those of runs whose process is gone.
pub fn fresh_run_dir(ws: &Workspace) -> Result<PathBuf> {
    let runs = ws.vm_dir.join("run");
    if let Ok(entries) = fs::read_dir(&runs) {
        for e in entries.flatten() {
            let name = e.file_name();
            let pid = name.to_str().and_then(|n| n.parse::<u32>().ok());
            if pid.is_some_and(|pid| !Path::new(&format!("/proc/{pid}")).exists()) {
                let _ = fs::remove_dir_all(e.path());
            }
        }
    }
    let dir = runs.join(std::process::id().to_string());
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).context(format!("creating {}", dir.display()))?;
    Ok(dir)
}

impl GuestRun {
    /// Creates the run directory, first removing those of runs whose process is gone.
    pub fn new(ws: &Workspace) -> Result<Self> {
        let dir = fresh_run_dir(ws)?;
        Self::in_dir(ws, dir, None)
    }

    /// A run of one of two hosts, in `dir` (inside the pair's run directory).
    pub fn for_host(ws: &Workspace, dir: PathBuf, net: HostNet) -> Result<Self> {
        Self::in_dir(ws, dir, Some(net))
    }

    fn in_dir(ws: &Workspace, dir: PathBuf, net: Option<HostNet>) -> Result<Self> {
        let tmp = dir.join("tmp");
        fs::create_dir_all(&tmp).context(format!("creating {}", tmp.display()))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777))
            .context(format!("setting the mode of {}", tmp.display()))?;
        Ok(GuestRun {
            ws: ws.clone(),
            nonce: new_nonce(),
            dir,
            net,
        })
    }

    /// `host a: ` for one of two hosts, else nothing: starts its progress lines.
    fn who(&self) -> String {
        self.net
            .as_ref()
            .map(|n| format!("host {}: ", n.host.name()))
            .unwrap_or_default()
    }

    /// Prints a line of the command's output, after `a| ` for one of two hosts.
    fn show(&self, line: &str) {
        match &self.net {
            Some(n) => show(&format!("{}| {line}", n.host.name())),
            None => show(line),
        }
    }

    /// The nonce this run's markers carry.
    #[cfg(test)]
    pub fn nonce(&self) -> &str {
        &self.nonce
    }

    /// A shell command that reports `KEY=value` to the host; `value` is
    /// inserted inside double quotes, so `$var` expands.
    pub fn marker(&self, key: &str, value: &str) -> String {
        format!("echo \"@@XTASK-{}:{key}={value}@@\"", self.nonce)
    }

    /// The script the guest runs in the host root: environment, cwd, then `body`
    /// in a subshell with stdin from /dev/null, framed by START and EXIT markers.
    pub fn script(&self, body: &str) -> String {
        let root = sh_quote(&self.ws.root.to_string_lossy());
        let fail = self.marker("SETUP-FAILED", "1");
        // One of two hosts: its own address, the peer's, and a barrier before START.
        let (ip, env, barrier, status, after) = match &self.net {
            None => (GUEST_IP, String::new(), String::new(), "$?", String::new()),
            Some(n) => (n.host.ip(), n.env(), n.barrier(&fail), "$st", n.after()),
        };
        let st = if self.net.is_some() { "st=$?\n" } else { "" };
        format!(
            "# Written by `cargo xtask` for one guest run (xtask/src/guest.rs).\n\
             export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n\
             export HOME=/tmp\n\
             export RDMA_DEVICE={GUEST_DEVICE} RDMA_GID_INDEX={GUEST_GID_INDEX} RDMA_IP={ip}\n\
             {env}\
             export RDMA_DEVICE_TESTS=1 RUST_BACKTRACE=1\n\
             unset xtask_script xtask_root xtask_target xtask_nonce xtask_net\n\
             ulimit -l unlimited || echo 'xtask-guest: ulimit -l unlimited failed'\n\
             cd {root} || {{ echo 'xtask-guest: cannot cd to the workspace root'; {fail}; exit 1; }}\n\
             {barrier}\
             {start}\n\
             (\n{body}\n) </dev/null\n\
             {st}{after}{exit}\n",
            start = self.marker("START", "1"),
            exit = self.marker("EXIT", status),
        )
    }

    /// Boots a guest, runs `body` (shell code, cwd = workspace root) and waits
    /// for it, echoing its output live on stdout; returns the body's exit
    /// status. `on_marker` sees every marker other than START, EXIT,
    /// SETUP-FAILED and SCRIPT-ENDED. Fails on timeout, on a guest setup
    /// failure and when the guest ends without an exit status.
    pub fn run(
        self,
        assets: &Assets,
        opts: &GuestOptions,
        body: &str,
        on_marker: &mut dyn FnMut(&str, &str),
    ) -> Result<i32> {
        self.run_tracked(assets, opts, body, on_marker, &Mutex::new(None))
    }

    /// As [`GuestRun::run`], keeping QEMU's process id in `pid` while QEMU may
    /// still be killed with it (until it is reaped), so that another thread can
    /// end this guest (see `crate::pair`).
    pub fn run_tracked(
        &self,
        assets: &Assets,
        opts: &GuestOptions,
        body: &str,
        on_marker: &mut dyn FnMut(&str, &str),
        pid: &Mutex<Option<u32>>,
    ) -> Result<i32> {
        let script_path = self.dir.join("run.sh");
        fs::write(&script_path, self.script(body))
            .context(format!("writing {}", script_path.display()))?;
        let mut cmd = self.qemu_command(assets, opts, &script_path)?;
        step!(
            "{}booting guest (TCG, {} vCPUs, {} MiB, timeout {} s)",
            self.who(),
            self.cpus(),
            opts.mem_mib,
            opts.timeout.as_secs()
        );
        let started = Instant::now();
        let mut child = cmd.spawn().map_err(|e| {
            Error::new(format!(
                "cannot start QEMU (`{}`): {e}\nis qemu-system-x86 installed?",
                describe(&cmd)
            ))
        })?;
        *pid.lock().unwrap_or_else(|e| e.into_inner()) = Some(child.id());
        let result = self.supervise(&mut child, started, opts, on_marker);
        // From here on nobody else may signal the process id: it is reaped below.
        *pid.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if result.is_err() {
            let _ = child.kill();
        }
        let _ = child.wait();
        result
    }

    fn cpus(&self) -> u32 {
        if self.net.is_some() {
            HOST_CPUS
        } else {
            CPUS
        }
    }

    fn qemu_command(&self, assets: &Assets, opts: &GuestOptions, script: &Path) -> Result<Command> {
        let script = cmdline_path(script)?;
        let target = cmdline_path(&self.ws.target)?;
        let root = cmdline_path(&self.ws.root)?;
        // QEMU option lists are comma-separated; a comma in a value is doubled.
        let q = |p: &Path| p.to_string_lossy().replace(',', ",,");
        let mut append = format!(
            "console=ttyS0 quiet loglevel=3 panic=-1 rdinit=/init {CLOCK_ARGS} \
             xtask_script={script} xtask_root={root} xtask_target={target} xtask_nonce={}",
            self.nonce
        );
        let nic = match &self.net {
            None => QEMU_NO_NIC.iter().map(|s| s.to_string()).collect(),
            Some(n) => {
                append.push_str(&format!(" xtask_net={}", n.host.ip()));
                n.qemu_args()
            }
        };
        let mut cmd = Command::new("qemu-system-x86_64");
        cmd.args([
            "-accel",
            "tcg",
            "-cpu",
            "max",
            "-smp",
            &self.cpus().to_string(),
        ])
        .args(["-m", &opts.mem_mib.to_string()])
        .args(QEMU_FIXED_ARGS)
        .args(nic)
        .arg("-kernel")
        .arg(&assets.kernel.vmlinuz)
        .arg("-initrd")
        .arg(&assets.initramfs)
        .args(["-append", &append])
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=host,security_model=none,multidevs=remap,readonly=on")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=target,security_model=none,multidevs=remap",
            q(&self.ws.target)
        ))
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=scratch,security_model=none,multidevs=remap",
            q(&self.dir.join("tmp"))
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        die_with_us(&mut cmd, self.net.as_ref().map(|n| n.wire_fd));
        Ok(cmd)
    }

    fn supervise(
        &self,
        child: &mut Child,
        started: Instant,
        opts: &GuestOptions,
        on_marker: &mut dyn FnMut(&str, &str),
    ) -> Result<i32> {
        let verbose = std::env::var(VERBOSE_ENV).is_ok_and(|v| v == "1");
        let (tx, rx) = mpsc::channel::<Line>();
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let tx2 = tx.clone();
        thread::spawn(move || forward_lines(stdout, tx, Line::Console));
        thread::spawn(move || forward_lines(stderr, tx2, Line::Qemu));

        let deadline = started + opts.timeout;
        let mut p = Progress::default();
        loop {
            let limit = match p.exit_seen_at {
                Some(t) => deadline.min(t + POWEROFF_GRACE),
                None => deadline,
            };
            let now = Instant::now();
            if now >= limit {
                break;
            }
            let text = match rx.recv_timeout(limit - now) {
                Ok(Line::Console(text)) => text,
                Ok(Line::Qemu(text)) => {
                    eprintln!("{}qemu: {text}", self.who());
                    p.push_tail(format!("qemu: {text}"));
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Timeout) => break,
                // Both pipes closed: QEMU has exited.
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return p.finish(started.elapsed(), &self.who())
                }
            };
            self.on_console(&mut p, text, started, verbose, on_marker);
        }
        // Out of time (or QEMU did not power off after the command ended).
        let _ = child.kill();
        self.out_of_time(&p, started, opts)
    }

    /// One line of the guest's console: a marker updates `p` (or goes to
    /// `on_marker`), anything else is shown while the command runs.
    fn on_console(
        &self,
        p: &mut Progress,
        text: String,
        started: Instant,
        verbose: bool,
        on_marker: &mut dyn FnMut(&str, &str),
    ) {
        p.push_tail(text.clone());
        p.kernel.see(&text);
        let running = p.boot.is_some() && p.status.is_none();
        let Some(m) = parse_marker(&text, &self.nonce) else {
            if running {
                self.show(&text);
            } else if verbose || (p.boot.is_none() && text.starts_with("xtask-guest:")) {
                eprintln!("{}{text}", self.who());
            }
            return;
        };
        if running && !m.before.is_empty() {
            self.show(m.before);
        }
        match m.key {
            "START" => {
                let t = started.elapsed();
                p.boot = Some(t);
                step!(
                    "{}guest booted in {:.1} s; running the command",
                    self.who(),
                    t.as_secs_f64()
                );
            }
            "EXIT" => {
                p.status = Some(m.value.trim().parse::<i32>().unwrap_or(1));
                p.exit_seen_at = Some(Instant::now());
            }
            "SETUP-FAILED" => p.setup_failed = true,
            "SCRIPT-ENDED" => p.script_ended = Some(m.value.to_string()),
            key => on_marker(key, m.value),
        }
    }

    /// The guest ran out of time: its exit status if the command ended (QEMU
    /// did not power off), else an error saying how far it got.
    fn out_of_time(&self, p: &Progress, started: Instant, opts: &GuestOptions) -> Result<i32> {
        if let Some(status) = p.status {
            step!(
                "{}QEMU did not power off after the command ended; killed it after {:.1} s",
                self.who(),
                started.elapsed().as_secs_f64()
            );
            return Ok(status);
        }
        let (phase, tail) = if p.boot.is_some() {
            ("the command was still running", String::new())
        } else {
            ("the guest had not finished booting", p.last_lines())
        };
        Err(Error::new(format!(
            "guest timed out after {} s ({phase}); QEMU was killed.\n\
             raise the limit with --timeout SECS{tail}{}",
            opts.timeout.as_secs(),
            p.kernel.report()
        )))
    }
}

/// `p` as it can go on the kernel command line: UTF-8, without whitespace or
/// quotes (the line is split on spaces).
fn cmdline_path(p: &Path) -> Result<String> {
    let s = p
        .to_str()
        .ok_or_else(|| Error::new(format!("path {} is not UTF-8", p.display())))?;
    if s.contains(char::is_whitespace) || s.contains('"') {
        return Err(Error::new(format!(
            "path `{s}` contains whitespace or quotes, which the kernel command line cannot carry; \
             move the workspace"
        )));
    }
    Ok(s.to_string())
}

/// Makes QEMU die with this process, whatever kills it, and on one of two hosts
/// hands it its end of the wire, `wire`, as [`WIRE_FD`].
fn die_with_us(cmd: &mut Command, wire: Option<i32>) {
    // SAFETY: the closure runs in the child between fork and exec and only
    // calls prctl, dup2 and fcntl, which are async-signal-safe and allocate
    // nothing; `wire` is an open descriptor of ours (the pair keeps it open
    // until QEMU has started).
    unsafe {
        cmd.pre_exec(move || {
            // QEMU must not outlive us, whatever kills us.
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // One of two hosts: its end of the wire becomes QEMU's WIRE_FD,
            // open across exec (dup2 clears close-on-exec on the copy).
            let inherited = match wire {
                None => 0,
                Some(fd) if fd == WIRE_FD => libc::fcntl(fd, libc::F_SETFD, 0),
                Some(fd) => libc::dup2(fd, WIRE_FD).min(0),
            };
            if inherited != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// What the host has learned from the guest console so far.
#[derive(Debug, Default)]
struct Progress {
    /// Boot time, once the command started.
    boot: Option<Duration>,
    /// The command's exit status, once reported.
    status: Option<i32>,
    /// When the exit status arrived.
    exit_seen_at: Option<Instant>,
    /// `/init` or the run script reported a setup failure.
    setup_failed: bool,
    /// The run script's own exit status, as `/init` saw it.
    script_ended: Option<String>,
    /// The most recent console lines.
    tail: VecDeque<String>,
    /// The kernel's panics, oopses and NIC watchdog lines, however early.
    kernel: KernelTrouble,
}

impl Progress {
    fn push_tail(&mut self, line: String) {
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    fn last_lines(&self) -> String {
        if self.tail.is_empty() {
            return "\n(the guest printed nothing)".to_string();
        }
        let mut s = format!("\nlast {} lines of the guest console:", self.tail.len());
        for l in &self.tail {
            s.push_str("\n  | ");
            s.push_str(l);
        }
        s
    }

    /// The result once QEMU has exited after `total`; `who` starts the progress line.
    fn finish(&self, total: Duration, who: &str) -> Result<i32> {
        if self.setup_failed {
            return Err(Error::new(format!(
                "guest setup failed (see the xtask-guest lines above){}",
                self.last_lines()
            )));
        }
        match (self.boot, self.status, &self.script_ended) {
            (Some(boot), Some(status), _) => {
                step!(
                    "{who}guest finished in {:.1} s (boot {:.1} s), exit status {status}",
                    total.as_secs_f64(),
                    boot.as_secs_f64()
                );
                Ok(status)
            }
            (_, _, Some(st)) => Err(Error::new(format!(
                "the guest could not run the command: its script ended with status {st} \
                 before reporting one{}",
                self.last_lines()
            ))),
            // While the command ran, every line was shown already.
            (boot, _, None) => Err(Error::new(format!(
                "guest ended without an exit status (kernel panic or crash?) after {:.1} s{}{}",
                total.as_secs_f64(),
                if boot.is_some() {
                    String::new()
                } else {
                    self.last_lines()
                },
                self.kernel.report()
            ))),
        }
    }
}

impl Drop for GuestRun {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A line of QEMU output.
enum Line {
    /// From the serial console (QEMU's stdout).
    Console(String),
    /// From QEMU itself (its stderr).
    Qemu(String),
}

/// Prints a line of the command's output on stdout, ignoring a closed stdout
/// (e.g. `cargo xtask vm -- cmd | head`) rather than panicking.
fn show(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
}

/// Sends each line of `r` (lossily decoded, without `\r`/`\n` at its end) until EOF.
fn forward_lines(r: impl Read, tx: mpsc::Sender<Line>, wrap: fn(String) -> Line) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let text = String::from_utf8_lossy(&buf);
                let text = text.trim_end_matches(['\n', '\r']).replace('\r', "");
                if tx.send(wrap(text)).is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers() {
        let n = "0123abcd";
        assert_eq!(
            parse_marker("@@XTASK-0123abcd:EXIT=3@@", n),
            Some(Marker {
                before: "",
                key: "EXIT",
                value: "3"
            })
        );
        assert_eq!(
            parse_marker("partial output@@XTASK-0123abcd:RESULT=2=101@@", n),
            Some(Marker {
                before: "partial output",
                key: "RESULT",
                value: "2=101"
            })
        );
        assert_eq!(
            parse_marker("@@XTASK-0123abcd:SETUP-FAILED=1@@", n).map(|m| m.key),
            Some("SETUP-FAILED")
        );
        assert_eq!(
            parse_marker("@@XTASK-ffff:EXIT=0@@", n),
            None,
            "other nonce"
        );
        assert_eq!(
            parse_marker("@@XTASK-0123abcd:EXIT=0", n),
            None,
            "unterminated"
        );
        assert_eq!(
            parse_marker("@@XTASK-0123abcd:exit=0@@", n),
            None,
            "lowercase key"
        );
        assert_eq!(parse_marker("hello", n), None);
    }

    #[test]
    fn script_frames_the_body() {
        let ws = Workspace::at(PathBuf::from("/w s"));
        let run = GuestRun {
            ws,
            nonce: "abc".into(),
            dir: PathBuf::from("/nonexistent"),
            net: None,
        };
        let s = run.script("true");
        assert!(s.contains("cd '/w s' ||"));
        assert!(s.contains("export RDMA_DEVICE=rxe0 RDMA_GID_INDEX=1 RDMA_IP=198.18.0.1\n"));
        assert!(s.contains("ulimit -l unlimited"));
        let start = s.find("echo \"@@XTASK-abc:START=1@@\"").unwrap();
        let body = s.find("(\ntrue\n) </dev/null\n").unwrap();
        let exit = s.find("echo \"@@XTASK-abc:EXIT=$?@@\"").unwrap();
        assert!(start < body && body < exit);
    }

    #[test]
    fn script_runs_and_reports() {
        // The script is plain POSIX sh: run it on the host with a harmless body.
        let ws = Workspace::locate().unwrap();
        let run = GuestRun {
            ws,
            nonce: "n1".into(),
            dir: PathBuf::from("/nonexistent"),
            net: None,
        };
        let script = run.script(&format!(
            "echo hi\n{}\nsh -c 'exit 7'",
            run.marker("RESULT", "0=$?")
        ));
        let out = Command::new("sh").arg("-c").arg(&script).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let lines: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with("xtask-guest:"))
            .collect();
        assert_eq!(
            lines,
            [
                "@@XTASK-n1:START=1@@",
                "hi",
                "@@XTASK-n1:RESULT=0=0@@",
                "@@XTASK-n1:EXIT=7@@"
            ]
        );
    }

    #[test]
    fn forwards_lines_without_carriage_returns() {
        let (tx, rx) = mpsc::channel();
        forward_lines(&b"one\r\ntwo\n\xffthree"[..], tx, Line::Console);
        let got: Vec<String> = rx
            .iter()
            .map(|l| match l {
                Line::Console(s) | Line::Qemu(s) => s,
            })
            .collect();
        assert_eq!(got, ["one", "two", "\u{fffd}three"]);
    }
}
