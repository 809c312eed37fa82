//! Kernel trouble in a guest's console: the lines that explain a guest that
//! died or hung (a panic, an oops, a NIC whose transmit queue stopped), kept
//! apart from the console's tail so the error can still name them when they
//! came long before the end (`docs/faults.md` has the case that needed it).

/// The kinds of line kept, each by what a line of it contains.
const KINDS: &[&str] = &[
    "NETDEV WATCHDOG",
    "BUG:",
    "WARNING:",
    "RIP:",
    "Kernel panic",
];

/// The first line of each kind a guest's kernel printed, and how many it printed.
#[derive(Debug, Default)]
pub struct KernelTrouble {
    /// The first line of each kind, in the order they came.
    first: Vec<String>,
    /// Lines seen of each kind, in the order of [`KINDS`].
    counts: [usize; KINDS.len()],
}

impl KernelTrouble {
    /// Looks at one console line.
    pub fn see(&mut self, line: &str) {
        // The kernel's own lines carry its timestamp; programs' output does not.
        if !line.trim_start().starts_with('[') {
            return;
        }
        let Some(kind) = KINDS.iter().position(|k| line.contains(k)) else {
            return;
        };
        self.counts[kind] += 1;
        if self.counts[kind] == 1 {
            self.first.push(line.trim().to_string());
        }
    }

    /// The lines kept, for an error's message: empty if there were none.
    pub fn report(&self) -> String {
        if self.first.is_empty() {
            return String::new();
        }
        let mut s = "\nthe guest's kernel printed (the first line of each kind):".to_string();
        for line in &self.first {
            s.push_str("\n  | ");
            s.push_str(line);
            let kind = KINDS.iter().position(|k| line.contains(k));
            let more = kind.map_or(0, |k| self.counts[k] - 1);
            if more > 0 {
                s.push_str(&format!("  (and {more} more like it)"));
            }
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_of_each_kind_and_counts_the_rest() {
        let mut t = KernelTrouble::default();
        assert_eq!(t.report(), "");
        t.see("[  353.1] virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 5120 ms");
        t.see("test echo ... ");
        t.see("WARNING: a program's own line, not the kernel's");
        t.see("[  358.2] virtio_net virtio0 eth0: NETDEV WATCHDOG: CPU: 0: transmit queue 0 timed out 10240 ms");
        t.see("[  529.8] BUG: unable to handle page fault for address: 000000000000d050");
        t.see("[  529.8] RIP: 0010:rxe_skb_tx_dtor+0x16/0x50 [rdma_rxe]");
        t.see("[  529.9] RIP: 0010:clear_page_erms+0x7/0x10");
        t.see("[  529.9] Kernel panic - not syncing: Fatal exception in interrupt");
        let r = t.report();
        let lines: Vec<&str> = r.lines().skip(2).collect();
        assert_eq!(lines.len(), 4, "{r}");
        assert!(
            lines[0].contains("timed out 5120 ms  (and 1 more like it)"),
            "{r}"
        );
        assert!(lines[1].contains("BUG: unable to handle page fault"), "{r}");
        assert!(
            lines[2].contains("rxe_skb_tx_dtor") && lines[2].ends_with("(and 1 more like it)"),
            "{r}"
        );
        assert!(lines[3].ends_with("Fatal exception in interrupt"), "{r}");
        assert!(!r.contains("program"), "{r}");
    }
}
