//! `cargo xtask`: project automation for the RDMA workspace.
//!
//! The host this project is developed on has no RDMA device and cannot load
//! Soft-RoCE, so everything that needs a device runs inside a QEMU guest that
//! boots Debian's kernel, loads `rdma_rxe` and shares the host's root file
//! system over 9p. See `docs/softroce.md` for the user's view.
//!
//! Commands:
//! - `cargo xtask vm [--hosts 2] [--timeout SECS] [--mem MIB] -- <command...>`
//! - `cargo xtask test [--no-vm | --two-hosts-only] [--timeout SECS] [--mem MIB]`
//! - `cargo xtask demo [--timeout SECS] [--mem MIB]`
//! - `cargo xtask bench [--timeout SECS] [--mem MIB] [bench options] | --plot-only JSON`
//! - `cargo xtask setup`
//! - `cargo xtask check`
//! - `cargo xtask bindings`

mod cargo;
mod commands;
mod cpio;
mod error;
mod guest;
mod hosts;
mod initramfs;
mod json;
mod kernel;
mod packages;
mod pair;
mod process;
mod stats;
mod trouble;
mod workspace;

use std::process::ExitCode;
use std::time::Duration;

pub use error::{Error, Result};

/// Prints one progress line, `xtask: ...`, on standard error.
///
/// Standard output is kept for the output of what runs in the guest, so that
/// `cargo xtask vm -- cmd > file` captures only the command's output.
#[macro_export]
macro_rules! step {
    ($($arg:tt)*) => {
        eprintln!("xtask: {}", format_args!($($arg)*))
    };
}

const USAGE: &str = "\
usage: cargo xtask <command> [options]

commands:
  vm [--hosts 2] [--timeout SECS] [--mem MIB] -- <command...>
        run a command in a Soft-RoCE guest (cwd = workspace root) and exit
        with its status (default timeout 600 s); with --hosts 2, in each of
        two guests joined by a virtual Ethernet wire (XTASK_HOST=a|b, RDMA_IP,
        PEER_IP; see docs/two-hosts.md)
  test [--no-vm | --two-hosts-only] [--timeout SECS] [--mem MIB]
        run the static checks (as `check`), then `cargo test --workspace`
        on the host, then every device test
        binary (tests/device_*.rs) in one guest (default timeout 3600 s),
        then the two-host tests (tests/twohost_*.rs) on two guests;
        --no-vm (or RDMA_NO_VM=1) runs the device tests on this host's own
        RDMA device; --two-hosts-only runs only the two-host tests (only the
        binaries XTASK_TWO_HOSTS names, comma-separated, if set)
  demo [--timeout SECS] [--mem MIB]
        build the examples in release mode and run the demo in a guest
        (default timeout 1800 s)
  bench [--timeout SECS] [--mem MIB] [--tools LIST] [--sizes LIST]
        [--min-rounds N] [--max-rounds N] [--budget SECS] [--precision X]
        [--layouts N] [--no-kiara | --code-only | --control]
        C perftest/ibv_rc_pingpong against the Rust ports in one guest, C and
        Rust interleaved: --min-rounds rounds of every row (default 10), then
        more rounds of the rows whose 95% interval of the Rust/C ratio is wider
        than +-X (default 0.03) until --max-rounds (30) or --budget seconds of
        extra rounds (900) are spent; then the KIARA rows the same way (more
        rounds while a goal row is wider than +-X, with a budget of their
        own) and the code rows (instructions a round trip runs, by callgrind);
        --code-only runs only the code rows (a few minutes). Round r runs
        layout r % N of every Rust program (--layouts N, odd, default 5: the
        plain link and N-1 with their functions shuffled by lld), so the
        intervals include where the linker put the code. --control runs C
        against C in every row (no KIARA): how often its intervals exclude 1.0
        is how often the bench calls a difference that is not there.
        LIST is comma-separated (e.g. --tools ib_send_lat --sizes 2,64).
        Writes a table, target/bench/bench.json and target/bench/bench.{png,svg}
        (default timeout 9000 s; see docs/performance.md)
  bench --plot-only JSON
        draw the plot again from a bench.json, next to it
  setup
        install the Debian packages, fetch the guest kernel and build the
        initramfs, then print where they are cached
  check
        the static checks alone: cargo fmt --check, clippy -D warnings,
        cargo doc -D warnings (also as docs.rs builds it, without the
        rdma-core headers), cargo publish --dry-run of the published crates
  bindings
        regenerate rdma-verbs-sys/src/pregenerated.rs (the bindings docs.rs uses)
        from this machine's rdma-core headers

options:
  --timeout SECS   kill the guest after SECS seconds
  --mem MIB        guest memory in MiB (default 4096; 1024 per guest with --hosts 2)

see docs/softroce.md";

/// Options shared by the commands that boot a guest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GuestOptions {
    /// Hard limit for the whole guest run; QEMU is killed when it expires.
    pub timeout: Duration,
    /// Guest memory in MiB.
    pub mem_mib: u32,
}

/// A parsed command line.
#[derive(Debug, Clone, PartialEq)]
enum Command {
    /// `vm`: run one command in a guest, or in each of two.
    Vm {
        /// Guest options.
        guest: GuestOptions,
        /// The command and its arguments.
        argv: Vec<String>,
        /// How many guests: 1, or 2 joined by a wire.
        hosts: u32,
    },
    /// `test`: host tests, then device tests in a guest (or on the host).
    Test {
        /// Guest options.
        guest: GuestOptions,
        /// Run the device tests on the host instead of in a guest.
        no_vm: bool,
        /// Run only the two-host tier.
        two_hosts_only: bool,
    },
    /// `demo`: build the examples and run the demo in a guest.
    Demo {
        /// Guest options.
        guest: GuestOptions,
    },
    /// `bench`: C tools against the Rust ports in one guest.
    Bench {
        /// Guest options.
        guest: GuestOptions,
        /// What to measure, and for how long.
        bench: commands::bench::BenchOptions,
    },
    /// `bench --plot-only JSON`: the plot again from a results file.
    BenchPlot {
        /// The `bench.json` to read.
        json: std::path::PathBuf,
    },
    /// `__bench-more` (run by the bench's guest script, not by people): the rows
    /// that need another round.
    BenchMore {
        /// The plan file.
        plan: std::path::PathBuf,
        /// The raw outputs' directory.
        raw: std::path::PathBuf,
        /// Rounds run so far.
        rounds: usize,
        /// The wanted precision.
        precision: f64,
    },
    /// `__kiara-more` (run by the bench's guest script, not by people): the KIARA
    /// goal rows that need another round.
    KiaraMore {
        /// The raw outputs' directory.
        raw: std::path::PathBuf,
        /// KIARA rounds run so far.
        rounds: usize,
        /// The wanted precision.
        precision: f64,
    },
    /// `setup`: only make sure the prerequisites are in place.
    Setup,
    /// `check`: only the static checks.
    Check,
    /// `bindings`: regenerate rdma-verbs-sys's pregenerated bindings.
    Bindings,
    /// `help`: print the usage.
    Help,
}

/// Default guest memory, MiB.
const DEFAULT_MEM_MIB: u32 = 4096;

/// Default memory of each of two hosts, MiB: two guests share the machine.
pub const HOST_MEM_MIB: u32 = 1024;

fn parse_args(args: &[String]) -> Result<Command> {
    let Some((name, rest)) = args.split_first() else {
        return Ok(Command::Help);
    };
    let default_timeout = match name.as_str() {
        "vm" => 600,
        "test" => 3600,
        "demo" => 1800,
        // About 50 minutes of perftest rows (10 rounds of 35, then the 900 s
        // budget and one pass over it), then 10 KIARA rounds of about 3
        // minutes (then more while a goal row is wider than --precision: the
        // 900 s budget again, and one round over it), then the code rows.
        "bench" => 9000,
        "__bench-more" => return parse_bench_more(rest),
        "__kiara-more" => return parse_kiara_more(rest),
        "setup" | "check" | "bindings" => {
            if let Some(extra) = rest.first() {
                return Err(Error::new(format!(
                    "{name} takes no arguments (got `{extra}`)"
                )));
            }
            return Ok(match name.as_str() {
                "setup" => Command::Setup,
                "check" => Command::Check,
                _ => Command::Bindings,
            });
        }
        "help" | "-h" | "--help" => return Ok(Command::Help),
        other => return Err(Error::new(format!("unknown command `{other}`\n\n{USAGE}"))),
    };
    let mut guest = GuestOptions {
        timeout: Duration::from_secs(default_timeout),
        mem_mib: DEFAULT_MEM_MIB,
    };
    let mut f = Flags::default();
    let mut mem = None;
    if parse_options(name, rest, &mut guest, &mut f, &mut mem)? {
        return Ok(Command::Help);
    }
    let default_mem = if f.hosts == 2 {
        HOST_MEM_MIB
    } else {
        DEFAULT_MEM_MIB
    };
    guest.mem_mib = mem.unwrap_or(default_mem);
    f.into_command(name, guest)
}

/// Reads the options after command `name` into `guest`, `f` and `mem` (`--mem`);
/// true when help was asked for.
fn parse_options(
    name: &str,
    rest: &[String],
    guest: &mut GuestOptions,
    f: &mut Flags,
    mem: &mut Option<u32>,
) -> Result<bool> {
    let mut i = 0;
    while i < rest.len() {
        let arg = rest[i].as_str();
        // `--opt=value` or `--opt value`.
        let (opt, inline) = match arg.split_once('=') {
            Some((o, v)) if o.starts_with("--") => (o, Some(v.to_string())),
            _ => (arg, None),
        };
        let mut value = |what: &str| -> Result<String> {
            if let Some(v) = inline.clone() {
                return Ok(v);
            }
            i += 1;
            rest.get(i)
                .cloned()
                .ok_or_else(|| Error::new(format!("{opt} needs a value ({what})")))
        };
        match opt {
            "--timeout" => guest.timeout = Duration::from_secs(positive_secs(&value("seconds")?)?),
            "--mem" => *mem = Some(mem_mib(&value("MiB")?)?),
            "--hosts" if name == "vm" => f.hosts = host_count(&value("1 or 2")?)?,
            "--no-vm" if name == "test" => f.no_vm = true,
            "--plot-only" if name == "bench" => f.plot_only = Some(value("a bench.json")?.into()),
            "--two-hosts-only" if name == "test" => f.two_hosts_only = true,
            "--" if name == "vm" => {
                f.argv.extend(rest[i + 1..].iter().cloned());
                break;
            }
            "-h" | "--help" => return Ok(true),
            _ if name == "vm" && !arg.starts_with('-') => {
                f.argv.extend(rest[i..].iter().cloned());
                break;
            }
            _ => {
                if name != "bench" || !f.bench.accept(opt, &mut value)? {
                    return Err(Error::new(format!(
                        "{name}: unknown option `{arg}`\n\n{USAGE}"
                    )));
                }
            }
        }
        i += 1;
    }
    Ok(false)
}

/// The options of a command line other than the guest's.
struct Flags {
    /// `test --no-vm`.
    no_vm: bool,
    /// `test --two-hosts-only`.
    two_hosts_only: bool,
    /// `vm --hosts`.
    hosts: u32,
    /// `vm`'s command.
    argv: Vec<String>,
    /// `bench`'s options.
    bench: commands::bench::BenchOptions,
    /// `bench --plot-only`.
    plot_only: Option<std::path::PathBuf>,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            no_vm: false,
            two_hosts_only: false,
            hosts: 1,
            argv: Vec::new(),
            bench: Default::default(),
            plot_only: None,
        }
    }
}

impl Flags {
    /// The command `name` with these options.
    fn into_command(self, name: &str, guest: GuestOptions) -> Result<Command> {
        let Flags {
            no_vm,
            two_hosts_only,
            hosts,
            argv,
            bench,
            plot_only,
        } = self;
        Ok(match name {
            "vm" => {
                if argv.is_empty() {
                    return Err(Error::new(format!("vm: no command given\n\n{USAGE}")));
                }
                Command::Vm { guest, argv, hosts }
            }
            "test" if no_vm && two_hosts_only => return Err(Error::new(
                "test: --no-vm and --two-hosts-only exclude each other (two hosts are two guests)",
            )),
            "test" => Command::Test {
                guest,
                no_vm,
                two_hosts_only,
            },
            "bench" => match plot_only {
                Some(json) => Command::BenchPlot { json },
                None => Command::Bench { guest, bench },
            },
            _ => Command::Demo { guest },
        })
    }
}

/// A `--timeout` value.
fn positive_secs(v: &str) -> Result<u64> {
    v.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
        Error::new(format!(
            "--timeout: `{v}` is not a positive number of seconds"
        ))
    })
}

/// A `--mem` value.
fn mem_mib(v: &str) -> Result<u32> {
    v.parse()
        .ok()
        .filter(|m| *m >= 256)
        .ok_or_else(|| Error::new(format!("--mem: `{v}` is not a size in MiB (at least 256)")))
}

/// A `--hosts` value.
fn host_count(v: &str) -> Result<u32> {
    v.parse()
        .ok()
        .filter(|h| *h == 1 || *h == 2)
        .ok_or_else(|| Error::new(format!("--hosts: `{v}` is not 1 or 2")))
}

/// The value after `key` in `rest`, the arguments of the internal step `step`.
fn step_value<'a>(step: &str, rest: &'a [String], key: &str) -> Result<&'a str> {
    rest.iter()
        .position(|a| a == key)
        .and_then(|i| rest.get(i + 1))
        .map(String::as_str)
        .ok_or_else(|| Error::new(format!("{step}: {key} missing")))
}

/// The number after `key` in `rest`, the arguments of the internal step `step`.
fn step_number(step: &str, rest: &[String], key: &str) -> Result<f64> {
    step_value(step, rest, key)?
        .parse()
        .map_err(|_| Error::new(format!("{step}: {key} is not a number")))
}

/// Parses `__bench-more --plan FILE --raw DIR --rounds N --precision X`.
fn parse_bench_more(rest: &[String]) -> Result<Command> {
    let step = "__bench-more";
    Ok(Command::BenchMore {
        plan: step_value(step, rest, "--plan")?.into(),
        raw: step_value(step, rest, "--raw")?.into(),
        rounds: step_number(step, rest, "--rounds")? as usize,
        precision: step_number(step, rest, "--precision")?,
    })
}

/// Parses `__kiara-more --raw DIR --rounds N --precision X`.
fn parse_kiara_more(rest: &[String]) -> Result<Command> {
    let step = "__kiara-more";
    Ok(Command::KiaraMore {
        raw: step_value(step, rest, "--raw")?.into(),
        rounds: step_number(step, rest, "--rounds")? as usize,
        precision: step_number(step, rest, "--precision")?,
    })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let command = match parse_args(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Help => {
            println!("{USAGE}");
            Ok(0)
        }
        Command::Vm { guest, argv, hosts } => commands::vm::run(&guest, &argv, hosts),
        Command::Test {
            guest,
            no_vm,
            two_hosts_only,
        } => commands::test::run(&guest, no_vm, two_hosts_only),
        Command::Demo { guest } => commands::demo::run(&guest),
        Command::Bench { guest, bench } => commands::bench::run(&guest, &bench),
        Command::BenchPlot { json } => commands::bench::plot_only(&json),
        Command::BenchMore {
            plan,
            raw,
            rounds,
            precision,
        } => commands::bench::more(&plan, &raw, rounds, precision),
        Command::KiaraMore {
            raw,
            rounds,
            precision,
        } => commands::bench::kiara_more(&raw, rounds, precision),
        Command::Setup => commands::setup::run(),
        Command::Check => commands::checks::run(),
        Command::Bindings => commands::bindings::run(),
    };
    match result {
        Ok(status) => ExitCode::from(u8::try_from(status.clamp(0, 255)).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn vm_with_options_and_separator() {
        let c = parse_args(&args(&[
            "vm",
            "--timeout",
            "40",
            "--mem=1024",
            "--",
            "sh",
            "-c",
            "exit 3",
        ]))
        .unwrap();
        assert_eq!(
            c,
            Command::Vm {
                guest: GuestOptions {
                    timeout: Duration::from_secs(40),
                    mem_mib: 1024
                },
                argv: args(&["sh", "-c", "exit 3"]),
                hosts: 1,
            }
        );
    }

    #[test]
    fn vm_on_two_hosts() {
        let c = parse_args(&args(&["vm", "--hosts", "2", "--", "true"])).unwrap();
        let Command::Vm { guest, hosts, .. } = c else {
            panic!("not vm")
        };
        assert_eq!((hosts, guest.mem_mib), (2, HOST_MEM_MIB));
        let c = parse_args(&args(&["vm", "--mem", "2048", "--hosts=2", "true"])).unwrap();
        let Command::Vm { guest, .. } = c else {
            panic!("not vm")
        };
        assert_eq!(guest.mem_mib, 2048);
        assert!(parse_args(&args(&["vm", "--hosts", "3", "--", "true"])).is_err());
        assert!(parse_args(&args(&["test", "--hosts", "2"])).is_err());
    }

    #[test]
    fn vm_without_separator_keeps_command_options() {
        let c = parse_args(&args(&["vm", "ibv_devinfo", "-v"])).unwrap();
        let Command::Vm { guest, argv, .. } = c else {
            panic!("not vm")
        };
        assert_eq!(guest.timeout, Duration::from_secs(600));
        assert_eq!(argv, args(&["ibv_devinfo", "-v"]));
    }

    #[test]
    fn vm_needs_a_command() {
        assert!(parse_args(&args(&["vm", "--"])).is_err());
        assert!(parse_args(&args(&["vm", "--timeout"])).is_err());
        assert!(parse_args(&args(&["vm", "--timeout", "0", "--", "true"])).is_err());
    }

    #[test]
    fn test_and_demo_defaults() {
        assert_eq!(
            parse_args(&args(&["test", "--no-vm"])).unwrap(),
            Command::Test {
                guest: GuestOptions {
                    timeout: Duration::from_secs(3600),
                    mem_mib: DEFAULT_MEM_MIB
                },
                no_vm: true,
                two_hosts_only: false
            }
        );
        let Command::Test { two_hosts_only, .. } =
            parse_args(&args(&["test", "--two-hosts-only"])).unwrap()
        else {
            panic!("not test")
        };
        assert!(two_hosts_only);
        assert!(parse_args(&args(&["test", "--no-vm", "--two-hosts-only"])).is_err());
        assert_eq!(
            parse_args(&args(&["demo"])).unwrap(),
            Command::Demo {
                guest: GuestOptions {
                    timeout: Duration::from_secs(1800),
                    mem_mib: DEFAULT_MEM_MIB
                }
            }
        );
        assert!(parse_args(&args(&["demo", "--no-vm"])).is_err());
        assert_eq!(parse_args(&args(&["setup"])).unwrap(), Command::Setup);
        assert_eq!(parse_args(&args(&["check"])).unwrap(), Command::Check);
        assert_eq!(parse_args(&args(&["bindings"])).unwrap(), Command::Bindings);
        assert!(parse_args(&args(&["check", "--no-vm"])).is_err());
        assert_eq!(parse_args(&[]).unwrap(), Command::Help);
        assert!(parse_args(&args(&["bogus"])).is_err());
    }

    #[test]
    fn bench_options() {
        let Command::Bench { guest, bench } = parse_args(&args(&[
            "bench",
            "--tools=ib_send_lat",
            "--sizes",
            "2,64",
            "--min-rounds",
            "2",
            "--no-kiara",
        ]))
        .unwrap() else {
            panic!("not bench")
        };
        assert_eq!(guest.timeout, Duration::from_secs(9000));
        assert_eq!(
            (bench.tools, bench.sizes),
            (args(&["ib_send_lat"]), vec![2, 64])
        );
        assert!(bench.no_kiara && !bench.code_only && bench.rounds.min == 2);
        let Command::Bench { bench, .. } = parse_args(&args(&["bench", "--code-only"])).unwrap()
        else {
            panic!("not bench")
        };
        assert!(bench.code_only);
        bench.check().unwrap();
        let mut both = bench.clone();
        both.no_kiara = true;
        assert!(both.check().is_err());
        let mut rows = bench.clone();
        rows.tools = args(&["ib_send_lat"]);
        assert!(rows.check().is_err(), "--code-only runs no rows");
        assert_eq!(
            parse_args(&args(&["bench", "--plot-only", "x.json"])).unwrap(),
            Command::BenchPlot {
                json: "x.json".into()
            }
        );
        assert!(parse_args(&args(&["bench", "--sizes", "x"])).is_err());
        assert!(parse_args(&args(&["test", "--tools", "x"])).is_err());
        let Command::BenchMore {
            rounds, precision, ..
        } = parse_args(&args(&[
            "__bench-more",
            "--plan",
            "p",
            "--raw",
            "r",
            "--rounds",
            "6",
            "--precision",
            "0.03",
        ]))
        .unwrap()
        else {
            panic!("not __bench-more")
        };
        assert_eq!((rounds, precision), (6, 0.03));
        assert_eq!(
            parse_args(&args(&[
                "__kiara-more",
                "--raw",
                "r",
                "--rounds",
                "7",
                "--precision",
                "0.03"
            ]))
            .unwrap(),
            Command::KiaraMore {
                raw: "r".into(),
                rounds: 7,
                precision: 0.03
            }
        );
        let err = parse_args(&args(&["__kiara-more", "--raw", "r"])).unwrap_err();
        assert!(
            err.to_string().contains("__kiara-more: --rounds missing"),
            "{err}"
        );
    }
}
