//! The host's memory geometry, as registration sees it: the page size (what a
//! registration pins, whole) and the cache line (what perftest aligns slots to).

/// The size of a memory page in bytes (`sysconf(_SC_PAGESIZE)`), at least 4096.
pub fn page_size() -> usize {
    // SAFETY: sysconf only reads a system setting; it has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page).unwrap_or(0).max(4096)
}

/// The size of a level-1 data cache line in bytes
/// (`sysconf(_SC_LEVEL1_DCACHE_LINESIZE)`), 64 where the system does not say.
pub fn cache_line_size() -> usize {
    // SAFETY: as in `page_size`.
    let line = unsafe { libc::sysconf(libc::_SC_LEVEL1_DCACHE_LINESIZE) };
    match usize::try_from(line) {
        Ok(line) if line > 0 => line,
        _ => 64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_two() {
        assert!(page_size().is_power_of_two() && page_size() >= 4096);
        assert!(cache_line_size().is_power_of_two());
    }
}
