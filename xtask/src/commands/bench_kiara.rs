//! The KIARA rows of `cargo xtask bench`, all in the same guest boot:
//! - one-way throughput for 64 KiB and 1 MiB messages against C `ib_read_bw`,
//!   with the default configuration and again with sink and sender spinning
//!   (`--busy-poll`, [`STREAM_BUSY_POLL_US`]);
//! - the 64-byte request/reply round trip against twice C `ib_send_lat`, and
//!   the distribution (p50, p99, p99.9) per size from 64 B (10,000 round trips)
//!   to 1 MiB with 1, 4 and 16 concurrent clients;
//! - what scoped remote access costs per 64 KiB read message
//!   (`kiara-scoped-cost`), next to the time a 64 KiB message takes one way;
//! - the aggregate throughput of 1, 4 and 16 clients against `ib_read_bw -q N`
//!   (`bench_aggregate`).
//!
//! This module writes one round's shell code; the C runs a row compares with
//! run in the same round, right around the KIARA runs ([`bench_adjacent`]).
//! How many rounds run is `bench_kiara_rounds`'; the table, the JSON and the
//! targets are `bench_kiara_report`'s.

use std::fmt::Write as _;

use super::bench_adjacent;
use super::bench_layouts::{Layouts, KIARA};
use crate::process::sh_quote;

/// Sizes of the one-way throughput runs.
pub const THROUGHPUT_SIZES: &[u64] = &[65536, 1 << 20];

/// Messages per one-way run and size: long enough (seconds) that the start of a
/// session (its first waits, the receiver's pool filling) does not dominate; the
/// client also warms up before it starts the clock.
fn messages(size: u64) -> u64 {
    if size <= 65536 {
        1000
    } else {
        100
    }
}

/// Concurrent clients of the latency runs.
pub const LATENCY_CLIENTS: &[u64] = &[1, 4, 16];

/// Sizes of the latency runs, each with the round trips it runs over all its
/// clients: 10,000 at 64 B (the count), fewer for an eager 4 KiB and
/// for read messages of 64 KiB and 1 MiB, whose round trips take milliseconds.
/// Only 64 B has targets; the others show how the distribution grows with size.
pub const LATENCY_SIZES: &[(u64, u64)] =
    &[(64, 10_000), (4096, 5_000), (65536, 1_000), (1 << 20, 100)];

/// `--busy-poll` (µs) of the spinning one-way runs, sink and sender alike: they
/// poll through the gaps between acknowledgements, as perftest's loops do. A
/// 64 KiB message takes 1.5-4 ms in the guest, above a quarter of the default
/// 2 ms, so with the default the sender sleeps between acknowledgements and is
/// woken through the poller (docs/performance.md, "The one-way stream,
/// spinning"). The same value as `bench_code`'s `KIARA_SPIN`, for another reason.
const STREAM_BUSY_POLL_US: u64 = 50_000;

/// Messages per `kiara-scoped-cost` run.
const SCOPED_MESSAGES: u32 = 1000;

/// Shell code that runs KIARA round `round` and leaves each output under `$raw`
/// (how many rounds run: `bench_kiara_rounds`). The round runs C right around
/// its one-way and one-client latency runs ([`bench_adjacent`]); a C run needs
/// no KIARA server running, so each KIARA server stops before one and another
/// serves what comes after it. The two kinds of one-way runs ([`Oneway`]) take
/// turns going first, round by round, so that neither always runs next to the
/// same C run. Round `r` runs the programs of layout `r % N` of the `N` in
/// `layouts`, client and server alike.
pub fn round_script(layouts: &Layouts, round: usize) -> String {
    let mut body = String::new();
    let [s, c, scoped] = KIARA.map(|name| sh_quote(&layouts.exe(name, round)));
    let (p1, p2) = (19000 + 2 * round as u64, 19001 + 2 * round as u64);
    let (echo2, sink2) = (
        bench_adjacent::port(round, 6),
        bench_adjacent::port(round, 7),
    );
    let mut oneways = [
        oneway_section(&s, &c, &Oneway::DEFAULT, p1, round),
        oneway_section(
            &s,
            &c,
            &Oneway::SPINNING,
            bench_adjacent::port(round, 8),
            round,
        ),
    ];
    if round % 2 == 1 {
        oneways.reverse();
    }
    let server = |args: &str, port: u64, out: &str| {
        format!(
            "{s} {args}-a 198.18.0.1 -p {port} > \"$raw/{out}-{round}.txt\" 2>&1 &\n\
             srv=$!\n\
             wait_listen {port}\n"
        )
    };
    let _ = writeln!(
        body,
        "echo '==> KIARA round {r}'\n\
         {c_read_before}\
         {first}\
         {second}\
         {c_read_after}\
         {sink_more}\
         {aggregate}\
         kill $srv 2>/dev/null; wait\n\
         {c_aggregate}\
         timeout 300 {scoped} -n {SCOPED_MESSAGES} > \"$raw/kiara-scoped-{round}.txt\" 2>&1 \
         || echo '  KIARA scoped access cost failed'\n\
         {c_lat_before}\
         {echo}\
         {one_client}\
         kill $srv 2>/dev/null; wait\n\
         {c_lat_after}\
         {echo_more}\
         {latency}\
         kill $srv 2>/dev/null; wait\n\
         echo {r} > \"$raw/kiara-rounds.txt\"",
        r = round + 1,
        c_read_before = c_reads(0, round),
        first = oneways[0],
        second = oneways[1],
        c_read_after = c_reads(1, round),
        sink_more = server("--sink ", sink2, "kiara-sink-more"),
        aggregate = super::bench_aggregate::kiara_script(&c, sink2, round),
        c_aggregate = super::bench_aggregate::c_script(round),
        c_lat_before = c_latency(0, round),
        echo = server("", p2, "kiara-echo"),
        one_client = latency_run(&c, p2, 1, LATENCY_SIZES[0], round),
        c_lat_after = c_latency(1, round),
        echo_more = server("", echo2, "kiara-echo-more"),
        latency = LATENCY_SIZES
            .iter()
            .flat_map(|&run| LATENCY_CLIENTS.iter().map(move |&n| (run, n)))
            .filter(|&(run, n)| (run, n) != (LATENCY_SIZES[0], 1))
            .map(|(run, n)| latency_run(&c, echo2, n, run, round))
            .collect::<String>(),
    );
    body
}

/// Shell code for round `round`'s one-way runs of `kind`, every size: a sink
/// (`server`) on `port`, the runs of `client` against it, and the sink stopped.
fn oneway_section(server: &str, client: &str, kind: &Oneway, port: u64, round: usize) -> String {
    let (file, opts) = (kind.file, kind.options());
    let out = format!("\"$raw/{file}-{round}.txt\"");
    let mut s = format!(
        "{server} --sink {opts}-a 198.18.0.1 -p {port} > \"$raw/{file}-sink-{round}.txt\" 2>&1 &\n\
         srv=$!\n\
         wait_listen {port}\n\
         : > {out}\n"
    );
    for &size in THROUGHPUT_SIZES {
        let _ = writeln!(
            s,
            "timeout 300 {client} 198.18.0.1 -p {port} {opts}--one-way -c 1 -n {n} -s {size} \
             >> {out} 2>&1 || echo '  KIARA one-way ({}, {size} B) failed'",
            kind.label,
            n = messages(size)
        );
    }
    s.push_str("kill $srv 2>/dev/null; wait\n");
    s
}

/// Shell code for one KIARA latency run of `clients` clients against the echo
/// server on `port`, at `(size, round trips)`. Every size of a number of clients
/// goes to one file; the first (64 B) starts it.
fn latency_run(
    client: &str,
    port: u64,
    clients: u64,
    (size, total): (u64, u64),
    round: usize,
) -> String {
    let to = if size == LATENCY_SIZES[0].0 {
        ">"
    } else {
        ">>"
    };
    format!(
        "timeout 600 {client} 198.18.0.1 -p {port} -c {clients} -n {per} -s {size} \
         {to} \"$raw/kiara-lat{clients}-{round}.txt\" 2>&1 || echo '  KIARA latency ({clients} clients, {size} B) failed'\n",
        per = total.div_ceil(clients)
    )
}

/// The C `ib_read_bw` runs of round `round` at the one-way sizes, `when`
/// (0: before the KIARA one-way runs, 1: after).
fn c_reads(when: usize, round: usize) -> String {
    THROUGHPUT_SIZES
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let port = bench_adjacent::port(round, 2 + 2 * i as u64 + when as u64);
            let around = bench_adjacent::AROUND[when];
            bench_adjacent::run("ib_read_bw", size, messages(size), around, round, port)
        })
        .collect()
}

/// The C `ib_send_lat -s 64` run of round `round`, `when` (0: before the
/// one-client KIARA latency run, 1: after).
fn c_latency(when: usize, round: usize) -> String {
    let port = bench_adjacent::port(round, when as u64);
    let (size, iterations) = LATENCY_SIZES[0];
    bench_adjacent::run(
        "ib_send_lat",
        size,
        iterations,
        bench_adjacent::AROUND[when],
        round,
        port,
    )
}

/// One kind of one-way run: its output files, its rows' label, and the
/// `--busy-poll` (µs) of its sink and sender (`None`: the default).
pub(super) struct Oneway {
    pub(super) file: &'static str,
    pub(super) label: &'static str,
    pub(super) busy_poll: Option<u64>,
}

impl Oneway {
    /// The default configuration.
    pub(super) const DEFAULT: Oneway = Oneway {
        file: "kiara-oneway",
        label: "one-way MiB/s",
        busy_poll: None,
    };
    /// Sink and sender at [`STREAM_BUSY_POLL_US`].
    pub(super) const SPINNING: Oneway = Oneway {
        file: "kiara-oneway-spin",
        label: "spinning MiB/s",
        busy_poll: Some(STREAM_BUSY_POLL_US),
    };

    /// The options sink and sender get, each followed by a space.
    pub(super) fn options(&self) -> String {
        self.busy_poll
            .map_or(String::new(), |us| format!("--busy-poll {us} "))
    }

    /// The JSON members that say what the row is.
    pub(super) fn json(&self) -> String {
        let busy_poll = self.busy_poll.map_or("null".into(), |us| us.to_string());
        format!("\"what\": \"one-way throughput\", \"busy_poll_us\": {busy_poll}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_runs_right_around_the_one_client_latency_run() {
        let layouts = Layouts::new("l", 2);
        let s = round_script(&layouts, 0) + &round_script(&layouts, 1);
        let round = &s[s.find("KIARA round 2").unwrap()..];
        // Each round runs its own layout, client and server alike.
        let first = &s[..s.find("KIARA round 2").unwrap()];
        assert!(first.contains("l/0/kiara-echo-server") && !first.contains("l/1/"));
        assert!(
            round.contains("l/1/kiara-echo-client 198.18.0.1 -p"),
            "{round}"
        );
        assert!(round.contains("l/1/kiara-scoped-cost") && !round.contains("l/0/"));
        let at = |what: &str| {
            round
                .find(what)
                .unwrap_or_else(|| panic!("{what}: {round}"))
        };
        let before = at(
            "pair ib_send_lat \"kiara-c-ib_send_lat-64-before-1.txt\" 61016 -x 1 -s 64 -n 10000",
        );
        let one = at("-c 1 -n 10000 -s 64");
        let after = at("pair ib_send_lat \"kiara-c-ib_send_lat-64-after-1.txt\" 61017 ");
        let four = at("-p 61022 -c 4 -n 2500 -s 64 > \"$raw/kiara-lat4-1.txt\"");
        // The other sizes append to the same files, after 64 B.
        let four_4k = at("-p 61022 -c 16 -n 313 -s 4096 >> \"$raw/kiara-lat16-1.txt\"");
        let one_1m = at("-p 61022 -c 1 -n 100 -s 1048576 >> \"$raw/kiara-lat1-1.txt\"");
        assert!(four < four_4k && four_4k < one_1m, "{round}");
        assert!(before < one && one < after && after < four, "{round}");
        // Each C run starts with no server of KIARA's left (`pair` waits for all jobs).
        assert!(round[one..after].contains("kill $srv"), "{round}");
        // The same around the one-way runs, at both sizes.
        let read_before = at("pair ib_read_bw \"kiara-c-ib_read_bw-65536-before-1.txt\" 61018 ");
        let big_before =
            at("\"kiara-c-ib_read_bw-1048576-before-1.txt\" 61020 -x 1 -s 1048576 -n 100");
        let sink = at("--sink -a 198.18.0.1 -p 19002 > \"$raw/kiara-oneway-sink-1.txt\"");
        let oneway = at("-p 19002 --one-way -c 1 -n 1000 -s 65536 >> \"$raw/kiara-oneway-1.txt\"");
        let read_after = at("\"kiara-c-ib_read_bw-65536-after-1.txt\" 61019 ");
        let big_after = at("\"kiara-c-ib_read_bw-1048576-after-1.txt\" 61021 ");
        let four_way = at("-p 61023 --one-way -c 4 ");
        // The spinning runs, on a sink of their own, between the same C runs;
        // first in this round (the second), after the default runs in the first.
        let spin_sink = at("--sink --busy-poll 50000 -a 198.18.0.1 -p 61024 ");
        let spin = at(
            "-p 61024 --busy-poll 50000 --one-way -c 1 -n 1000 -s 65536 \
                       >> \"$raw/kiara-oneway-spin-1.txt\"",
        );
        let spin_big = at("-p 61024 --busy-poll 50000 --one-way -c 1 -n 100 -s 1048576");
        assert!(
            read_before < big_before && big_before < spin_sink,
            "{round}"
        );
        assert!(
            spin_sink < spin && spin < spin_big && spin_big < sink,
            "{round}"
        );
        assert!(sink < oneway && oneway < read_after, "{round}");
        assert!(read_after < big_after && big_after < four_way, "{round}");
        // Each sink stops before the next server and before the C runs after.
        assert!(round[spin_big..sink].contains("kill $srv"), "{round}");
        assert!(round[oneway..read_after].contains("kill $srv"), "{round}");
        let first = &s[..s.find("KIARA round 2").unwrap()];
        let (default_0, spin_0) = (
            first.find("-p 19000 --one-way").unwrap(),
            first.find("--busy-poll 50000 --one-way").unwrap(),
        );
        assert!(default_0 < spin_0, "{first}");
        assert!(
            four < round.len() && !s.contains("19000 --one-way -c 4"),
            "{s}"
        );
    }
}
