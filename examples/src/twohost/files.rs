//! Test files that cross the wire: written on one host, checked on the other.

use std::path::Path;
use std::process::Command;

/// Writes `size` deterministic pseudo-random bytes (xorshift64) to `path`.
pub fn write_random_file(path: &Path, size: usize) {
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut data = Vec::with_capacity(size + 8);
    while data.len() < size {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(size);
    std::fs::write(path, &data).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// The SHA-256 of a file (hex), from coreutils' `sha256sum`.
pub fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("running sha256sum");
    assert!(
        out.status.success(),
        "sha256sum {}: {out:?}",
        path.display()
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let sum = text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string();
    assert_eq!(sum.len(), 64, "sha256sum printed {text}");
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_size_same_bytes_and_sum() {
        let dir = std::env::temp_dir().join(format!("twohost-files-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (a, b) = (dir.join("a"), dir.join("b"));
        write_random_file(&a, 1000);
        write_random_file(&b, 1000);
        assert_eq!(std::fs::read(&a).unwrap().len(), 1000);
        assert_eq!(sha256(&a), sha256(&b));
        write_random_file(&b, 999);
        assert_ne!(sha256(&a), sha256(&b));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
