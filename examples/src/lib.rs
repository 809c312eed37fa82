//! Shared helpers of the example programs.
pub mod c_args;
pub mod cm;
pub mod file_transfer;
pub mod kiara;
pub mod perftest;
pub mod pingpong;
pub mod stats;
pub mod tcp;
pub mod twohost;
pub mod wire;
