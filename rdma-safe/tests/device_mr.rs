//! Device tests of memory regions: re-registration, regions over 4 GiB, and the
//! memlock limit turned into an error that says what to do. Run in the Soft-RoCE
//! guest by `cargo xtask test`.

mod common;
use common::fixture;

use rdma_safe::sys;
use rdma_safe::{Access, MemoryRegion, RemoteSlice, SendWr};
use std::process::Command;

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn rereg_access_grants_remote_write() {
    let f = fixture();
    let mut src = MemoryRegion::new(&f.pd, 256, Access::LOCAL_WRITE).unwrap();
    src.as_mut_slice().unwrap().fill(0x77);
    let mut target = MemoryRegion::new(&f.pd, 256, Access::LOCAL_WRITE).unwrap();

    let write = |target: &MemoryRegion| {
        let (a, _b) = f.pair();
        let mut sg = [src.local(0..256).unwrap()];
        let mut wr = SendWr::rdma_write(1, &mut sg, target.remote(0..256).unwrap()).signaled();
        // SAFETY: both regions outlive the completion polled below.
        unsafe { a.post_send(&mut wr) }.unwrap();
        f.completions(1)[0]
    };
    // Registered without REMOTE_WRITE: the peer's WRITE is refused.
    let wc = write(&target);
    assert_eq!(wc.status(), sys::ibv_wc_status::IBV_WC_REM_ACCESS_ERR);
    assert!(target.to_vec().iter().all(|&b| b == 0));

    match target.rereg_access(Access::LOCAL_WRITE | Access::REMOTE_WRITE) {
        Ok(()) => assert!(target.access().contains(Access::REMOTE_WRITE)),
        Err(err) if err.errno() == Some(libc::EOPNOTSUPP) => {
            // Soft-RoCE (Linux 6.1) has no rereg: the error must say what to do, and
            // the region must be as before; a new registration gives the access.
            let text = err.to_string();
            assert!(text.contains("register a new region"), "{text}");
            assert_eq!(target.access(), Access::LOCAL_WRITE);
            target =
                MemoryRegion::new(&f.pd, 256, Access::LOCAL_WRITE | Access::REMOTE_WRITE).unwrap();
        }
        Err(err) => panic!("{err}"),
    }
    let wc = write(&target);
    wc.result().unwrap();
    assert!(target.to_vec().iter().all(|&b| b == 0x77));
}

/// A virtual range of `total` bytes made of one `chunk`-byte memfd mapped over and
/// over: a region larger than 4 GiB that costs only `chunk` bytes of memory.
struct Aliased {
    base: *mut u8,
    total: usize,
}

impl Aliased {
    fn new(chunk: usize, copies: usize) -> Aliased {
        let total = chunk * copies;
        // SAFETY: plain libc calls; every result is checked; the mappings are unmapped
        // in Drop.
        unsafe {
            let fd = libc::memfd_create(c"rdma-alias".as_ptr(), 0);
            assert!(fd >= 0, "memfd_create: {}", std::io::Error::last_os_error());
            assert_eq!(libc::ftruncate(fd, chunk as libc::off_t), 0);
            let base = libc::mmap(
                std::ptr::null_mut(),
                total,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
            assert_ne!(base, libc::MAP_FAILED, "reserving {total} bytes");
            for i in 0..copies {
                let at = libc::mmap(
                    base.cast::<u8>().add(i * chunk).cast(),
                    chunk,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    fd,
                    0,
                );
                assert_ne!(at, libc::MAP_FAILED, "mapping copy {i}");
            }
            libc::close(fd);
            Aliased {
                base: base.cast(),
                total,
            }
        }
    }
}

impl Drop for Aliased {
    fn drop(&mut self) {
        // SAFETY: the whole range was mapped in `new`; the region is dropped first.
        unsafe { libc::munmap(self.base.cast(), self.total) };
    }
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn regions_over_4_gib_are_addressed_beyond_4_gib() {
    let f = fixture();
    const CHUNK: usize = 64 << 20;
    let aliased = Aliased::new(CHUNK, 66); // 4 GiB + 128 MiB
                                           // SAFETY: the mapping outlives the region (declared before it, dropped after).
    let big = unsafe {
        MemoryRegion::register_raw(&f.pd, aliased.base, aliased.total, Access::ALL_REMOTE)
    }
    .unwrap();
    assert!(big.len() > u32::MAX as usize, "{} bytes", big.len());
    let far = (4usize << 30) + 64 * 1024 + 123; // past 4 GiB, in the 65th copy
    let near = far % CHUNK; // the same bytes through the first copy

    let (a, _b) = f.pair();
    let mut src = MemoryRegion::new(&f.pd, 4096, Access::ALL_REMOTE).unwrap();
    let bytes: Vec<u8> = (0..4096).map(|i| (i % 199) as u8).collect();
    src.write_at(0, &bytes).unwrap();
    let remote = big.remote(far..far + 4096).unwrap();
    assert!(remote.addr - big.addr() > u32::MAX as u64);
    let mut sg = [src.local(0..4096).unwrap()];
    let mut wr = SendWr::rdma_write(1, &mut sg, remote).signaled();
    // SAFETY: both regions outlive the completion.
    unsafe { a.post_send(&mut wr) }.unwrap();
    f.completions(1)[0].result().unwrap();
    let mut landed = vec![0; 4096];
    big.read_at(near, &mut landed).unwrap();
    assert_eq!(landed, src.to_vec());

    // And back: READ from past 4 GiB into a fresh buffer.
    let back = MemoryRegion::new(&f.pd, 4096, Access::LOCAL_WRITE).unwrap();
    let mut sg = [back.local(0..4096).unwrap()];
    let mut wr = SendWr::rdma_read(2, &mut sg, remote).signaled();
    // SAFETY: as above.
    unsafe { a.post_send(&mut wr) }.unwrap();
    f.completions(1)[0].result().unwrap();
    assert_eq!(back.to_vec(), src.to_vec());

    // Out of the region's bounds is caught before any verb.
    assert!(big.remote(aliased.total - 10..aliased.total + 1).is_err());
    let _unused: RemoteSlice = remote;
}

/// `CAP_IPC_LOCK` from `<linux/capability.h>`.
const CAP_IPC_LOCK: libc::c_ulong = 14;

/// Marks the child process of the memlock test.
const MEMLOCK_CHILD: &str = "RDMA_SAFE_MEMLOCK_CHILD";

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn memlock_limit_is_reported_with_what_to_do() {
    if std::env::var_os(MEMLOCK_CHILD).is_some() {
        // In the child: 64 KiB of locked memory allowed, no CAP_IPC_LOCK.
        let f = fixture();
        let err = MemoryRegion::new(&f.pd, 8 << 20, Access::LOCAL_WRITE).unwrap_err();
        println!("MEMLOCK-ERROR: {err}");
        assert_eq!(err.errno(), Some(libc::ENOMEM), "{err}");
        return;
    }
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args([
            "--exact",
            "memlock_limit_is_reported_with_what_to_do",
            "--include-ignored",
            "--nocapture",
        ])
        .env(MEMLOCK_CHILD, "1");
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        use std::os::unix::process::CommandExt;
        child.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 64 * 1024,
                rlim_max: 64 * 1024,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Root would bypass the limit with CAP_IPC_LOCK: drop it from the bounding
            // set, so the exec'd child has it in no set. (Fails harmlessly as non-root.)
            libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
            Ok(())
        });
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child failed: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("MEMLOCK-ERROR: "))
        .unwrap_or_else(|| panic!("no error line in: {stdout}"));
    assert!(line.contains("ibv_reg_mr failed"), "{line}");
    assert!(line.contains("ulimit -l"), "{line}");
    assert!(
        line.contains("64 KiB"),
        "the hint shows the current limit: {line}"
    );
}

#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn read_views_are_kept_per_range_and_bounded() {
    let f = fixture();
    let region = MemoryRegion::new(&f.pd, 16 << 10, Access::LOCAL_WRITE | Access::MW_BIND).unwrap();
    // SAFETY: every view handle below is dropped before `region` (no window is bound).
    let view = |range: std::ops::Range<usize>| unsafe { region.read_view(range) }.unwrap();
    let first = view(0..4096);
    assert!(first.registered);
    assert_eq!(first.view.len(), 4096);
    assert_eq!(first.view.window_rights(), Access::REMOTE_READ);
    assert!(!first.view.remotely_writable());
    let again = view(0..4096);
    assert!(!again.registered, "the same range reuses its view");
    assert!(std::sync::Arc::ptr_eq(&first.view, &again.view));
    // The view starts at the range's first byte.
    let other = view(4096..6000);
    assert!(other.registered);
    assert_eq!(
        other.view.remote(0..1).unwrap().addr,
        region.remote(4096..4097).unwrap().addr
    );
    // A range outside the region is refused, not registered.
    // SAFETY: as above.
    assert!(unsafe { region.read_view(0..(16 << 10) + 1) }.is_err());
    // Only the newest READ_VIEWS_KEPT ranges are kept: 0..4096 is the oldest.
    for k in 0..rdma_safe::mr::READ_VIEWS_KEPT {
        assert!(view(8192 + k..8192 + k + 1).registered);
    }
    assert!(view(0..4096).registered, "the oldest range was let go");
    // Let go of while held, a view is still watched by its region: no caller ever
    // holds the only handle (to write through it, or widen it) while the region lives.
    let mut held = first.view.clone();
    drop((first, again));
    assert_eq!(
        std::sync::Arc::strong_count(&held),
        2,
        "held here and by the region"
    );
    assert!(std::sync::Arc::get_mut(&mut held).is_none());
    assert!(view(1..2).registered);
    assert!(std::sync::Arc::get_mut(&mut held).is_none());
    // A view that is not kept: fresh each time, read-only like the kept ones.
    // SAFETY: dropped before `region`, no window bound.
    let loose = unsafe { region.new_read_view(&f.pd, 0..4096) }.unwrap();
    assert_eq!(loose.len(), 4096);
    assert_eq!(loose.window_rights(), Access::REMOTE_READ);
    assert!(
        !view(0..4096).registered,
        "new_read_view leaves the kept views alone"
    );
    drop((held, other, loose));
    drop(region);
}
