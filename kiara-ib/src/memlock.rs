//! The memlock limit against what the budgets let messages pin.
//!
//! Every buffer a peer's message is read into, and every view a message of ours
//! is read through, is registered: its pages count against the process's
//! `RLIMIT_MEMLOCK` (unless it has `CAP_IPC_LOCK`). Beyond the limit a peer's
//! message is refused as busy and a send fails; the transport says so once, at
//! its start, when the budgets allow more than the limit.

use crate::config::Config;

/// `CAP_IPC_LOCK` from `<linux/capability.h>`.
const CAP_IPC_LOCK: u32 = 14;

/// Bytes the process may pin, `None` when it is not bounded (no limit, or the
/// process has `CAP_IPC_LOCK`).
pub(crate) fn limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid `rlimit` for the kernel to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0
        || lim.rlim_cur == libc::RLIM_INFINITY
        || can_lock_any()
    {
        return None;
    }
    Some(lim.rlim_cur)
}

/// Whether the process has `CAP_IPC_LOCK` in its effective set.
fn can_lock_any() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// The line a transport logs at its start when the budgets let messages pin
/// more than `limit` (the process's memlock limit, if bounded).
pub(crate) fn warning(config: &Config, limit: Option<u64>) -> Option<String> {
    let limit = limit?;
    let pinnable = config
        .max_receiving_bytes_total
        .saturating_add(config.max_outstanding_bytes_total);
    (limit < pinnable).then(|| {
        format!(
            "the memlock limit ({} KiB) is below what messages may pin \
             (max_receiving_bytes_total + max_outstanding_bytes_total = {} KiB): the \
             peers' messages beyond it are refused as busy, and sends beyond it fail; \
             raise it (`ulimit -l`, or LimitMEMLOCK= for a systemd service) or lower \
             the budgets",
            limit >> 10,
            pinnable >> 10
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warning_names_both_figures_and_what_to_do() {
        let config = Config {
            max_receiving_bytes_total: 64 << 20,
            max_outstanding_bytes_total: 32 << 20,
            ..Config::default()
        };
        let line = warning(&config, Some(8 << 20)).expect("8 MiB is below 96 MiB");
        assert!(line.contains("(8192 KiB)"), "{line}");
        assert!(line.contains("= 98304 KiB"), "{line}");
        assert!(line.contains("ulimit -l"), "{line}");
        assert_eq!(warning(&config, Some(96 << 20)), None, "enough");
        assert_eq!(warning(&config, None), None, "not bounded");
    }

    #[test]
    fn the_limit_is_read_or_known_to_be_unbounded() {
        // Whatever this process may do, the answer agrees with getrlimit.
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid `rlimit` for the kernel to fill.
        let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) };
        assert_eq!(ret, 0);
        match limit() {
            Some(bytes) => assert_eq!(bytes, lim.rlim_cur),
            None => assert!(lim.rlim_cur == libc::RLIM_INFINITY || can_lock_any()),
        }
    }
}
