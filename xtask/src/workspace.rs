//! Where things are: the workspace root, its target directory and the guest cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Context, Error, Result};

/// The paths xtask works with, all derived from the workspace root.
#[derive(Debug, Clone)]
pub struct Workspace {
    /// The workspace root (the directory of the root `Cargo.toml`).
    pub root: PathBuf,
    /// `<root>/target`: cargo's output, and the guest's writable share.
    pub target: PathBuf,
    /// `<root>/target/vm`: kernel, initramfs and per-run scratch space.
    pub vm_dir: PathBuf,
}

impl Workspace {
    /// Finds the workspace root from `CARGO_MANIFEST_DIR` (set by `cargo run`,
    /// or baked in at build time) or else from `cargo locate-project --workspace`.
    pub fn locate() -> Result<Self> {
        let from_manifest = |dir: PathBuf| dir.parent().map(Path::to_path_buf);
        let runtime = std::env::var_os("CARGO_MANIFEST_DIR").map(PathBuf::from);
        let candidates = runtime
            .into_iter()
            .chain(std::iter::once(PathBuf::from(env!("CARGO_MANIFEST_DIR"))))
            .filter_map(from_manifest);
        for root in candidates {
            if root.join("Cargo.toml").is_file() && root.join("xtask").is_dir() {
                return Ok(Self::at(root));
            }
        }
        let out = Command::new(crate::cargo::cargo())
            .args(["locate-project", "--workspace", "--message-format", "plain"])
            .output()
            .context("running `cargo locate-project --workspace`")?;
        if !out.status.success() {
            return Err(Error::new(
                "cannot find the workspace root: run `cargo xtask` inside the workspace",
            ));
        }
        let manifest = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        let root = manifest
            .parent()
            .ok_or_else(|| Error::new("cargo locate-project printed no path"))?;
        Ok(Self::at(root.to_path_buf()))
    }

    /// The layout for a given workspace root.
    pub fn at(root: PathBuf) -> Self {
        let target = root.join("target");
        let vm_dir = target.join("vm");
        Workspace {
            root,
            target,
            vm_dir,
        }
    }

    /// `path` relative to the workspace root when it lies inside it, for messages.
    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| path.display().to_string())
    }

    /// Creates `<root>/target/vm` if needed.
    pub fn ensure_vm_dir(&self) -> Result<()> {
        std::fs::create_dir_all(&self.vm_dir).context(format!("creating {}", self.vm_dir.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locate_finds_this_workspace() {
        let ws = Workspace::locate().unwrap();
        assert!(ws.root.join("xtask/Cargo.toml").is_file());
        assert_eq!(ws.vm_dir, ws.root.join("target/vm"));
        assert_eq!(
            ws.display(&ws.vm_dir.join("initramfs.cpio")),
            "target/vm/initramfs.cpio"
        );
        assert_eq!(ws.display(Path::new("/elsewhere")), "/elsewhere");
    }
}
