//! The C runs right around the KIARA runs of `cargo xtask bench`: each round
//! runs C `ib_read_bw` (64 KiB and 1 MiB) right before and right after the KIARA
//! one-way runs, and C `ib_send_lat -s 64` right before and right after the
//! one-client KIARA round trips, each with as many iterations as the KIARA run
//! has messages. The KIARA rows compare each round with the mean of the C runs
//! around it (the rounds' ratios, `stats::round_ratios`).
//!
//! Why: the emulated guest switches between two speeds within a run, every few
//! thousand messages (docs/softroce.md). Paired with the perftest phase's C run
//! of the same round index, minutes earlier, a KIARA run at one speed often met a
//! C run at the other, and the intervals spanned both.

use super::bench_plan::{self, Metric};

/// The two C runs of each kind in a round, in the order they run.
pub const AROUND: [&str; 2] = ["before", "after"];

/// The first port of the runs around the KIARA runs, above the guest's
/// ephemeral ports (32768-60999).
const FIRST_PORT: u64 = 61000;

/// Ports each round may use from [`FIRST_PORT`] on: see [`port`].
const PORTS_PER_ROUND: u64 = 16;

/// The port of round `round`'s run `k`: 0-1 `ib_send_lat` before and after, 2-5
/// `ib_read_bw` 64 KiB and 1 MiB, before and after, 6-7 the second echo and
/// sink servers of the round, 8 the spinning sink.
pub fn port(round: usize, k: u64) -> u64 {
    debug_assert!(k < PORTS_PER_ROUND);
    FIRST_PORT + PORTS_PER_ROUND * round as u64 + k
}

/// The C tools that run around KIARA runs, and how their figures read.
fn metric(tool: &str) -> Metric {
    if tool == "ib_send_lat" {
        Metric::Latency
    } else {
        Metric::Bandwidth
    }
}

/// The output file of round `round`'s C run of `tool` at `size`, `when` (one of
/// [`AROUND`]).
pub fn file(tool: &str, size: u64, when: &str, round: usize) -> String {
    format!("kiara-c-{tool}-{size}-{when}-{round}.txt")
}

/// Shell code for that run on `port`, of `iterations`: as many as the KIARA run
/// it goes with, so that both cover about the same stretch of the guest's time
/// (`pair`, from the perftest script; it waits for every job of the shell, so no
/// KIARA server may be running).
pub fn run(tool: &str, size: u64, iterations: u64, when: &str, round: usize, port: u64) -> String {
    format!(
        "pair {tool} \"{}\" {port} -x 1 -s {size} -n {iterations}\n",
        file(tool, size, when, round)
    )
}

/// Per round, the mean figure of the C runs of `tool` at `size` around the KIARA
/// runs (MiB/s for `ib_read_bw`, usec for `ib_send_lat`), NaN for a round where
/// neither gave one.
pub fn per_round(
    read: &dyn Fn(String) -> String,
    tool: &str,
    size: u64,
    rounds: usize,
) -> Vec<f64> {
    (0..rounds)
        .map(|r| {
            let figures: Vec<f64> = AROUND
                .iter()
                .filter_map(|when| {
                    bench_plan::figure(metric(tool), size, &read(file(tool, size, when, r)))
                })
                .filter(|v| v.is_finite() && *v > 0.0)
                .collect();
            figures.iter().sum::<f64>() / figures.len() as f64
        })
        .collect()
}

/// The outputs of every C run of `tool` at `size` around the KIARA runs.
pub fn outputs(
    read: &dyn Fn(String) -> String,
    tool: &str,
    size: u64,
    rounds: usize,
) -> Vec<String> {
    (0..rounds)
        .flat_map(|r| AROUND.iter().map(move |when| file(tool, size, when, r)))
        .map(read)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_have_their_own_ports_and_files() {
        assert_eq!(port(0, 0), 61000);
        assert_eq!(port(99, 15), 61000 + 16 * 99 + 15);
        let r = run("ib_read_bw", 65536, 1000, "after", 3, port(3, 3));
        assert_eq!(
            r,
            "pair ib_read_bw \"kiara-c-ib_read_bw-65536-after-3.txt\" 61051 -x 1 -s 65536 -n 1000\n"
        );
    }

    #[test]
    fn a_round_is_the_mean_of_the_runs_around_it() {
        let bw = |v: f64| {
            format!(" #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]\n 65536 300 {v} {v} 0.003\n")
        };
        let read = |name: String| match name.as_str() {
            "kiara-c-ib_read_bw-65536-before-0.txt" => bw(10.0),
            "kiara-c-ib_read_bw-65536-after-0.txt" => bw(20.0),
            "kiara-c-ib_read_bw-65536-after-1.txt" => bw(30.0),
            _ => String::new(),
        };
        let v = per_round(&read, "ib_read_bw", 65536, 3);
        assert_eq!(v[..2], [15.0, 30.0]);
        assert!(v[2].is_nan(), "no figure in round 2: {v:?}");
        assert_eq!(outputs(&read, "ib_read_bw", 65536, 2).len(), 4);
    }
}
