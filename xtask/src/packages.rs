//! The Debian packages the harness needs, checked with dpkg-query and installed with apt-get.

use std::collections::HashMap;
use std::process::Command;

use crate::error::{Error, Result};
use crate::process;
use crate::step;

/// Packages needed to build and run the workspace's code against rdma-core on
/// the host itself: the verbs and CM libraries and headers, the rxe provider,
/// the C tools used for interop checks, and what bindgen needs.
pub const HOST_PACKAGES: &[&str] = &[
    "rdma-core",
    "ibverbs-providers",
    "ibverbs-utils",
    "rdmacm-utils",
    "perftest",
    "libibverbs-dev",
    "librdmacm-dev",
    "iproute2",
    "libclang-dev",
    "pkg-config",
    "valgrind",
    // The font `cargo xtask bench` draws its plot's text with (and its unit test).
    "fonts-dejavu-core",
];

/// Packages needed only to boot the Soft-RoCE guest.
pub const GUEST_PACKAGES: &[&str] = &["qemu-system-x86", "busybox-static", "cpio"];

/// The status dpkg-query reports for an installed package.
const INSTALLED: &str = "install ok installed";

/// Parses `dpkg-query -W -f='${Package}\t${Status}\n'` output into package -> status.
pub fn parse_dpkg_status(text: &str) -> HashMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('\t'))
        .map(|(pkg, status)| (pkg.trim().to_string(), status.trim().to_string()))
        .collect()
}

/// Of `wanted`, those that `statuses` does not report as installed, in order.
pub fn missing<'a>(wanted: &[&'a str], statuses: &HashMap<String, String>) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|p| statuses.get(*p).map(String::as_str) != Some(INSTALLED))
        .collect()
}

/// Makes sure the packages are installed: the host ones always, the guest
/// ones when `with_guest`. As root, installs what is missing with apt-get;
/// otherwise prints the command to run and fails.
pub fn ensure(with_guest: bool) -> Result<()> {
    let mut wanted: Vec<&str> = HOST_PACKAGES.to_vec();
    if with_guest {
        wanted.extend_from_slice(GUEST_PACKAGES);
    }
    let mut query = Command::new("dpkg-query");
    query
        .arg("-W")
        .arg("-f=${Package}\t${Status}\n")
        .args(&wanted);
    // dpkg-query exits 1 when some package is unknown; its stdout still lists the rest.
    let out = match process::output(&mut query) {
        Ok(out) => out,
        Err(e) if !with_guest => {
            step!(
                "cannot check Debian packages ({e}); assuming the build dependencies are present"
            );
            return Ok(());
        }
        Err(e) => {
            return Err(Error::new(format!(
                "{e}\nthe Soft-RoCE guest needs a Debian-based host with these packages: {}",
                wanted.join(" ")
            )))
        }
    };
    let statuses = parse_dpkg_status(&String::from_utf8_lossy(&out.stdout));
    let missing = missing(&wanted, &statuses);
    if missing.is_empty() {
        step!("Debian packages: all {} needed are installed", wanted.len());
        return Ok(());
    }
    let list = missing.join(" ");
    if process::euid() != 0 {
        return Err(Error::new(format!(
            "missing Debian packages: {list}\ninstall them with:\n    sudo apt-get update && sudo apt-get install -y {list}"
        )));
    }
    step!("installing Debian packages: {list}");
    update_apt_lists()?;
    process::run_checked(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y"])
            .args(&missing),
    )
    .map_err(|e| Error::new(format!("installing Debian packages failed: {e}")))
}

/// Runs `apt-get update` (as root).
pub fn update_apt_lists() -> Result<()> {
    step!("running apt-get update");
    process::run_checked(Command::new("apt-get").args(["update", "-q"])).map_err(|e| {
        Error::new(format!(
            "{e}\ncheck that Debian's package mirror is reachable"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status_and_finds_missing() {
        let text = "cpio\tinstall ok installed\nperftest\tdeinstall ok config-files\nqemu-system-x86\tinstall ok installed\n";
        let st = parse_dpkg_status(text);
        assert_eq!(st.get("cpio").unwrap(), INSTALLED);
        assert_eq!(
            missing(&["cpio", "perftest", "qemu-system-x86", "valgrind"], &st),
            vec!["perftest", "valgrind"]
        );
    }

    #[test]
    fn lists_have_no_duplicates() {
        let mut all: Vec<&str> = HOST_PACKAGES
            .iter()
            .chain(GUEST_PACKAGES)
            .copied()
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
    }
}
