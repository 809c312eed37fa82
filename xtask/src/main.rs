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
//! - `cargo xtask bench [--timeout SECS] [--mem MIB]`
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
        RDMA device; --two-hosts-only runs only the two-host tests
  demo [--timeout SECS] [--mem MIB]
        build the examples in release mode and run the demo in a guest
        (default timeout 1800 s)
  bench [--timeout SECS] [--mem MIB]
        C perftest/ibv_rc_pingpong against the Rust ports in one guest: a table
        of medians and target/bench/bench.json (default timeout 1500 s)
  setup
        install the Debian packages, fetch the guest kernel and build the
        initramfs, then print where they are cached
  check
        the static checks alone: cargo fmt --check, clippy -D warnings,
        cargo doc -D warnings (also as docs.rs builds it, without the
        rdma-core headers), cargo publish --dry-run of the published crates
  bindings
        regenerate rdma-sys/src/pregenerated.rs (the bindings docs.rs uses)
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
#[derive(Debug, Clone, PartialEq, Eq)]
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
    },
    /// `setup`: only make sure the prerequisites are in place.
    Setup,
    /// `check`: only the static checks.
    Check,
    /// `bindings`: regenerate rdma-sys's pregenerated bindings.
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
        "bench" => 1500,
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
    let mut no_vm = false;
    let mut two_hosts_only = false;
    let mut hosts = 1;
    let mut mem = None;
    let mut argv = Vec::new();
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
            "--timeout" => {
                let v = value("seconds")?;
                let secs: u64 = v.parse().ok().filter(|s| *s > 0).ok_or_else(|| {
                    Error::new(format!(
                        "--timeout: `{v}` is not a positive number of seconds"
                    ))
                })?;
                guest.timeout = Duration::from_secs(secs);
            }
            "--mem" => {
                let v = value("MiB")?;
                mem = Some(v.parse().ok().filter(|m| *m >= 256).ok_or_else(|| {
                    Error::new(format!("--mem: `{v}` is not a size in MiB (at least 256)"))
                })?);
            }
            "--hosts" if name == "vm" => {
                let v = value("1 or 2")?;
                hosts = v
                    .parse()
                    .ok()
                    .filter(|h| *h == 1 || *h == 2)
                    .ok_or_else(|| Error::new(format!("--hosts: `{v}` is not 1 or 2")))?;
            }
            "--no-vm" if name == "test" => no_vm = true,
            "--two-hosts-only" if name == "test" => two_hosts_only = true,
            "--" if name == "vm" => {
                argv.extend(rest[i + 1..].iter().cloned());
                break;
            }
            "-h" | "--help" => return Ok(Command::Help),
            _ if name == "vm" && !arg.starts_with('-') => {
                argv.extend(rest[i..].iter().cloned());
                break;
            }
            _ => {
                return Err(Error::new(format!(
                    "{name}: unknown option `{arg}`\n\n{USAGE}"
                )))
            }
        }
        i += 1;
    }
    let default_mem = if hosts == 2 {
        HOST_MEM_MIB
    } else {
        DEFAULT_MEM_MIB
    };
    guest.mem_mib = mem.unwrap_or(default_mem);
    Ok(match name.as_str() {
        "vm" => {
            if argv.is_empty() {
                return Err(Error::new(format!("vm: no command given\n\n{USAGE}")));
            }
            Command::Vm { guest, argv, hosts }
        }
        "test" if no_vm && two_hosts_only => {
            return Err(Error::new(
                "test: --no-vm and --two-hosts-only exclude each other (two hosts are two guests)",
            ))
        }
        "test" => Command::Test {
            guest,
            no_vm,
            two_hosts_only,
        },
        "bench" => Command::Bench { guest },
        _ => Command::Demo { guest },
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
        Command::Bench { guest } => commands::bench::run(&guest),
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
}
