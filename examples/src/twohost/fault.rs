//! Faults on the wire between the two hosts, injected on this host's NIC, and
//! the counters that show what RC did about them (`docs/faults.md`).
//!
//! [`Netem`] puts a `netem` queueing discipline on `eth0` (what this host
//! sends) until it is dropped, then restores the FIFO the guest booted with;
//! [`RoceDropped`] likewise drops the RoCE packets this host sends, and only them;
//! [`link_down_for`] takes `eth0` down and up again; [`Counters`] reads rxe's
//! `hw_counters`.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

/// The NIC rxe0 sits on, in each of the two hosts.
pub const NIC: &str = "eth0";

/// The queueing discipline each host's `/init` puts on [`NIC`] (`xtask/src/initramfs.rs`).
pub const BASE_QDISC: &str = "pfifo limit 10000";

/// Where rxe0's port counters are.
const COUNTERS: &str = "/sys/class/infiniband/rxe0/ports/1/hw_counters";

/// Runs `program args`; panics with its output unless it succeeds.
fn run(program: &str, args: &[&str]) {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "`{program} {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Replaces the root queueing discipline of [`NIC`] with `qdisc` (e.g. `netem loss 1%`).
pub fn set_qdisc(qdisc: &str) {
    let mut args = vec!["qdisc", "replace", "dev", NIC, "root"];
    args.extend(qdisc.split_whitespace());
    run("tc", &args);
}

/// `netem` on this host's [`NIC`] while it lives.
#[derive(Debug)]
pub struct Netem {
    spec: String,
}

impl Netem {
    /// Applies `netem <spec>`, e.g. `loss 1%`, `delay 20ms 10ms`.
    pub fn apply(spec: &str) -> Netem {
        set_qdisc(&format!("netem {spec}"));
        Netem { spec: spec.into() }
    }

    /// The netem options it applied.
    pub fn spec(&self) -> &str {
        &self.spec
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        restore_base_qdisc();
    }
}

/// Puts [`BASE_QDISC`] back on [`NIC`]. No panic (it runs in drops, maybe while
/// unwinding): a failure here shows in the next case.
pub fn restore_base_qdisc() {
    let _ = Command::new("tc")
        .args(["qdisc", "replace", "dev", NIC, "root"])
        .args(BASE_QDISC.split_whitespace())
        .status();
}

/// Every RoCE v2 packet (UDP to port 4791) this host sends is dropped while it
/// lives, and nothing else: a `prio` queueing discipline on [`NIC`] with a `u32`
/// filter whose action drops. Dropping it restores the FIFO the guest booted with.
/// Over IPv4 only (the guests' RoCE GID, index 1): the filter reads the port at
/// the offset a 20-byte IPv4 header puts it.
#[derive(Debug)]
pub struct RoceDropped(());

impl RoceDropped {
    /// Starts dropping.
    pub fn apply() -> RoceDropped {
        set_qdisc("handle 1: prio");
        // Made at once: dropped from here, a failure restores the FIFO.
        let dropped = RoceDropped(());
        let filter = format!(
            "filter add dev {NIC} parent 1: protocol ip prio 1 u32 \
             match ip protocol 17 0xff match ip dport 4791 0xffff action drop"
        );
        run("tc", &filter.split_whitespace().collect::<Vec<_>>());
        dropped
    }
}

impl Drop for RoceDropped {
    fn drop(&mut self) {
        // The filter goes with the `prio` discipline it hangs on.
        restore_base_qdisc();
    }
}

/// Takes [`NIC`] down for `down`, brings it up again, and waits (up to 10 s)
/// until rxe0's port is active again; returns how long the port took.
pub fn link_down_for(down: Duration) -> Duration {
    link_down_until(down, || false).1
}

/// Takes [`NIC`] down until `done` holds (polled every 20 ms) or `limit`
/// passed, brings it up again and waits (up to 10 s) until rxe0's port is
/// active again. Returns how long the link was down and how long the port took
/// to come back.
pub fn link_down_until(limit: Duration, mut done: impl FnMut() -> bool) -> (Duration, Duration) {
    run("ip", &["link", "set", NIC, "down"]);
    let down = Instant::now();
    while down.elapsed() < limit && !done() {
        std::thread::sleep(Duration::from_millis(20));
    }
    let was_down = down.elapsed();
    run("ip", &["link", "set", NIC, "up"]);
    let up = Instant::now();
    let state = "/sys/class/infiniband/rxe0/ports/1/state";
    while !std::fs::read_to_string(state).is_ok_and(|s| s.contains("ACTIVE")) {
        assert!(
            up.elapsed() < Duration::from_secs(10),
            "rxe0 not ACTIVE 10 s after link up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (was_down, up.elapsed())
}

/// Deletes rxe0 and creates it again on [`NIC`], then waits (up to 10 s) for
/// its port to be active with its IPv4 GID at index 1; returns how long it took.
///
/// The link-down cases need it: when this host's kernel sends an RDMA CM message
/// while its link is down (the DREQ of a connection that just failed), rxe's
/// QP1 stays stuck afterwards and no RDMA CM connection to or from this host
/// succeeds again (`docs/faults.md`).
pub fn recreate_rxe() -> Duration {
    let start = Instant::now();
    run("rdma", &["link", "delete", "rxe0"]);
    run(
        "rdma",
        &["link", "add", "rxe0", "type", "rxe", "netdev", NIC],
    );
    let port = "/sys/class/infiniband/rxe0/ports/1";
    let ready = || {
        let state = std::fs::read_to_string(format!("{port}/state")).unwrap_or_default();
        let gid = std::fs::read_to_string(format!("{port}/gids/1")).unwrap_or_default();
        state.contains("ACTIVE") && gid.contains("ffff")
    };
    while !ready() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "rxe0 not ready 10 s after it was re-created"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    start.elapsed()
}

/// What rxe saw on this host since `before`, for a failure's message: how its
/// counters grew, and its latest lines in the kernel log. A queue pair can go to
/// the error state with no completion saying why (a responder's key check, for
/// one: only the requester is told); rxe logs the refused key and the move to
/// the error state as dynamic debug, which the guests' `/init` turns on.
pub fn what_rxe_saw(before: &Counters) -> String {
    let grown = Counters::read().since(before).summary();
    let log = match Command::new("dmesg").output() {
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| l.contains("rxe") || l.contains("qp#"))
                .collect();
            lines[lines.len().saturating_sub(20)..].join("\n")
        }
        Err(e) => format!("(dmesg failed: {e})"),
    };
    format!("rxe counters of this host grew by: {grown}\nkernel log (rxe, last 20 lines):\n{log}")
}

/// rxe0's port counters at one moment, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters(pub BTreeMap<String, u64>);

impl Counters {
    /// Reads every counter; panics if there are none (no rxe0).
    pub fn read() -> Counters {
        let dir = std::fs::read_dir(COUNTERS).unwrap_or_else(|e| panic!("reading {COUNTERS}: {e}"));
        let map: BTreeMap<String, u64> = dir
            .flatten()
            .filter_map(|e| {
                let v = std::fs::read_to_string(e.path())
                    .ok()?
                    .trim()
                    .parse()
                    .ok()?;
                Some((e.file_name().to_string_lossy().into_owned(), v))
            })
            .collect();
        assert!(map.contains_key("sent_pkts"), "no sent_pkts in {COUNTERS}");
        Counters(map)
    }

    /// How much each counter grew since `before`.
    pub fn since(&self, before: &Counters) -> Counters {
        let grown = self.0.iter().map(|(k, v)| {
            let old = before.0.get(k).copied().unwrap_or(0);
            (k.clone(), v.saturating_sub(old))
        });
        Counters(grown.collect())
    }

    /// One counter (0 if absent).
    pub fn get(&self, name: &str) -> u64 {
        self.0.get(name).copied().unwrap_or(0)
    }

    /// The counters that tell about retransmission and errors, `name=value` for
    /// those not zero.
    pub fn summary(&self) -> String {
        const SHOWN: [&str; 12] = [
            "sent_pkts",
            "rcvd_pkts",
            "completer_retry_err",
            "rcvd_seq_err",
            "out_of_seq_request",
            "duplicate_request",
            "retry_exceeded_err",
            "rcvd_rnr_err",
            "send_rnr_err",
            "retry_rnr_exceeded_err",
            "send_err",
            "link_downed",
        ];
        let shown = SHOWN.iter().filter(|n| self.get(n) > 0);
        shown
            .map(|n| format!("{n}={}", self.get(n)))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_grow_and_summarise() {
        let c = |pairs: &[(&str, u64)]| {
            Counters(pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect())
        };
        let before = c(&[("sent_pkts", 10), ("rcvd_seq_err", 2)]);
        let after = c(&[
            ("sent_pkts", 25),
            ("rcvd_seq_err", 2),
            ("completer_retry_err", 3),
        ]);
        let d = after.since(&before);
        assert_eq!(d.get("sent_pkts"), 15);
        assert_eq!(d.get("absent"), 0);
        assert_eq!(d.summary(), "sent_pkts=15 completer_retry_err=3");
    }
}
