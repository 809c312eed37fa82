//! (a)-(d): reading after the acknowledgement, outside the announced bytes, with
//! another session's key, and by sweeping keys.

use super::*;

/// (a) A message cannot be read again once acknowledged: the attacker takes a bait
/// message, reads it, acknowledges it properly, waits until the server's send of it
/// has finished, and READs the same address with the same key again. Both ways the
/// server sends: a pooled buffer (which the pool hands out again) and a registered
/// region (which stays registered). Both ways to acknowledge: a plain SEND (the
/// server then invalidates the window itself) and kiara-ib's own SEND_WITH_INV of
/// the message's key.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_a_a_message_is_unreadable_after_its_ack() {
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        for (tag, mode, invalidating) in [
            (1, Mode::Pooled, false),
            (2, Mode::Region, false),
            (3, Mode::WholeRegion, false),
            (4, Mode::Pooled, true),
            (5, Mode::Region, true),
        ] {
            let how = if invalidating { "invalidating " } else { "" };
            let what = format!("re-reading bait {tag} ({mode:?}) after its {how}ACK");
            let (mut peer, d) = baited(dev, server, mode, 48 * KIB, tag);
            if invalidating {
                peer.ack_invalidating(d.msg_id, d.rkey);
            } else {
                peer.ack(d.msg_id);
            }
            server.wait_bait_done(tag);
            breaches.attempt(server, peer, d.remote(), &what);
        }
        breaches.check();
    });
}

/// A READ beyond a live descriptor, built from it.
type Probe = fn(&Descriptor) -> RemoteSlice;

/// (b) Nothing outside the announced bytes can be read: before them, straddling
/// either end, after them, with a larger length, the rest of the page. Each probe
/// runs on a fresh session (a refused READ ends it) whose live descriptor is read as
/// granted first. The bait is 40 000 bytes: pooled, it sits at the start of a
/// 64 KiB buffer; from the region, between marked neighbours.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_b_bytes_outside_the_announced_range_are_unreadable() {
    let probes: [(&str, Probe); 7] = [
        ("64 bytes before", |d| RemoteSlice {
            addr: d.addr - 64,
            len: 64,
            ..d.remote()
        }),
        ("straddling the start", |d| RemoteSlice {
            addr: d.addr - 64,
            len: 128,
            ..d.remote()
        }),
        ("64 bytes after", |d| RemoteSlice {
            addr: d.addr + d.len,
            len: 64,
            ..d.remote()
        }),
        ("straddling the end", |d| RemoteSlice {
            addr: d.addr + d.len - 64,
            len: 128,
            ..d.remote()
        }),
        ("one byte more", |d| RemoteSlice {
            len: d.len + 1,
            ..d.remote()
        }),
        ("twice the length", |d| RemoteSlice {
            len: 2 * d.len,
            ..d.remote()
        }),
        ("the page after", |d| RemoteSlice {
            addr: (d.addr + d.len + 4095) & !4095,
            len: 4096,
            ..d.remote()
        }),
    ];
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        let mut tag = 100;
        for mode in [Mode::Region, Mode::Pooled, Mode::WholeRegion] {
            for (name, probe) in &probes {
                tag += 1;
                let what = format!("reading {name} bait {tag} ({mode:?})");
                let (peer, d) = baited(dev, server, mode, 40_000, tag);
                breaches.attempt(server, peer, probe(&d), &what);
            }
        }
        breaches.check();
    });
}

/// (b, recycled) What a pooled buffer held before is not readable past a new
/// message: a good client's 64 KiB secret goes through the server, which reads it
/// into a pooled buffer and drops it; the attacker then takes a 40 000-byte bait,
/// which the server copies into a buffer of that class (the good clients' traffic
/// avoids it, so it is the secret's), and READs the rest of the buffer with the
/// live descriptor's key.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_b_a_recycled_buffer_shows_nothing_past_the_message() {
    with_victims(Config::default(), Plant::Drop, |server, dev| {
        let mut breaches = Breaches::default();
        let (peer, d) = baited(dev, server, Mode::Pooled, 40_000, 150);
        let rest = RemoteSlice {
            addr: d.addr + d.len,
            len: SECRET_LEN as u64 - d.len,
            ..d.remote()
        };
        breaches.attempt(
            server,
            peer,
            rest,
            "reading past bait 150 to the buffer's end",
        );
        breaches.check();
    });
}

/// (c) A key announced to one session is useless on another. The simplest honest
/// way to learn a key announced to someone else: the victim is a second session of
/// the same harness (to the server, a client like any other) that takes a bait
/// message and holds it unacknowledged, so its window is live; the attacker, on its
/// own session and queue pair, READs exactly the victim's address, length and key.
/// The victim reads its message before and after the attempt (it was readable to
/// its owner all along), acknowledges it, and the attacker then tries the stale key
/// as well.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_c_a_key_announced_to_another_session_is_useless() {
    with_victims(Config::default(), Plant::Keep, |server, dev| {
        let mut breaches = Breaches::default();
        let mut tag = 200;
        for mode in [Mode::Pooled, Mode::Region, Mode::WholeRegion] {
            tag += 1;
            let (mut victim, d) = baited(dev, server, mode, 60_000, tag);
            let what = format!("reading the victim's live bait {tag} ({mode:?})");
            let thief = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, thief, d.remote(), &what);
            victim.read_granted(&d, "the victim, after the attempt");
            victim.ack(d.msg_id);
            server.wait_bait_done(tag);
            let what = format!("reading the victim's acknowledged bait {tag} ({mode:?})");
            let thief = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, thief, d.remote(), &what);
            // The victim was not harmed: it still gets (and reads) what it asks for.
            let again = victim.request_bait(mode, 60_000, tag + 50);
            victim.read_granted(&again, "the victim, afterwards");
            victim.ack(again.msg_id);
            server.wait_bait_done(tag + 50);
        }
        breaches.check();
    });
}

/// (d) A key sweep finds nothing. The secret is planted where the attacker has the
/// best chance: the attacker takes a 64 KiB pooled bait, reads and acknowledges it,
/// and only once the server is done with that buffer does a good client send the
/// 64 KiB secret, which the server reads into a buffer of that same class (the
/// good clients' traffic avoids it) and keeps. Then the attacker tries, one fresh
/// session per probe (a refused READ ends a session):
/// - its own key and the keys 1..=64 either side (rxe gives a type 2 window's key
///   a new low byte per bind, one up: these are the window's past and future
///   keys), at the announced address;
/// - the same low byte at the 8 neighbouring indices either side (rxe keys are
///   index << 8 | byte: other windows' and memory regions' slots) and key 0 (what
///   rxe gives a region registered without remote access), at the announced address;
/// - its own key, the next one and key 0 at the likely addresses of the
///   neighbouring 64 KiB buffers.
///
/// The low byte of a fresh rxe key is random, so a sweep cannot cover every key of a
/// neighbouring index; (c) shows that even the exact key of another session is
/// useless, and (a) that the exact key of a finished message is.
#[test]
#[ignore = "needs an RDMA device: run `cargo xtask test`"]
fn hostile_d_a_key_sweep_finds_no_secret() {
    with_victims(Config::default(), Plant::Later, |server, dev| {
        let (mut peer, d) = baited(dev, server, Mode::Pooled, SECRET_LEN, 300);
        peer.ack(d.msg_id);
        server.wait_bait_done(300);
        drop(peer);
        let planted = server.plant_secret(b"KEEP");
        let own = d.rkey;
        let mut keys: Vec<u32> = (-64i64..=64).map(|k| own.wrapping_add(k as u32)).collect();
        keys.extend((1..=8u32).flat_map(|j| [own.wrapping_add(j << 8), own.wrapping_sub(j << 8)]));
        keys.push(0);
        let mut probes: Vec<RemoteSlice> = keys
            .iter()
            .map(|&rkey| RemoteSlice {
                addr: d.addr,
                len: 4096,
                rkey,
            })
            .collect();
        for rkey in [own, own.wrapping_add(1), 0] {
            for delta in [-0x11000i64, -0x10000, 0x10000, 0x11000] {
                probes.push(RemoteSlice {
                    addr: d.addr.wrapping_add(delta as u64),
                    len: 4096,
                    rkey,
                });
            }
        }
        let mut breaches = Breaches::default();
        for (i, probe) in probes.iter().enumerate() {
            let what = format!("sweep probe {i} of {} ({probe:x?})", probes.len());
            let peer = RawPeer::connect(dev, server.addr);
            breaches.attempt(server, peer, *probe, &what);
        }
        planted.0.disconnect(planted.1).unwrap();
        breaches.check();
    });
}
