//! The properties, over random interleavings of honest and hostile operations.

use super::*;
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Honest peers: whatever the interleaving, everything is delivered, in order,
    /// once, no SEND ever meets an empty receive queue, and nothing is left over.
    #[test]
    fn honest_peers_deliver_everything_in_order(
        ops in prop::collection::vec(op(), 1..300),
        inv in any::<(bool, bool)>(),
    ) {
        let mut w = World::greeted(inv.0, inv.1, Duration::from_secs(3600));
        for op in &ops {
            if let Op::Tick(..) = op { continue; } // no timeouts between honest peers
            w.step(op);
        }
        w.quiesce();
        w.check_done();
    }

    /// Lies, closes and timeouts: never a panic, a delivery after close or a buffer
    /// released twice or early; a lying side is closed with the reason.
    #[test]
    fn lies_and_closes_lose_nothing_twice(
        ops in prop::collection::vec(hostile_op(), 1..300),
        inv in any::<(bool, bool)>(),
    ) {
        // A deadline the ticks may pass before the greeting arrives, or not.
        let mut w = World::greeted(inv.0, inv.1, Duration::from_secs(20));
        for op in &ops {
            w.step(op);
        }
        w.quiesce();
        w.check_closed();
    }
}
