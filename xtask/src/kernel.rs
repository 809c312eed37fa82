//! The guest kernel: Debian's `linux-image-*` package, downloaded with apt-get
//! and cached, extracted to just `vmlinuz` and the modules the guest loads.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Context, Error, Result};
use crate::packages;
use crate::process;
use crate::step;
use crate::workspace::Workspace;

/// The modules the guest loads, in `insmod` order (dependencies first).
///
/// `crc32_generic` is needed by `rdma_rxe` (without it `rdma link add` fails
/// with `rdma_rxe: failed to add <netdev>`); `dummy` provides `dummy0`, the
/// netdev rxe binds to (it cannot bind to `lo`).
pub const MODULES: &[&str] = &[
    "crc32_generic",
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "netfs",
    "fscache",
    "9pnet",
    "9pnet_virtio",
    "9p",
    "udp_tunnel",
    "ip6_udp_tunnel",
    "ib_core",
    "ib_uverbs",
    "rdma_rxe",
    "configfs",
    "iw_cm",
    "ib_cm",
    "rdma_cm",
    "rdma_ucm",
    "dummy",
];

/// The modules only the two-host guests load (after [`MODULES`]): the virtio-net
/// NIC that carries their wire (`virtio_net` needs `net_failover`, which needs
/// `failover`) and `sch_netem`, the queueing discipline that injects faults on it;
/// `sch_prio`, `cls_u32` and `act_gact` drop only the RoCE packets a host sends
/// (`examples::twohost::fault::RoceDropped`).
pub const NET_MODULES: &[&str] = &[
    "failover",
    "net_failover",
    "virtio_net",
    "sch_netem",
    "sch_prio",
    "cls_u32",
    "act_gact",
];

/// Modules a kernel may lack as files without harm: Debian's 6.12 kernels build
/// virtio and its PCI transport in, and since 6.8 `fscache` is part of `netfs`.
/// The guest's `/init` skips a module the initramfs does not hold.
pub const OPTIONAL_MODULES: &[&str] = &[
    "virtio_ring",
    "virtio",
    "virtio_pci_legacy_dev",
    "virtio_pci_modern_dev",
    "virtio_pci",
    "fscache",
];

/// Every module the initramfs holds: [`MODULES`], then [`NET_MODULES`].
pub fn all_modules() -> impl Iterator<Item = &'static str> {
    MODULES.iter().chain(NET_MODULES).copied()
}

/// The Debian meta-package that names the current kernel.
const META_PACKAGE: &str = "linux-image-amd64";

/// Environment variable naming a directory with `vmlinuz` and the module files,
/// used instead of the Debian package.
pub const KERNEL_DIR_ENV: &str = "RDMA_VM_KERNEL_DIR";

/// Environment variable naming the Debian kernel package to boot instead of the
/// one `linux-image-amd64` depends on, e.g.
/// `linux-image-6.12.115+deb12-amd64-unsigned` (bookworm's newer kernel line).
pub const KERNEL_PACKAGE_ENV: &str = "RDMA_VM_KERNEL_PACKAGE";

/// A kernel ready to boot: the image and the module files, by module name.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// What it is, for messages (the package name, or the override directory).
    pub label: String,
    /// The directory holding it.
    pub dir: PathBuf,
    /// The kernel image.
    pub vmlinuz: PathBuf,
    /// `(module name, file)` in [`all_modules`] order; files are `.ko` or `.ko.xz`.
    pub modules: Vec<(String, PathBuf)>,
}

/// Parses `apt-cache depends linux-image-amd64`: the first `Depends: linux-image-...`.
pub fn parse_apt_cache_depends(text: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let rest = line
            .trim()
            .trim_start_matches('|')
            .strip_prefix("Depends:")?;
        let name = rest.trim();
        (name.starts_with("linux-image-") && !name.contains(['<', ' '])).then(|| name.to_string())
    })
}

/// Whether `name` is safe to use as a directory name and an apt argument.
fn plausible_package_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
}

/// Finds the module files for [`all_modules`] below `dir` (any depth), plus the
/// kernel image: `vmlinuz` or `vmlinuz-*`. Reports what is missing.
pub fn find_in_tree(dir: &Path, label: &str) -> Result<Kernel> {
    let mut files: HashMap<String, Vec<PathBuf>> = HashMap::new();
    walk(dir, &mut |path| {
        if let Some(name) = path.file_name().and_then(|n| n.to_str()) {
            files
                .entry(name.to_string())
                .or_default()
                .push(path.to_path_buf());
        }
    })
    .context(format!("reading {}", dir.display()))?;
    let vmlinuz = files
        .get("vmlinuz")
        .and_then(|v| v.first().cloned())
        .or_else(|| {
            let mut images: Vec<&PathBuf> = files
                .iter()
                .filter(|(n, _)| n.starts_with("vmlinuz-"))
                .flat_map(|(_, v)| v)
                .collect();
            images.sort();
            images.last().map(|p| p.to_path_buf())
        });
    let mut modules = Vec::new();
    let mut missing = Vec::new();
    for m in all_modules() {
        let found = [format!("{m}.ko"), format!("{m}.ko.xz")]
            .iter()
            .find_map(|n| files.get(n).and_then(|v| v.first().cloned()));
        match found {
            Some(p) => modules.push((m.to_string(), p)),
            None if OPTIONAL_MODULES.contains(&m) => {}
            None => missing.push(m),
        }
    }
    let Some(vmlinuz) = vmlinuz else {
        return Err(Error::new(format!(
            "{label}: no vmlinuz in {}",
            dir.display()
        )));
    };
    if !missing.is_empty() {
        return Err(Error::new(format!(
            "{label}: modules not found in {}: {} (the guest needs them built as plain .ko or .ko.xz files)",
            dir.display(),
            missing.join(" ")
        )));
    }
    Ok(Kernel {
        label: label.to_string(),
        dir: dir.to_path_buf(),
        vmlinuz,
        modules,
    })
}

fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) -> std::io::Result<()> {
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let ty = entry.file_type()?;
        if ty.is_dir() {
            walk(&entry.path(), f)?;
        } else if ty.is_file() {
            f(&entry.path());
        }
    }
    Ok(())
}

/// Reads a module file, decompressing `.ko.xz` with busybox's `xzcat`.
pub fn read_module(path: &Path) -> Result<Vec<u8>> {
    if path.extension().is_some_and(|e| e == "xz") {
        let out = process::output(
            Command::new(crate::initramfs::BUSYBOX)
                .arg("xzcat")
                .arg(path),
        )?;
        if !out.status.success() {
            return Err(Error::new(format!(
                "decompressing {} failed: {}",
                path.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        return Ok(out.stdout);
    }
    fs::read(path).context(format!("reading {}", path.display()))
}

/// The kernel cache, `target/vm/kernel`.
fn cache_root(ws: &Workspace) -> PathBuf {
    ws.vm_dir.join("kernel")
}

/// Makes sure a kernel is available, downloading Debian's current one if it is
/// not cached yet, and returns it.
pub fn ensure(ws: &Workspace) -> Result<Kernel> {
    if let Some(dir) = std::env::var_os(KERNEL_DIR_ENV) {
        let dir = PathBuf::from(dir);
        let k = find_in_tree(&dir, &format!("{KERNEL_DIR_ENV}={}", dir.display()))?;
        step!("kernel from {KERNEL_DIR_ENV}: {}", dir.display());
        return Ok(k);
    }
    let chosen = std::env::var(KERNEL_PACKAGE_ENV).ok();
    if let Some(name) = chosen.as_deref().filter(|n| !plausible_package_name(n)) {
        return Err(Error::new(format!(
            "{KERNEL_PACKAGE_ENV}=`{name}` is not a package name"
        )));
    }
    let name = match chosen.map(Ok).unwrap_or_else(current_package_name) {
        Ok(name) => name,
        Err(why) => match newest_cached(ws) {
            Some(k) => {
                step!("cannot ask apt for the current kernel ({why}); using the cached {}", k.label);
                return Ok(k);
            }
            None if process::euid() == 0 => {
                step!("cannot ask apt for the current kernel ({why}); refreshing the package lists");
                packages::update_apt_lists()?;
                current_package_name().map_err(|why| {
                    Error::new(format!("cannot find Debian's kernel package: {why}"))
                })?
            }
            None => {
                return Err(Error::new(format!(
                    "cannot find Debian's kernel package: {why}\nrun `sudo apt-get update`, or set {KERNEL_DIR_ENV}"
                )))
            }
        },
    };
    let dir = cache_root(ws).join(&name);
    if dir.is_dir() {
        if let Ok(k) = find_in_tree(&dir, &name) {
            step!("kernel {name} (cached in {})", ws.display(&dir));
            return Ok(k);
        }
        step!(
            "kernel cache {} is incomplete; fetching again",
            ws.display(&dir)
        );
    }
    step!("downloading kernel {name} (cached in {})", ws.display(&dir));
    download(ws, &name, &dir)?;
    find_in_tree(&dir, &name)
}

/// The package `linux-image-amd64` depends on, from `apt-cache depends`.
fn current_package_name() -> std::result::Result<String, String> {
    let out = process::output(Command::new("apt-cache").args(["depends", META_PACKAGE]))
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    match parse_apt_cache_depends(&text) {
        Some(name) if plausible_package_name(&name) => Ok(name),
        Some(name) => Err(format!("apt-cache named an odd package `{name}`")),
        None if !out.status.success() => Err(format!(
            "`apt-cache depends {META_PACKAGE}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        None => Err(format!(
            "`apt-cache depends {META_PACKAGE}` names no linux-image package"
        )),
    }
}

/// The most recently cached complete kernel, if any.
fn newest_cached(ws: &Workspace) -> Option<Kernel> {
    let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = fs::read_dir(cache_root(ws))
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("linux-image-"))
        })
        .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
        .collect();
    dirs.sort();
    dirs.into_iter().rev().find_map(|(_, dir)| {
        let label = dir.file_name()?.to_str()?.to_string();
        find_in_tree(&dir, &label).ok()
    })
}

/// Downloads package `name` and fills `dest` with `vmlinuz` and the modules.
fn download(ws: &Workspace, name: &str, dest: &Path) -> Result<()> {
    let scratch = ws.vm_dir.join(format!("download-{}", std::process::id()));
    let _ = fs::remove_dir_all(&scratch);
    fs::create_dir_all(&scratch).context(format!("creating {}", scratch.display()))?;
    let result = download_into(ws, name, &scratch, dest);
    let _ = fs::remove_dir_all(&scratch);
    result
}

fn download_into(ws: &Workspace, name: &str, scratch: &Path, dest: &Path) -> Result<()> {
    let mut fetched = fetch_deb(name, scratch);
    if fetched.is_err() && process::euid() == 0 {
        // Stale package lists point at a version the mirror no longer has.
        step!("apt-get download failed; refreshing the package lists and retrying");
        packages::update_apt_lists()?;
        fetched = fetch_deb(name, scratch);
    }
    let deb = fetched?;

    // Extract only the image and the wanted modules, then copy them flat.
    let tree = scratch.join("tree");
    fs::create_dir_all(&tree).context(format!("creating {}", tree.display()))?;
    let mut patterns = vec!["*boot/vmlinuz-*".to_string()];
    patterns.extend(all_modules().map(|m| format!("*/{m}.ko*")));
    let mut dpkg = Command::new("dpkg-deb")
        .arg("--fsys-tarfile")
        .arg(&deb)
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run dpkg-deb")?;
    let tar_status = Command::new("tar")
        .arg("-x")
        .arg("-C")
        .arg(&tree)
        .arg("--wildcards")
        .args(&patterns)
        .stdin(dpkg.stdout.take().expect("piped stdout"))
        .status()
        .context("cannot run tar");
    let dpkg_status = dpkg.wait().context("waiting for dpkg-deb")?;
    let tar_status = tar_status?;
    if !dpkg_status.success() {
        return Err(Error::new(format!(
            "`dpkg-deb --fsys-tarfile {}` failed",
            deb.display()
        )));
    }
    // tar also fails when a pattern matched nothing; find_in_tree says which.
    let found = find_in_tree(&tree, name)?;
    if !tar_status.success() {
        step!("tar reported a problem extracting {name}, but all needed files are there");
    }

    let staging = ws
        .vm_dir
        .join(format!("kernel/.{name}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&staging);
    fs::create_dir_all(&staging).context(format!("creating {}", staging.display()))?;
    fs::copy(&found.vmlinuz, staging.join("vmlinuz")).context("copying vmlinuz")?;
    for (_, path) in &found.modules {
        let file = path.file_name().expect("file name");
        fs::copy(path, staging.join(file)).context(format!("copying {}", path.display()))?;
    }
    let _ = fs::remove_dir_all(dest);
    fs::rename(&staging, dest).context(format!("moving the kernel into {}", dest.display()))
}

/// Runs `apt-get download name` in `dir` and returns the `.deb` it wrote.
fn fetch_deb(name: &str, dir: &Path) -> Result<PathBuf> {
    let out = process::output(
        Command::new("apt-get")
            .args(["download", "-q", name])
            .current_dir(dir),
    )?;
    if !out.status.success() {
        return Err(Error::new(format!(
            "`apt-get download {name}` failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    fs::read_dir(dir)
        .context(format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .ok_or_else(|| Error::new(format!("`apt-get download {name}` wrote no .deb file")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_apt_cache_depends() {
        let text = "linux-image-amd64\n  Depends: linux-image-6.1.0-56-amd64\n";
        assert_eq!(
            parse_apt_cache_depends(text).as_deref(),
            Some("linux-image-6.1.0-56-amd64")
        );
        let alt = "linux-image-amd64\n |Depends: linux-image-6.12.9-amd64\n  Depends: <linux-image-6.1.0-1-amd64>\n";
        assert_eq!(
            parse_apt_cache_depends(alt).as_deref(),
            Some("linux-image-6.12.9-amd64")
        );
        let virt = "linux-image-amd64\n  Depends: <linux-image-6.1.0-1-amd64>\n  Recommends: firmware-linux-free\n";
        assert_eq!(parse_apt_cache_depends(virt), None);
        assert_eq!(parse_apt_cache_depends(""), None);
        assert_eq!(
            parse_apt_cache_depends("W: Unable to locate package linux-image-amd64\n"),
            None
        );
    }

    #[test]
    fn package_names() {
        assert!(plausible_package_name("linux-image-6.1.0-56-amd64"));
        assert!(!plausible_package_name("../x"));
        assert!(!plausible_package_name("a/b"));
        assert!(!plausible_package_name(""));
    }

    #[test]
    fn finds_modules_in_a_tree() {
        let dir = std::env::temp_dir().join(format!("xtask-kernel-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let kdir = dir.join("lib/modules/6.1.0-56-amd64/kernel");
        fs::create_dir_all(dir.join("boot")).unwrap();
        fs::write(dir.join("boot/vmlinuz-6.1.0-56-amd64"), b"image").unwrap();
        for (i, m) in all_modules().enumerate() {
            let sub = kdir.join(format!("d{i}"));
            fs::create_dir_all(&sub).unwrap();
            let ext = if m == "dummy" { "ko.xz" } else { "ko" };
            fs::write(sub.join(format!("{m}.{ext}")), m.as_bytes()).unwrap();
        }
        let k = find_in_tree(&dir, "test").unwrap();
        assert_eq!(k.vmlinuz, dir.join("boot/vmlinuz-6.1.0-56-amd64"));
        let names: Vec<&str> = k.modules.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, all_modules().collect::<Vec<_>>());
        assert!(k.modules[MODULES.len() - 1].1.ends_with("dummy.ko.xz"));
        assert_eq!(read_module(&k.modules[0].1).unwrap(), b"crc32_generic");

        // A 6.12-style tree: virtio built in, fscache merged into netfs.
        fs::remove_file(kdir.join("d5/virtio_pci.ko")).unwrap();
        fs::remove_file(kdir.join("d7/fscache.ko")).unwrap();
        let k = find_in_tree(&dir, "test").unwrap();
        assert!(!k
            .modules
            .iter()
            .any(|(n, _)| n == "virtio_pci" || n == "fscache"));
        assert!(k.modules.iter().any(|(n, _)| n == "rdma_rxe"));

        fs::remove_file(kdir.join("d15/rdma_rxe.ko")).unwrap();
        let err = find_in_tree(&dir, "test").unwrap_err().to_string();
        assert!(err.contains("rdma_rxe"), "{err}");
        fs::remove_dir_all(&dir).unwrap();
    }
}
