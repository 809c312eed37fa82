//! Two hosts on a virtual wire: what makes a guest one of a pair.
//!
//! Each of the two guests has one virtio-net NIC (`eth0`) whose QEMU backend is a
//! socket netdev on one TCP connection over this machine's loopback address:
//! xtask listens on a free port of 127.0.0.1, connects to it, turns Nagle's
//! algorithm off on both ends (`TCP_NODELAY`) and hands one end to each QEMU
//! (`-netdev socket,fd=3`). Every Ethernet frame one NIC sends travels over that
//! connection to the other; nothing leaves the machine. (QEMU's own
//! `listen=`/`connect=` leaves Nagle's algorithm on, and with delayed
//! acknowledgements every RDMA round trip then took about 45 ms.) In each guest rxe0 sits on `eth0` at a fixed address ([`Host::ip`]).
//! The guests share the workspace's `target/` as the single guest does, and a
//! per-run directory in it ([`HostNet::shared`], `XTASK_HOSTS_DIR` in the guest)
//! through which their scripts and tests coordinate. `crate::pair` boots and
//! supervises the two; `docs/two-hosts.md` is the user's view.

use std::path::PathBuf;

use crate::process::sh_quote;

/// One of the two hosts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Host {
    /// Host A: 198.18.1.1. Runs the clients in the tests.
    A,
    /// Host B: 198.18.1.2. Runs the servers in the tests.
    B,
}

/// Both hosts, A first.
pub const HOSTS: [Host; 2] = [Host::A, Host::B];

/// How long a host's script waits for the other host to come up.
const PEER_UP_SECS: u32 = 180;

impl Host {
    /// `a` or `b`: in messages, file names and `XTASK_HOST`.
    pub fn name(self) -> &'static str {
        match self {
            Host::A => "a",
            Host::B => "b",
        }
    }

    /// The address of its `eth0`, which rxe0 sits on (the benchmarking range
    /// 198.18.0.0/15, on a subnet of its own: the single guest uses 198.18.0.1).
    pub fn ip(self) -> &'static str {
        match self {
            Host::A => "198.18.1.1",
            Host::B => "198.18.1.2",
        }
    }

    /// The MAC address of its NIC (a locally administered QEMU address).
    pub fn mac(self) -> &'static str {
        match self {
            Host::A => "52:54:00:00:01:01",
            Host::B => "52:54:00:00:01:02",
        }
    }

    /// The other host.
    pub fn peer(self) -> Host {
        match self {
            Host::A => Host::B,
            Host::B => Host::A,
        }
    }

    /// Its index in [`HOSTS`].
    pub fn index(self) -> usize {
        match self {
            Host::A => 0,
            Host::B => 1,
        }
    }
}

/// The descriptor QEMU finds its end of the wire on.
pub const WIRE_FD: i32 = 3;

/// A guest's place on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNet {
    /// Which host the guest is.
    pub host: Host,
    /// This process's descriptor of the guest's end of the wire (a connected TCP
    /// socket on 127.0.0.1), which QEMU inherits as [`WIRE_FD`].
    pub wire_fd: i32,
    /// The directory both guests share (under `target/`, at the same path in both).
    pub shared: PathBuf,
}

impl HostNet {
    /// QEMU's arguments for the NIC and its end of the wire.
    pub fn qemu_args(&self) -> Vec<String> {
        vec![
            "-netdev".into(),
            format!("socket,id=wire,fd={WIRE_FD}"),
            "-device".into(),
            format!("virtio-net-pci,netdev=wire,mac={}", self.host.mac()),
        ]
    }

    /// Shell code exporting what the guest's commands see besides the single
    /// guest's variables: who they are, who the peer is, and the shared directory.
    pub fn env(&self) -> String {
        format!(
            "export XTASK_HOST={} XTASK_PEER={} PEER_IP={} XTASK_HOSTS_DIR={}\n",
            self.host.name(),
            self.host.peer().name(),
            self.host.peer().ip(),
            sh_quote(&self.shared.to_string_lossy()),
        )
    }

    /// Shell code run before the command: says this host is up, waits for the
    /// peer to be up too, then checks that the wire carries a ping. `fail` is
    /// the shell command reporting a setup failure.
    pub fn barrier(&self, fail: &str) -> String {
        let (me, peer) = (self.host.name(), self.host.peer().name());
        let peer_ip = self.host.peer().ip();
        let limit = PEER_UP_SECS * 10;
        format!(
            ": > \"$XTASK_HOSTS_DIR/{me}.up\"\n\
             i=0\n\
             until [ -e \"$XTASK_HOSTS_DIR/{peer}.up\" ]; do\n\
             \x20   i=$((i + 1))\n\
             \x20   if [ $i -gt {limit} ]; then echo 'xtask-guest: host {peer} did not come up within {PEER_UP_SECS} s'; {fail}; exit 1; fi\n\
             \x20   sleep 0.1\n\
             done\n\
             busybox ping -c 1 -w 20 {peer_ip} >/dev/null ||\n\
             \x20   {{ echo 'xtask-guest: host {me} cannot ping host {peer} ({peer_ip}) over the wire'; {fail}; exit 1; }}\n"
        )
    }

    /// Shell code run after the command, with its status in `$st`: leaves the
    /// status in the shared directory, where the peer's tests look for it.
    pub fn after(&self) -> String {
        format!(
            "echo $st > \"$XTASK_HOSTS_DIR/{}.exited\"\n",
            self.host.name()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_each_others_peers() {
        for h in HOSTS {
            assert_eq!(h.peer().peer(), h);
            assert_ne!(h.ip(), h.peer().ip());
            assert_eq!(HOSTS[h.index()], h);
        }
    }

    #[test]
    fn each_nic_has_its_end_of_the_wire() {
        let net = |host| HostNet {
            host,
            wire_fd: 7,
            shared: PathBuf::from("/w/target/vm/run/1/shared"),
        };
        assert_eq!(net(Host::A).qemu_args()[1], "socket,id=wire,fd=3");
        assert_eq!(
            net(Host::B).qemu_args()[3],
            "virtio-net-pci,netdev=wire,mac=52:54:00:00:01:02"
        );
        assert_eq!(
            net(Host::A).env(),
            "export XTASK_HOST=a XTASK_PEER=b PEER_IP=198.18.1.2 \
             XTASK_HOSTS_DIR=/w/target/vm/run/1/shared\n"
        );
    }

    #[test]
    fn barrier_waits_for_the_peer() {
        // Run A's barrier on this machine with B already up and a ping that works.
        let dir = std::env::temp_dir().join(format!("xtask-barrier-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("b.up"), "").unwrap();
        let net = HostNet {
            host: Host::A,
            wire_fd: -1,
            shared: dir.clone(),
        };
        let script = format!(
            "busybox() {{ return 0; }}\n{}{}st=3\n{}",
            net.env(),
            net.barrier("echo FAIL"),
            net.after()
        );
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(&script)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        assert!(dir.join("a.up").exists());
        assert_eq!(
            std::fs::read_to_string(dir.join("a.exited")).unwrap(),
            "3\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
