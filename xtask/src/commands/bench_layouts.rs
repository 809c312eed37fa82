//! The Rust programs the bench runs, linked in several layouts.
//!
//! Where the linker puts each function moved a KIARA round trip by 8% in the
//! Soft-RoCE guest (docs/performance.md, "The layouts"): every round that ran the
//! same binary would share that luck, and no number of rounds would show it. So
//! the bench links every Rust program it times `count` times: layout 0 is the
//! plain release build, layout `k` the same code with its text sections shuffled
//! by lld with seed `k` (`-Wl,--shuffle-sections=.text.*=k`). Round `r` runs
//! layout `r % count`, so the rounds' spread includes the differences between
//! these `count` links. The count is odd: rounds alternate which side runs
//! first, and with an even count each layout would always run on the same side
//! of that alternation.
//!
//! Each shuffled link is a `cargo rustc` of that one binary (about 12 s on two
//! cores; the libraries are not rebuilt), kept by cargo apart from the plain
//! build, so a second bench reuses it. The plain build runs last, so
//! `target/release` holds the plain binaries again afterwards (a bench stopped
//! while linking leaves shuffled ones there until the next `cargo build`).

use std::fs;
use std::path::PathBuf;

use crate::cargo;
use crate::error::{Context, Error, Result};
use crate::process::sh_quote;
use crate::stats;
use crate::step;
use crate::workspace::Workspace;

/// Layouts when `--layouts` is not given: as many as the default `--min-rounds`,
/// so that the first rounds run each layout once.
pub const DEFAULT: usize = 5;

/// The most `--layouts` accepts (each costs a link of every program).
pub const MOST: usize = 9;

/// Checks a `--layouts` count: odd (see the module's doc) and at most [`MOST`].
pub fn check_count(count: usize) -> Result<()> {
    if count % 2 == 1 && count <= MOST {
        return Ok(());
    }
    Err(Error::new(format!(
        "bench: --layouts must be odd and at most {MOST} (rounds alternate which side \
         runs first; an even count would tie each layout to one side), not {count}"
    )))
}

/// The KIARA programs, next to the perftest ports (`bench_plan::TOOLS`).
pub const KIARA: [&str; 3] = [
    "kiara-echo-server",
    "kiara-echo-client",
    "kiara-scoped-cost",
];

/// The programs, each in every layout, under `<dir>/<layout>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layouts {
    /// The directory, as the guest's script names it (relative to the workspace).
    dir: String,
    /// How many layouts.
    count: usize,
}

impl Layouts {
    /// The layouts under `dir` (as the guest's script names it), `count` of them.
    pub fn new(dir: impl Into<String>, count: usize) -> Layouts {
        Layouts {
            dir: dir.into(),
            count,
        }
    }

    /// The program `name` in the layout of round `round` (0-based).
    pub fn exe(&self, name: &str, round: usize) -> String {
        format!("{}/{}/{name}", self.dir, round % self.count)
    }

    /// The program `name` as one shell word for a script whose round is in the
    /// shell variable or parameter `round` (e.g. `1` for `$1`).
    pub fn exe_sh(&self, name: &str, round: &str) -> String {
        format!(
            "{}/$((${round} % {}))/{}",
            sh_quote(&self.dir),
            self.count,
            sh_quote(name)
        )
    }
}

/// The median of the rounds' ratios `num[r] / den[r]` over the rounds of each
/// layout, in layout order, by [`stats::round_ratios`]'s rule for which rounds
/// count; `None` for a layout with no such round.
pub fn by_layout(num: &[f64], den: &[f64], count: usize) -> Vec<Option<f64>> {
    let rounds_of =
        |v: &[f64], k: usize| -> Vec<f64> { v.iter().skip(k).step_by(count).copied().collect() };
    (0..count)
        .map(|k| stats::round_ratios(&rounds_of(num, k), &rounds_of(den, k)).map(|e| e.ratio))
        .collect()
}

/// The link argument that shuffles the text sections with `seed`. Seeds start
/// at 1: lld takes 0 as "a new random order every link", which no later bench
/// could reproduce.
fn shuffle_arg(seed: usize) -> String {
    format!("link-arg=-Wl,--shuffle-sections=.text.*={seed}")
}

/// Builds `names`, the programs the bench runs, in `count` layouts and copies
/// them under `target/bench/layouts`. Fails if two layouts of a program came
/// out the same (a linker that ignored the option would make the rotation a lie).
/// With no names (a control run, C against C) it builds and touches nothing.
pub fn build(ws: &Workspace, names: &[&str], count: usize) -> Result<Layouts> {
    let root = ws.target.join("bench").join("layouts");
    if names.is_empty() {
        return Ok(Layouts::new(ws.display(&root), count));
    }
    let _ = fs::remove_dir_all(&root);
    for seed in 1..count {
        step!(
            "linking layout {seed} of {count}: {} programs, text sections shuffled (lld)",
            names.len()
        );
        for name in names {
            let exe = link(ws, name, seed)?;
            copy(&exe, &root.join(seed.to_string()), name)?;
        }
    }
    step!("building the examples: cargo build --release -p examples --bins");
    let plain = cargo::build_artifacts(
        &ws.root,
        &["build", "--release", "-p", "examples", "--bins"],
    )
    .map_err(|e| Error::new(format!("building the examples failed: {e}")))?;
    for name in names {
        let exe = plain
            .iter()
            .filter(|a| a.is_bin() && a.target_name == *name)
            .find_map(|a| a.executable.clone())
            .ok_or_else(|| Error::new(format!("the examples package has no binary `{name}`")))?;
        copy(&exe, &root.join("0"), name)?;
    }
    check_distinct(&root, names, count)?;
    Ok(Layouts::new(ws.display(&root), count))
}

/// Links `name` with the text sections shuffled by `seed`; returns the executable.
fn link(ws: &Workspace, name: &str, seed: usize) -> Result<PathBuf> {
    let shuffle = shuffle_arg(seed);
    let args = [
        "rustc",
        "--release",
        "-p",
        "examples",
        "--bin",
        name,
        "--",
        "-C",
        &shuffle,
    ];
    let built = cargo::build_artifacts(&ws.root, &args).map_err(|e| {
        Error::new(format!(
            "linking `{name}` in a shuffled layout failed: {e}\n\
             the layouts need lld, Rust's default linker on x86_64 Linux since 1.90; \
             `--layouts 1` runs the plain build only"
        ))
    })?;
    built
        .into_iter()
        .filter(|a| a.is_bin() && a.target_name == name)
        .find_map(|a| a.executable)
        .ok_or_else(|| Error::new(format!("cargo built no binary `{name}`")))
}

/// Copies `exe` to `<dir>/<name>`.
fn copy(exe: &std::path::Path, dir: &std::path::Path, name: &str) -> Result<()> {
    fs::create_dir_all(dir).context(format!("creating {}", dir.display()))?;
    let to = dir.join(name);
    fs::copy(exe, &to).context(format!("copying {} to {}", exe.display(), to.display()))?;
    Ok(())
}

/// Fails unless every layout of every program differs from every other.
fn check_distinct(root: &std::path::Path, names: &[&str], count: usize) -> Result<()> {
    for name in names {
        let bytes = (0..count)
            .map(|k| {
                let p = root.join(k.to_string()).join(name);
                fs::read(&p).context(format!("reading {}", p.display()))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some((a, b)) = same_pair(&bytes) {
            return Err(Error::new(format!(
                "layouts {a} and {b} of `{name}` are the same binary: the linker ignored \
                 `-Wl,--shuffle-sections` (is it lld?); `--layouts 1` runs the plain build only"
            )));
        }
    }
    Ok(())
}

/// The first two equal items, by index.
fn same_pair(items: &[Vec<u8>]) -> Option<(usize, usize)> {
    (0..items.len())
        .flat_map(|a| (a + 1..items.len()).map(move |b| (a, b)))
        .find(|&(a, b)| items[a] == items[b])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_rotate_through_the_layouts() {
        let l = Layouts::new("target/bench/layouts", 3);
        assert_eq!(
            l.exe("ib_send_lat", 0),
            "target/bench/layouts/0/ib_send_lat"
        );
        assert_eq!(
            l.exe("ib_send_lat", 4),
            "target/bench/layouts/1/ib_send_lat"
        );
        let word = l.exe_sh("kiara-echo-client", "1");
        assert_eq!(word, "target/bench/layouts/$(($1 % 3))/kiara-echo-client");
        // The word expands as the guest's shell will expand it.
        let out = std::process::Command::new("sh")
            .args(["-c", &format!("set -- 5; echo {word}")])
            .output()
            .unwrap();
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "target/bench/layouts/2/kiara-echo-client"
        );
        assert_eq!(shuffle_arg(2), "link-arg=-Wl,--shuffle-sections=.text.*=2");
    }

    #[test]
    fn ratios_are_split_by_layout() {
        let num = [1.0, 2.0, 3.0, 1.2, f64::NAN, 3.4, 1.4, 5.0];
        let den = [1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.0];
        // Round 4 has no KIARA figure and round 7 no C one: both are left out.
        assert_eq!(by_layout(&num, &den, 3), [Some(1.2), Some(2.0), Some(3.2)]);
        assert_eq!(by_layout(&[f64::NAN], &[1.0], 1), [None]);
        // Rounds one side lacks (the longer list's tail) are left out, as is
        // a ratio no figure can be (it underflows to 0), by the row's own rule.
        let got = by_layout(&[2.0, 3.0, 4.0, 9.0], &[1.0, 1.0], 2);
        assert_eq!(got, [Some(2.0), Some(3.0)]);
        assert_eq!(by_layout(&[1e-300], &[1e300], 1), [None]);
        assert!(by_layout(&[], &[], 3).iter().all(Option::is_none));
    }

    #[test]
    fn counts_are_odd_and_bounded() {
        for ok in [1, 3, DEFAULT, MOST] {
            check_count(ok).unwrap();
        }
        for bad in [0, 2, 4, MOST + 1, MOST + 2] {
            let err = check_count(bad).unwrap_err().to_string();
            assert!(err.contains("odd"), "{err}");
        }
    }

    #[test]
    fn equal_layouts_are_found() {
        let v = |b: &[u8]| b.to_vec();
        assert_eq!(same_pair(&[v(b"a"), v(b"b"), v(b"c")]), None);
        assert_eq!(same_pair(&[v(b"a"), v(b"b"), v(b"a")]), Some((0, 2)));
        assert_eq!(same_pair(&[v(b"a")]), None);
    }
}
