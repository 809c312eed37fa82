//! The guest's initramfs: static busybox, the kernel modules and `/init`,
//! packed as a `newc` cpio archive and rewritten only when its bytes change.

use std::fs;
use std::path::{Path, PathBuf};

use crate::cpio::CpioWriter;
use crate::error::{Context, Error, Result};
use crate::kernel::{self, Kernel};
use crate::step;
use crate::workspace::Workspace;

/// The static busybox from Debian's `busybox-static`.
pub const BUSYBOX: &str = "/bin/busybox";

/// The address the guest gives `dummy0`, which rxe0 sits on (a benchmarking
/// range; the guest has no NIC, so nothing leaves it).
pub const GUEST_IP: &str = "198.18.0.1";

/// The guest's `/init`, a busybox sh script. `@MODULES@` and `@NET_MODULES@` are
/// replaced by the module lists. Inputs come from the kernel command line (unknown `name=value`
/// parameters become init's environment): `xtask_script` (the script to run
/// in the host root, a host path), `xtask_root` (the workspace root),
/// `xtask_target` (the host's `target/`, mounted writable at the same path) and
/// `xtask_nonce` (tags the marker lines); with `xtask_net=<IPv4 address>` (one of
/// two hosts) rxe0 sits on the NIC `eth0` at that address instead of on `dummy0`.
const INIT_TEMPLATE: &str = r#"#!/bin/busybox sh
# /init of the Soft-RoCE guest, written by `cargo xtask` (xtask/src/initramfs.rs).
/bin/busybox --install -s /bin
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

say() { echo "xtask-guest: $*"; }
marker() { echo "@@XTASK-${xtask_nonce}:$1=$2@@"; }
die() {
    say "$*"
    marker SETUP-FAILED 1
    sync
    poweroff -f
    sleep 60
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
[ -n "$xtask_script" ] && [ -n "$xtask_root" ] && [ -n "$xtask_target" ] && [ -n "$xtask_nonce" ] ||
    die "the kernel command line lacks xtask_script, xtask_root, xtask_target or xtask_nonce"

for m in @MODULES@; do
    [ -e "/lib/modules/$m.ko" ] || continue # built in, or merged into another
    out=$(insmod "/lib/modules/$m.ko" 2>&1) || say "insmod $m failed: $out"
done

opts=trans=virtio,version=9p2000.L,msize=512000
mount -t 9p -o "$opts" host /host || die "cannot mount the host root (9p tag host)"
# A workspace under /tmp would vanish under the writable /tmp: keep it visible.
case "$xtask_root" in
/tmp/*) mkdir -p /ws && mount --bind "/host$xtask_root" /ws || die "cannot bind $xtask_root" ;;
esac
mount -t 9p -o "$opts" scratch /host/tmp || die "cannot mount the writable /tmp (9p tag scratch)"
case "$xtask_root" in
/tmp/*) mkdir -p "/host$xtask_root" && mount --move /ws "/host$xtask_root" ||
    die "cannot put $xtask_root back under /tmp" ;;
esac
mount -t 9p -o "$opts" target "/host$xtask_target" ||
    die "cannot mount the writable share of $xtask_target (9p tag target)"
mount -t proc proc /host/proc || die "cannot mount /host/proc"
mount -t sysfs sysfs /host/sys || die "cannot mount /host/sys"
mount -t devtmpfs devtmpfs /host/dev || die "cannot mount /host/dev"
mkdir -p /host/dev/pts /host/dev/shm
mount -t devpts devpts /host/dev/pts || say "cannot mount /host/dev/pts"
mount -t tmpfs tmpfs /host/dev/shm || say "cannot mount /host/dev/shm"

ip link set lo up
if [ -n "$xtask_net" ]; then
    # One of two hosts (xtask/src/hosts.rs): rxe0 on the virtio-net NIC, whose wire
    # leads to the other host's QEMU.
    for m in @NET_MODULES@; do
        out=$(insmod "/lib/modules/$m.ko" 2>&1) || say "insmod $m failed: $out"
    done
    netdev=eth0
    i=0
    until ip link show eth0 >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -gt 50 ] && die "no eth0: the virtio-net NIC did not appear (virtio_net loaded?)"
        usleep 100000
    done
    ip addr add "$xtask_net/24" dev eth0 || die "cannot give eth0 the address $xtask_net"
    # RoCE wants a lossless link; Debian's default qdisc, fq_codel, drops rxe's
    # packets as soon as the emulated NIC's queue delay passes 5 ms, which any
    # sustained transfer causes here. A plain FIFO drops only when full, and
    # this one is deep: rxe's responder sends a READ's whole reply at once, so
    # four concurrent 1 MiB READs (4,096 packets) overflowed 1,000 (docs/faults.md).
    # (Through the host's sh: busybox would run its own, smaller `tc` applet.)
    out=$(chroot /host /bin/sh -c 'tc qdisc replace dev eth0 root pfifo limit 10000' 2>&1) ||
        die "tc qdisc replace dev eth0 root pfifo failed: $out"
    ip link set eth0 up || die "cannot bring eth0 up"
    # Host a's NIC once stopped sending for good in CI (docs/faults.md). When the
    # kernel's watchdog first counts a transmit timeout, show what the NIC, its
    # interrupts and its qdisc looked like, twice 5 s apart, for the diagnosis.
    (
        s=/sys/class/net/eth0/statistics
        while sleep 5; do
            n=$(cat /sys/class/net/eth0/queues/tx-0/tx_timeout 2>/dev/null)
            [ "${n:-0}" -gt 0 ] 2>/dev/null || continue
            for look in 1 2; do
                say "eth0's transmit queue timed out ($n, look $look): tx_packets $(cat $s/tx_packets) tx_dropped $(cat $s/tx_dropped) rx_packets $(cat $s/rx_packets) rx_dropped $(cat $s/rx_dropped); interrupts: $(grep virtio /proc/interrupts | tr -s ' ' | tr '\n' ';'); qdisc: $(chroot /host tc -s qdisc show dev eth0 | tr '\n' ' ')"
                sleep 5
            done
            break
        done
    ) &
else
    netdev=dummy0
    ip link show dummy0 >/dev/null 2>&1 || die "no dummy0: the dummy module did not load"
    ip addr add @IP@/24 dev dummy0 || die "cannot give dummy0 an address"
    ip link set dummy0 up || die "cannot bring dummy0 up"
fi
out=$(chroot /host rdma link add rxe0 type rxe netdev $netdev 2>&1) ||
    die "rdma link add rxe0 type rxe netdev $netdev failed: $out; kernel says: $(dmesg | grep -i -e rxe -e rdma | tail -n 3)"
i=0
until grep -q ACTIVE /sys/class/infiniband/rxe0/ports/1/state 2>/dev/null &&
    ! grep -q '^0000:0000:0000:0000:0000:0000:0000:0000$' /sys/class/infiniband/rxe0/ports/1/gids/1 2>/dev/null; do
    i=$((i + 1))
    [ $i -gt 100 ] && { say "rxe0 port 1 is not ACTIVE with GID 1 after 10 s; going on"; break; }
    usleep 100000
done

# A responder's refusal (a key that no window or region matches) and its queue
# pair's move to the error state reach no completion on the responder's side, and
# rxe logs them only as dynamic debug: just those lines are turned on, so that a
# failed test's kernel log names the cause (docs/softroce.md).
if mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null; then
    for q in 'func check_rkey' 'format "moved to error state"'; do
        echo "module rdma_rxe $q +p" >/sys/kernel/debug/dynamic_debug/control ||
            say "cannot turn on rxe's debug lines ($q)"
    done
else
    say "no debugfs: rxe's responder errors will not show in the kernel log"
fi

# The kernel command line asks for the time-stamp counter (xtask/src/guest.rs); a
# kernel that refused it reads an emulated device at every clock reading.
clock=$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)
[ "$clock" = tsc ] ||
    say "the clock source is ${clock:-unknown}, not tsc: every clock reading is a slow system call here, so timings are not comparable (docs/softroce.md)"

chroot /host /bin/sh "$xtask_script"
marker SCRIPT-ENDED $?
sync
poweroff -f
sleep 60
"#;

/// The `/init` script for the module lists in [`kernel::MODULES`] and
/// [`kernel::NET_MODULES`].
pub fn init_script() -> String {
    INIT_TEMPLATE
        .replace("@MODULES@", &kernel::MODULES.join(" "))
        .replace("@NET_MODULES@", &kernel::NET_MODULES.join(" "))
        .replace("@IP@", GUEST_IP)
}

/// Whether an ELF file has no program interpreter (i.e. is statically linked).
/// `None` if it is not a 64-bit little-endian ELF file.
pub fn elf_is_static(bytes: &[u8]) -> Option<bool> {
    if bytes.get(..6)? != b"\x7fELF\x02\x01" {
        return None;
    }
    let u16_at = |o: usize| Some(u16::from_le_bytes(bytes.get(o..o + 2)?.try_into().ok()?));
    let u32_at = |o: usize| Some(u32::from_le_bytes(bytes.get(o..o + 4)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(bytes.get(o..o + 8)?.try_into().ok()?));
    let phoff = usize::try_from(u64_at(0x20)?).ok()?;
    let phentsize = usize::from(u16_at(0x36)?);
    let phnum = usize::from(u16_at(0x38)?);
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        if u32_at(phoff.checked_add(i.checked_mul(phentsize)?)?)? == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The bytes of the initramfs for `kernel`, with `busybox` as `/bin/busybox`.
pub fn build(kernel: &Kernel, busybox: &[u8]) -> Result<Vec<u8>> {
    let mut w = CpioWriter::new();
    for dir in [
        "bin",
        "dev",
        "lib",
        "lib/modules",
        "proc",
        "sys",
        "host",
        "tmp",
    ] {
        w.dir(dir, 0o755);
    }
    w.char_dev("dev/console", 0o600, 5, 1);
    w.char_dev("dev/null", 0o666, 1, 3);
    w.file("bin/busybox", 0o755, busybox);
    for (name, path) in &kernel.modules {
        let data = kernel::read_module(path)?;
        w.file(&format!("lib/modules/{name}.ko"), 0o644, &data);
    }
    w.file("init", 0o755, init_script().as_bytes());
    Ok(w.finish())
}

/// Makes sure `target/vm/initramfs.cpio` matches `kernel` and this xtask,
/// writing it only when its content changed, and returns its path.
pub fn ensure(ws: &Workspace, kernel: &Kernel) -> Result<PathBuf> {
    let busybox = fs::read(BUSYBOX).context(format!(
        "reading {BUSYBOX} (from Debian's busybox-static package)"
    ))?;
    if elf_is_static(&busybox) != Some(true) {
        return Err(Error::new(format!(
            "{BUSYBOX} is not a static x86-64 binary; install Debian's busybox-static \
             (`apt-get install busybox-static`, it replaces busybox)"
        )));
    }
    let bytes = build(kernel, &busybox)?;
    let path = ws.vm_dir.join("initramfs.cpio");
    if fs::read(&path).is_ok_and(|old| old == bytes) {
        step!("initramfs up to date ({})", ws.display(&path));
        return Ok(path);
    }
    step!(
        "writing initramfs {} ({} modules from {}, {:.1} MiB)",
        ws.display(&path),
        kernel.modules.len(),
        kernel.label,
        bytes.len() as f64 / (1024.0 * 1024.0)
    );
    write_atomically(&path, &bytes)?;
    Ok(path)
}

/// Writes `bytes` to a temporary file beside `path`, then renames it over `path`.
fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    fs::write(&tmp, bytes).context(format!("writing {}", tmp.display()))?;
    fs::rename(&tmp, path).context(format!("renaming {} to {}", tmp.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpio;

    #[test]
    fn init_script_loads_every_module_in_order() {
        let init = init_script();
        assert!(init.starts_with("#!/bin/busybox sh\n"));
        assert!(init.contains(&format!("for m in {}; do", kernel::MODULES.join(" "))));
        assert!(init.contains("crc32_generic virtio_ring"));
        for placeholder in ["@MODULES@", "@NET_MODULES@", "@IP@"] {
            assert!(!init.contains(placeholder), "{placeholder}");
        }
        assert!(init.contains("ip addr add 198.18.0.1/24 dev dummy0"));
        assert!(init.contains("netdev=dummy0\n"));
        assert!(init.contains("rdma link add rxe0 type rxe netdev $netdev"));
        assert!(init.contains(
            "for m in failover net_failover virtio_net sch_netem sch_prio cls_u32 act_gact; do"
        ));
        assert!(init.contains("ip addr add \"$xtask_net/24\" dev eth0"));
        // A guest whose kernel refused the time-stamp counter says so before the run.
        assert!(init.contains("[ \"$clock\" = tsc ] ||"));
    }

    #[test]
    fn archive_layout() {
        let dir = std::env::temp_dir().join(format!("xtask-initramfs-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let modules = kernel::MODULES
            .iter()
            .map(|m| {
                let p = dir.join(format!("{m}.ko"));
                fs::write(&p, m.as_bytes()).unwrap();
                (m.to_string(), p)
            })
            .collect();
        let k = Kernel {
            label: "test".into(),
            dir: dir.clone(),
            vmlinuz: dir.join("vmlinuz"),
            modules,
        };
        let bytes = build(&k, b"BUSYBOX").unwrap();
        let entries = cpio::reader::parse(&bytes).unwrap();
        let get = |n: &str| {
            entries
                .iter()
                .find(|e| e.name == n)
                .unwrap_or_else(|| panic!("{n}"))
        };
        assert_eq!(get("bin/busybox").data, b"BUSYBOX");
        assert_eq!(get("bin/busybox").mode(), cpio::S_IFREG | 0o755);
        assert_eq!(get("init").data, init_script().as_bytes());
        assert_eq!(get("lib/modules/rdma_rxe.ko").data, b"rdma_rxe");
        assert_eq!(get("dev/console").mode(), cpio::S_IFCHR | 0o600);
        assert_eq!(get("host").mode(), cpio::S_IFDIR | 0o755);
        assert_eq!(build(&k, b"BUSYBOX").unwrap(), bytes, "deterministic");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn static_elf_check() {
        assert_eq!(elf_is_static(b"#!/bin/sh"), None);
        // The test binary itself is dynamically linked on Debian.
        let me = fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(elf_is_static(&me), Some(false));
    }
}
