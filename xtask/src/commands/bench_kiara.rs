//! The KIARA rows of `cargo xtask bench`: one-way throughput for 64 KiB and 1 MiB
//! messages against C `ib_read_bw` (target >= 0.8), and the 64-byte request/reply
//! round trip against twice C `ib_send_lat` (target <= 1.5), in the same guest boot.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

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

/// Shell code that runs `rounds` KIARA rounds and leaves each output under `$raw`.
pub fn script(server: &str, client: &str, rounds: usize) -> String {
    let (s, c) = (sh_quote(server), sh_quote(client));
    let mut body = String::new();
    for round in 0..rounds {
        let (p1, p2) = (19000 + 2 * round, 19001 + 2 * round);
        let _ = writeln!(
            body,
            "echo '==> KIARA round {r}'\n\
             {s} --sink -a 198.18.0.1 -p {p1} > \"$raw/kiara-sink-{round}.txt\" 2>&1 &\n\
             srv=$!\n\
             wait_listen {p1}\n\
             : > \"$raw/kiara-oneway-{round}.txt\"\n\
             {oneway}\
             kill $srv 2>/dev/null; wait\n\
             {s} -a 198.18.0.1 -p {p2} > \"$raw/kiara-echo-{round}.txt\" 2>&1 &\n\
             srv=$!\n\
             wait_listen {p2}\n\
             timeout 300 {c} 198.18.0.1 -p {p2} -c 1 -n 2000 -s 64 \
             > \"$raw/kiara-rtt-{round}.txt\" 2>&1 || echo '  KIARA round trip failed'\n\
             kill $srv 2>/dev/null; wait",
            r = round + 1,
            oneway = THROUGHPUT_SIZES
                .iter()
                .map(|&size| format!(
                    "timeout 300 {c} 198.18.0.1 -p {p1} --one-way -c 1 -n {n} -s {size} \
                     >> \"$raw/kiara-oneway-{round}.txt\" 2>&1 || echo '  KIARA one-way failed'\n",
                    n = messages(size)
                ))
                .collect::<String>(),
        );
    }
    body
}

/// The figure in the row of `size` (first column), column `col`, of a KIARA table.
fn figure(text: &str, size: u64, col: usize) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(size.to_string().as_str()))?
        .split_whitespace()
        .nth(col)?
        .parse()
        .ok()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    v.retain(|x| x.is_finite());
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The KIARA table and JSON array, from the raw outputs and the C medians
/// (`c_median(tool, size)`: MiB/s for `ib_read_bw`, usec for `ib_send_lat`).
pub fn report(
    raw: &Path,
    rounds: usize,
    c_median: &dyn Fn(&str, u64) -> Option<f64>,
) -> (String, String) {
    let read = |name: String| fs::read_to_string(raw.join(name)).unwrap_or_default();
    let mut table =
        String::from("KIARA                 size      KIARA          C  ratio   target\n");
    let mut json = Vec::new();
    let show = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
    for &size in THROUGHPUT_SIZES {
        // kiara-echo-client prints MB/s (10^6); perftest's "MB/sec" are MiB/s.
        let kiara = median(
            (0..rounds)
                .filter_map(|r| figure(&read(format!("kiara-oneway-{r}.txt")), size, 2))
                .map(|mb| mb * 1e6 / f64::from(1 << 20))
                .collect(),
        );
        let c = c_median("ib_read_bw", size);
        let ratio = kiara.zip(c).map(|(k, c)| k / c);
        let verdict = ratio.map_or("no data", |r| if r >= 0.8 { "ok" } else { "MISSED" });
        let _ = writeln!(
            table,
            "one-way MiB/s  {size:>11}  {:>9}  {:>9}  {:>5}  >= 0.8 vs ib_read_bw {verdict}",
            show(kiara),
            show(c),
            ratio.map_or("-".into(), |r| format!("{r:.3}")),
        );
        json.push(format!(
            "    {{\"what\": \"one-way throughput\", \"size\": {size}, \"unit\": \"MiB/s\", \
             \"kiara\": {}, \"c_ib_read_bw\": {}, \"ratio\": {}}}",
            kiara.map_or("null".into(), |v| v.to_string()),
            c.map_or("null".into(), |v| v.to_string()),
            ratio.map_or("null".into(), |v| v.to_string())
        ));
    }
    let rtt = median(
        (0..rounds)
            .filter_map(|r| figure(&read(format!("kiara-rtt-{r}.txt")), 64, 3))
            .collect(),
    );
    let c = c_median("ib_send_lat", 64).map(|t| 2.0 * t);
    let ratio = rtt.zip(c).map(|(k, c)| k / c);
    let verdict = ratio.map_or("no data", |r| if r <= 1.5 { "ok" } else { "MISSED" });
    let _ = writeln!(
        table,
        "round trip usec         64  {:>9}  {:>9}  {:>5}  <= 1.5 vs 2 x ib_send_lat {verdict}",
        show(rtt),
        show(c),
        ratio.map_or("-".into(), |r| format!("{r:.3}")),
    );
    json.push(format!(
        "    {{\"what\": \"request/reply round trip\", \"size\": 64, \"unit\": \"usec\", \
         \"kiara\": {}, \"c_2x_ib_send_lat\": {}, \"ratio\": {}}}",
        rtt.map_or("null".into(), |v| v.to_string()),
        c.map_or("null".into(), |v| v.to_string()),
        ratio.map_or("null".into(), |v| v.to_string())
    ));
    (table, format!("[\n{}\n  ]", json.join(",\n")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kiara_tables_are_parsed() {
        let oneway = "    #bytes    #msgs MB/s (one way)\n     65536      300          28.35\n   1048576      300          20.38\n";
        assert_eq!(figure(oneway, 65536, 2), Some(28.35));
        assert_eq!(figure(oneway, 1048576, 2), Some(20.38));
        let rtt = "    #bytes    #msgs  MB/s (echo)  rtt median us     rtt 99% us\n        64      200         0.05          144.9        51417.5\n";
        assert_eq!(figure(rtt, 64, 3), Some(144.9));
        assert_eq!(median(vec![3.0, f64::NAN, 1.0]), Some(2.0));
    }
}
