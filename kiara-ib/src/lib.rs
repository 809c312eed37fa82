//! The KIARA InfiniBand transport (work in progress).
pub mod protocol;
