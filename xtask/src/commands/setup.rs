//! `cargo xtask setup`: only put the guest's prerequisites in place.

use crate::error::Result;
use crate::workspace::Workspace;

/// Ensures packages, kernel and initramfs, and prints where they are.
pub fn run() -> Result<i32> {
    let ws = Workspace::locate()?;
    let assets = super::prepare_guest(&ws)?;
    let k = &assets.kernel;
    println!("kernel:     {} ({})", k.label, ws.display(&k.dir));
    println!("vmlinuz:    {}", ws.display(&k.vmlinuz));
    println!(
        "modules:    {} files in {}",
        k.modules.len(),
        ws.display(&k.dir)
    );
    println!("initramfs:  {}", ws.display(&assets.initramfs));
    println!(
        "guest runs: {} (removed after each run)",
        ws.display(&ws.vm_dir.join("run"))
    );
    Ok(0)
}
