//! Shared helpers of the example programs.
pub mod perftest;
pub mod pingpong;
