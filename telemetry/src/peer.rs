//! Which user owns the other end of a TCP connection from this host, asked
//! of the kernel.
//!
//! A connection from this host (loopback, or from one of this host's own
//! addresses) has its other end in this network namespace, and the kernel
//! knows that socket's owner. [`Owners::peer_uid`] asks by the connection's exact
//! four-tuple over `NETLINK_SOCK_DIAG` (an `inet_diag` lookup, the
//! interface `ss` uses; no privilege needed), and falls back to the
//! `/proc/net/tcp` and `/proc/net/tcp6` tables (the row whose local address
//! is the peer's and remote address ours) where netlink is unavailable.
//!
//! The peer's socket exists before `accept` returns (the client's side is
//! established first), but a client may already have closed it. A closed
//! socket lingers in the kernel's tables (FIN_WAIT2, TIME_WAIT) with uid 0
//! and no inode, so only a socket that still has an inode (a descriptor
//! holds it) names an owner: otherwise there is none, and the connection
//! is refused (else another user could connect, send a request and close at
//! once, and pass as root). An IPv4 peer on a dual-stack
//! listener is seen as `::ffff:a.b.c.d`; the kernel files both IPv4
//! sockets and IPv6 sockets talking IPv4 in its IPv4 table, which the IPv4
//! lookup (by the unmapped addresses) and the kernel's own handling of
//! mapped addresses in an IPv6 lookup both reach.
//!
//! The netlink socket is opened once per store, when it starts: a lookup
//! then needs no new descriptor, so it still works when the agent is at its
//! descriptor limit (a connection just accepted took the last one).
//!
//! Parsing the replies is pure ([`parse_diag_reply`], [`parse_proc_net_tcp`])
//! and unit-tested; the kernel's answers are untrusted in the sense that a
//! malformed one yields no owner, never a panic.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::sync::Mutex;

/// An IPv4 address in IPv6 clothing (`::ffff:a.b.c.d`, how a dual-stack
/// socket shows an IPv4 peer) as the IPv4 address.
pub fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Whether a connection from `peer` to `local` comes from this host: a
/// loopback address, or the address it was made to.
pub fn on_this_host(peer: IpAddr, local: IpAddr) -> bool {
    let peer = canonical(peer);
    peer.is_loopback() || peer == canonical(local)
}

/// `SOCK_DIAG_BY_FAMILY`, the netlink message type of a socket lookup.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `NLMSG_ERROR`.
const NLMSG_ERROR: u16 = 2;
/// Size of `struct nlmsghdr`.
const NLMSG_HDR: usize = 16;
/// Offset of `idiag_uid` in `struct inet_diag_msg` (`idiag_inode` follows).
const DIAG_UID_AT: usize = 4 + 48 + 12;

/// Asks the kernel who owns the other end of a connection.
#[derive(Debug)]
pub struct Owners {
    /// The netlink socket and the last request's sequence number (`None`:
    /// netlink is unavailable, `/proc/net/tcp` is read instead).
    diag: Option<Mutex<(OwnedFd, u32)>>,
}

impl Owners {
    /// Opens the netlink socket lookups use.
    pub fn open() -> Self {
        use nix::sys::socket::{socket, AddressFamily, SockFlag, SockProtocol, SockType};
        let diag = socket(
            AddressFamily::Netlink,
            SockType::Datagram,
            SockFlag::SOCK_CLOEXEC,
            SockProtocol::NetlinkSockDiag,
        )
        .ok()
        .map(|fd| Mutex::new((fd, 0)));
        Self { diag }
    }

    /// The owner of the socket at `peer` connected to `local`, or `None` if
    /// the kernel knows no such socket (closed, or not on this host), or
    /// cannot be asked.
    pub fn peer_uid(&self, peer: SocketAddr, local: SocketAddr) -> Option<u32> {
        let peer = SocketAddr::new(canonical(peer.ip()), peer.port());
        let local = SocketAddr::new(canonical(local.ip()), local.port());
        let asked = self.diag.as_ref().map(|d| {
            let mut d = d.lock().unwrap_or_else(|e| e.into_inner());
            d.1 = d.1.wrapping_add(1);
            let seq = d.1;
            diag_uid(&d.0, peer, local, seq)
        });
        match asked {
            Some(Ok(found)) => found,
            _ => proc_uid(peer, local),
        }
    }
}

/// The `inet_diag` request for the socket whose local end is `src` and
/// remote end `dst` (a netlink message, header included).
pub fn diag_request(src: SocketAddr, dst: SocketAddr, seq: u32) -> Vec<u8> {
    let family = match (src.ip(), dst.ip()) {
        (IpAddr::V4(_), IpAddr::V4(_)) => nix::libc::AF_INET,
        _ => nix::libc::AF_INET6,
    };
    let addr = |ip: IpAddr| -> [u8; 16] {
        match (family, ip) {
            (nix::libc::AF_INET, IpAddr::V4(v4)) => {
                let mut a = [0; 16];
                a[..4].copy_from_slice(&v4.octets());
                a
            }
            (_, IpAddr::V4(v4)) => v4.to_ipv6_mapped().octets(),
            (_, IpAddr::V6(v6)) => v6.octets(),
        }
    };
    let mut m = Vec::with_capacity(NLMSG_HDR + 56);
    m.extend_from_slice(&((NLMSG_HDR + 56) as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&(nix::libc::NLM_F_REQUEST as u16).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    // struct inet_diag_req_v2
    m.extend_from_slice(&[family as u8, nix::libc::IPPROTO_TCP as u8, 0, 0]);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // every state
                                                  // struct inet_diag_sockid: ports and addresses in network order
    m.extend_from_slice(&src.port().to_be_bytes());
    m.extend_from_slice(&dst.port().to_be_bytes());
    m.extend_from_slice(&addr(src.ip()));
    m.extend_from_slice(&addr(dst.ip()));
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    m
}

/// The owner in the reply to request `seq`: `Ok(Some(uid))`, `Ok(None)` if
/// the kernel has no such socket, `Err(())` if the reply says nothing usable.
#[allow(clippy::result_unit_err)]
pub fn parse_diag_reply(reply: &[u8], seq: u32) -> Result<Option<u32>, ()> {
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_ne_bytes(reply.get(at..at + 4)?.try_into().ok()?))
    };
    let len = u32_at(0).ok_or(())? as usize;
    let kind = u16::from_ne_bytes(reply.get(4..6).ok_or(())?.try_into().map_err(|_| ())?);
    if len > reply.len() || len < NLMSG_HDR || u32_at(8) != Some(seq) {
        return Err(());
    }
    match kind {
        NLMSG_ERROR => {
            let errno = u32_at(NLMSG_HDR).ok_or(())? as i32;
            match -errno {
                nix::libc::ENOENT => Ok(None),
                _ => Err(()),
            }
        }
        SOCK_DIAG_BY_FAMILY => {
            if len < NLMSG_HDR + DIAG_UID_AT + 8 {
                return Err(());
            }
            let uid = u32_at(NLMSG_HDR + DIAG_UID_AT).ok_or(())?;
            let inode = u32_at(NLMSG_HDR + DIAG_UID_AT + 4).ok_or(())?;
            // No inode: closed by its process (its uid reads 0, not its owner's).
            Ok((inode != 0).then_some(uid))
        }
        _ => Err(()),
    }
}

/// Asks the kernel over `NETLINK_SOCK_DIAG`, on `fd`.
fn diag_uid(
    fd: &OwnedFd,
    peer: SocketAddr,
    local: SocketAddr,
    seq: u32,
) -> Result<Option<u32>, ()> {
    use nix::sys::socket::{recv, sendto, MsgFlags, NetlinkAddr};
    use std::os::fd::AsRawFd;
    let req = diag_request(peer, local, seq);
    let sent = sendto(
        fd.as_raw_fd(),
        &req,
        &NetlinkAddr::new(0, 0),
        MsgFlags::empty(),
    )
    .map_err(|_| ())?;
    if sent != req.len() {
        return Err(());
    }
    // The kernel answers within sendto, so the reply is already queued:
    // never block for it. A reply to an earlier request (none is expected)
    // is skipped.
    let mut reply = [0u8; 1024];
    for _ in 0..8 {
        let n = recv(fd.as_raw_fd(), &mut reply, MsgFlags::MSG_DONTWAIT).map_err(|_| ())?;
        let got = &reply[..n];
        let seq_of = got
            .get(8..12)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap_or([0; 4])));
        if seq_of == Some(seq) {
            return parse_diag_reply(got, seq);
        }
    }
    Err(())
}

/// Looks the connection up in `/proc/net/tcp{,6}`.
fn proc_uid(peer: SocketAddr, local: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().find_map(|p| {
        let table = std::fs::read_to_string(p).ok()?;
        parse_proc_net_tcp(&table, peer, local)
    })
}

/// The uid of the row of a `/proc/net/tcp` or `/proc/net/tcp6` table whose
/// local address is `src` and remote address `dst` (IPv4 rows match IPv4
/// addresses; IPv6 rows match IPv6 addresses and the mapped forms of IPv4
/// ones), if its socket still has an inode (is not closed).
pub fn parse_proc_net_tcp(table: &str, src: SocketAddr, dst: SocketAddr) -> Option<u32> {
    table.lines().skip(1).find_map(|row| {
        let f: Vec<&str> = row.split_whitespace().collect();
        let (l, r, uid, inode) = (f.get(1)?, f.get(2)?, f.get(7)?, f.get(9)?);
        if proc_addr(l)? != src || proc_addr(r)? != dst || *inode == "0" {
            return None;
        }
        uid.parse().ok()
    })
}

/// `0100007F:1F90` (IPv4) or 32 hex digits and a port (IPv6): each 32-bit
/// word of the address printed as a number in the kernel's byte order.
fn proc_addr(s: &str) -> Option<SocketAddr> {
    let (addr, port) = s.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    if addr.len() % 8 != 0 || !addr.is_ascii() {
        return None;
    }
    for i in (0..addr.len()).step_by(8) {
        let word = u32::from_str_radix(&addr[i..i + 8], 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => canonical(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().expect("socket address")
    }

    #[test]
    fn the_request_names_the_exact_connection() {
        let r = diag_request(sa("127.0.0.1:40000"), sa("127.0.0.1:29500"), 7);
        assert_eq!(r.len(), 72);
        assert_eq!(u32::from_ne_bytes(r[0..4].try_into().expect("4 bytes")), 72);
        assert_eq!(r[16], nix::libc::AF_INET as u8);
        assert_eq!(&r[24..26], &40000u16.to_be_bytes(), "source port");
        assert_eq!(&r[26..28], &29500u16.to_be_bytes(), "destination port");
        assert_eq!(&r[28..32], &[127, 0, 0, 1]);
        assert_eq!(&r[64..72], &[0xff; 8], "no cookie");
        let v6 = diag_request(sa("[::1]:1"), sa("127.0.0.1:2"), 7);
        assert_eq!(v6[16], nix::libc::AF_INET6 as u8);
        assert_eq!(
            &v6[44..60],
            &std::net::Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets()
        );
    }

    #[test]
    fn replies_give_the_uid_no_socket_or_nothing_usable() {
        let mut found = vec![0u8; NLMSG_HDR + 72];
        let n = found.len() as u32;
        found[0..4].copy_from_slice(&n.to_ne_bytes());
        found[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        found[8..12].copy_from_slice(&7u32.to_ne_bytes());
        found[NLMSG_HDR + DIAG_UID_AT..][..4].copy_from_slice(&1001u32.to_ne_bytes());
        found[NLMSG_HDR + DIAG_UID_AT + 4..][..4].copy_from_slice(&4242u32.to_ne_bytes());
        assert_eq!(parse_diag_reply(&found, 7), Ok(Some(1001)));
        let mut closed = found.clone();
        closed[NLMSG_HDR + DIAG_UID_AT..][..8].fill(0);
        assert_eq!(
            parse_diag_reply(&closed, 7),
            Ok(None),
            "closed: uid 0, no inode"
        );
        assert_eq!(
            parse_diag_reply(&found, 8),
            Err(()),
            "another request's reply"
        );
        assert_eq!(parse_diag_reply(&found[..60], 7), Err(()), "truncated");
        let mut missing = vec![0u8; NLMSG_HDR + 20];
        let n = missing.len() as u32;
        missing[0..4].copy_from_slice(&n.to_ne_bytes());
        missing[4..6].copy_from_slice(&NLMSG_ERROR.to_ne_bytes());
        missing[8..12].copy_from_slice(&7u32.to_ne_bytes());
        missing[16..20].copy_from_slice(&(-nix::libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_diag_reply(&missing, 7), Ok(None));
        missing[16..20].copy_from_slice(&(-nix::libc::EPERM).to_ne_bytes());
        assert_eq!(parse_diag_reply(&missing, 7), Err(()));
        assert_eq!(parse_diag_reply(&[], 7), Err(()));
    }

    #[test]
    fn proc_net_tcp_rows_are_matched_by_both_ends() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1134 1\n\
   1: 0100007F:9C40 0100007F:1F90 01 00000000:00000000 00:00000000 00000000  1001        0 2222 1\n\
   2: 0100007F:1F90 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3333 1\n\
   3: 0100007F:9C41 0100007F:1F90 06 00000000:00000000 03:00001770 00000000     0        0 0 3\n";
        let (peer, ours) = (sa("127.0.0.1:40000"), sa("127.0.0.1:8080"));
        assert_eq!(parse_proc_net_tcp(v4, peer, ours), Some(1001));
        assert_eq!(parse_proc_net_tcp(v4, ours, peer), Some(0), "our own end");
        assert_eq!(parse_proc_net_tcp(v4, sa("127.0.0.1:1"), ours), None);
        assert_eq!(
            parse_proc_net_tcp(v4, sa("127.0.0.1:40001"), ours),
            None,
            "TIME_WAIT: no owner"
        );
        // An IPv6 socket talking IPv4: ::ffff:127.0.0.1, words in host order.
        let v6 = "  sl  local_address                         remote_address                        st\n\
   0: 0000000000000000FFFF00000100007F:9C40 0000000000000000FFFF00000100007F:1F90 01 00000000:00000000 00:00000000 00000000  1002        0 4444 1\n\
   1: 00000000000000000000000001000000:9C41 00000000000000000000000001000000:1F90 01 00000000:00000000 00:00000000 00000000  1003        0 5555 1\n";
        assert_eq!(parse_proc_net_tcp(v6, peer, ours), Some(1002));
        assert_eq!(
            parse_proc_net_tcp(v6, sa("[::1]:40001"), sa("[::1]:8080")),
            Some(1003)
        );
        assert_eq!(
            parse_proc_net_tcp("garbage\n: x y z\n1: zz:zz", peer, ours),
            None
        );
    }

    fn canon(a: SocketAddr) -> SocketAddr {
        SocketAddr::new(canonical(a.ip()), a.port())
    }

    #[test]
    fn the_kernel_names_the_owner_of_a_real_connection() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let c = std::net::TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (_s, peer) = l.accept().expect("accept");
        let local = l.local_addr().expect("addr");
        let me = nix::unistd::geteuid().as_raw();
        let owners = Owners::open();
        assert_eq!(owners.peer_uid(peer, local), Some(me));
        {
            let d = owners.diag.as_ref().expect("netlink").lock().expect("lock");
            assert_eq!(
                diag_uid(&d.0, peer, local, 77),
                Ok(Some(me)),
                "over netlink"
            );
            assert_eq!(diag_uid(&d.0, peer, local, 78), Ok(Some(me)), "again");
        }
        assert_eq!(proc_uid(peer, local), Some(me), "from /proc/net/tcp");
        assert_eq!(owners.peer_uid(local, peer), Some(me), "our own end, too");
        // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d, whether
        // the client's socket is IPv4 or IPv6 talking IPv4; and IPv6 itself.
        {
            let l6 = std::net::TcpListener::bind("[::]:0").expect("a dual-stack listener");
            let port = l6.local_addr().expect("addr").port();
            for to in [
                format!("127.0.0.1:{port}"),
                format!("[::ffff:127.0.0.1]:{port}"),
                format!("[::1]:{port}"),
            ] {
                let _c = std::net::TcpStream::connect(&to).expect("connect");
                let (s, peer) = l6.accept().expect("accept");
                let local = s.local_addr().expect("local");
                assert_eq!(owners.peer_uid(peer, local), Some(me), "to {to}: {peer}");
                assert_eq!(proc_uid(canon(peer), canon(local)), Some(me), "to {to}");
            }
        }
        // The client closes first: its socket lingers without an owner.
        drop(c);
        drop(_s);
        assert_eq!(
            owners.peer_uid(peer, local),
            None,
            "no owner once the client closed"
        );
        assert_eq!(proc_uid(peer, local), None, "in /proc/net/tcp either");
    }
}
