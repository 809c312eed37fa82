//! `--run_infinitely` (perftest's `run_iter_bw_infinitely` and, for SEND, its
//! `run_iter_bw_infinitely_server`): the bandwidth tests without an end. Every
//! `-D` seconds the sides that count print a row over what completed since the
//! last one, with no peak; the run ends only with an error (the peer gone, a
//! failed completion) or when the program is killed. Unlike perftest, whose
//! SEND server prints rows of zeros for ever once its client is gone, a side
//! that hears nothing for 30 s fails, as it does without the option.

use super::{average_report, bw_client_then, bw_server_recv_then, print_result, rdma_bw_server};
use crate::perftest::connect::Comm;
use crate::perftest::params::{Params, Verb};
use crate::perftest::protocol::KeyData;
use crate::perftest::run::timing::{warn_cpu_freq, Every};
use crate::perftest::run::{AnyResult, Side};

/// The test after the connection, rows every `every` seconds.
pub(super) fn run(side: &Side, mut comm: Comm, k0: &KeyData, every: u64) -> AnyResult<()> {
    let p = &side.p;
    let size = p.size;
    // Each loop's clock starts with it, as perftest's `tposted[0]` does.
    let rows = || Rows::new(side, every);
    match (p.verb, p.is_client, p.duplex) {
        (Verb::Send, client, _) => {
            // As for one size of the finite test: the receives, then the handshake
            // that starts the senders.
            if !client {
                side.post_initial_recvs(size)?;
            }
            comm.set_timeout(None);
            comm.handshake(k0)?;
            let mut rows = rows();
            if client {
                bw_client_then(side, size, |n| rows.print(n))?;
            } else {
                bw_server_recv_then(side, size, |n| rows.print(n))?;
            }
        }
        // READ and WRITE: the client, or both sides with -b, post at once; a
        // one-way server waits for the client's end, as without the option.
        (_, true, _) | (_, _, true) => {
            let mut rows = rows();
            bw_client_then(side, size, |n| rows.print(n))?;
        }
        (_, false, false) => return rdma_bw_server(comm, k0, p),
    }
    Err("the endless run ended".into())
}

/// The rows of one side: each over the messages counted since the last.
struct Rows<'a> {
    p: &'a Params,
    every: Every,
    /// With -b (READ and WRITE) a side's messages stand for twice their bytes and
    /// count (perftest's `run_inf_bi_factor`).
    factor: u64,
}

impl<'a> Rows<'a> {
    fn new(side: &'a Side, secs: u64) -> Rows<'a> {
        Rows {
            p: &side.p,
            every: Every::new(side.clock, secs),
            factor: if side.p.duplex { 2 } else { 1 },
        }
    }

    /// Prints a row once a period has passed, given the running count.
    #[inline(always)]
    fn print(&mut self, count: u64) -> AnyResult<()> {
        if let Some((n, secs)) = self.every.due(count) {
            // perftest reads the CPU's frequency for every row, and warns each time.
            warn_cpu_freq(self.p.args.cpu_freq);
            let gbits = self.p.args.report_gbits;
            let mut rep = average_report(self.p.size, n * self.factor, secs, gbits);
            rep.iters = n;
            print_result(self.p, &rep, None);
        }
        Ok(())
    }
}
