//! Small measurement helpers shared by the KIARA example programs.

/// The `p`-th percentile (0 to 100) of `sorted` (ascending), nearest rank; 0 for
/// an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// A process's memory as the kernel accounts it (`/proc/<pid>/status`), in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcMemory {
    /// Resident set (`VmRSS`).
    pub rss_kib: u64,
    /// Pinned pages (`VmPin`): registered memory on Soft-RoCE and most NICs.
    pub pinned_kib: u64,
}

impl ProcMemory {
    /// Reads `pid`'s (`None`: this process's) memory.
    pub fn read(pid: Option<u32>) -> std::io::Result<ProcMemory> {
        let path = match pid {
            Some(pid) => format!("/proc/{pid}/status"),
            None => "/proc/self/status".to_string(),
        };
        Ok(ProcMemory::parse(&std::fs::read_to_string(path)?))
    }

    /// The fields of a `/proc/<pid>/status` text (absent ones are 0).
    pub fn parse(status: &str) -> ProcMemory {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        ProcMemory {
            rss_kib: field("VmRSS:"),
            pinned_kib: field("VmPin:"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn proc_status_fields_are_read_in_kib() {
        let text = "Name:\tx\nVmPin:\t    2048 kB\nVmRSS:\t   10240 kB\n";
        assert_eq!(
            ProcMemory::parse(text),
            ProcMemory {
                rss_kib: 10240,
                pinned_kib: 2048
            }
        );
        assert_eq!(ProcMemory::parse(""), ProcMemory::default());
        let mine = ProcMemory::read(None).unwrap();
        assert!(mine.rss_kib > 0, "this process has resident memory");
    }
}
