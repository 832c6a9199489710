use super::*;
use crate::cli::AgentArgs;
use clap::Parser;

fn cfg(args: &[&str]) -> Config {
    let mut v = vec!["accel-agent"];
    v.extend_from_slice(args);
    v.push("t.py");
    let a = AgentArgs::try_parse_from(v).expect("syntax");
    crate::config::LaunchOptions::from(a)
        .build(&|_| None)
        .expect("valid")
}

fn c10d(endpoint: &str, extra: &[&str]) -> Config {
    let mut args = vec![
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-id",
        "j",
        "--rdzv-endpoint",
        endpoint,
    ];
    args.extend_from_slice(extra);
    cfg(&args)
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[test]
fn loopback_hosts() {
    for h in [
        "localhost",
        "LOCALHOST",
        "a.localhost",
        "127.0.0.1",
        "127.3.4.5",
        "::1",
        "[::1]",
    ] {
        assert!(is_loopback_host(h), "{h}");
    }
    for h in ["node1", "10.0.0.1", "::", "localhost.example.com"] {
        assert!(!is_loopback_host(h), "{h}");
    }
}

#[test]
fn what_each_mode_offers_and_binds() {
    let lo = Target::Ip(ip("127.0.0.1"));
    assert_eq!(plan(&cfg(&[]), "h"), ("127.0.0.1".into(), lo.clone()));
    // A job on loopback offers loopback, not the host name.
    assert_eq!(
        plan(&c10d("127.0.0.1:29400", &[]), "h"),
        ("127.0.0.1".into(), lo.clone())
    );
    assert_eq!(
        plan(&c10d("localhost", &[]), "h"),
        ("127.0.0.1".into(), lo.clone())
    );
    // --local-addr wins, a literal bound as is, a name resolved.
    assert_eq!(
        plan(&c10d("127.0.0.1", &["--local-addr", "10.1.2.3"]), "h"),
        ("10.1.2.3".into(), Target::Ip(ip("10.1.2.3")))
    );
    assert_eq!(
        plan(&c10d("head:29400", &["--local-addr", "[fd00::3]"]), "h"),
        ("[fd00::3]".into(), Target::Ip(ip("fd00::3")))
    );
    assert_eq!(
        plan(&c10d("head:29400", &[]), "node7"),
        (
            "node7".into(),
            Target::Name {
                name: "node7".into(),
                loopback_job: false
            }
        )
    );
    // Static: node rank 0 binds --master-addr; the others' offers are never used.
    let st = |rank: &str, addr: &str| {
        cfg(&[
            "--nnodes",
            "2",
            "--node-rank",
            rank,
            "--master-addr",
            addr,
            "--master-port",
            "29500",
        ])
    };
    assert_eq!(
        plan(&st("0", "10.0.0.9"), "h"),
        ("10.0.0.9".into(), Target::Ip(ip("10.0.0.9")))
    );
    assert_eq!(plan(&st("1", "10.0.0.9"), "h").1, lo);
    assert_eq!(
        plan(&st("0", "head"), "h").1,
        Target::Name {
            name: "head".into(),
            loopback_job: false
        }
    );
}

/// A base port with `n` free loopback ports from it.
fn free_range(n: u16) -> u16 {
    for _ in 0..200 {
        let base = 20_000 + fastrand::u16(..40_000);
        let held: Vec<_> = (base..base + n)
            .map_while(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok())
            .collect();
        if held.len() == n as usize {
            return base;
        }
    }
    panic!("no {n} free consecutive ports");
}

#[tokio::test]
async fn a_port_range_rotates_skips_busy_ports_and_says_when_all_are_busy() {
    let base = free_range(3);
    let range = PortRange {
        first: base,
        last: base + 2,
    };
    let mut b = StoreBinder::new(Some(range));
    let lo = ip("127.0.0.1");
    let port = |l: &TcpListener| l.local_addr().expect("addr").port();
    let first = b.bind_ip(lo).await.expect("first");
    let second = b.bind_ip(lo).await.expect("second");
    assert_eq!((port(&first), port(&second)), (base, base + 1));
    drop(first);
    // Rotation goes on from the last port taken, then wraps to the freed one.
    let third = b.bind_ip(lo).await.expect("third");
    assert_eq!(port(&third), base + 2);
    let fourth = b.bind_ip(lo).await.expect("fourth");
    assert_eq!(port(&fourth), base);
    // Busy ports are skipped: base+1 is still held, base+2 too; base is held.
    let e = b.bind_ip(lo).await.expect_err("all busy");
    let msg = b.busy(lo, e).to_string();
    assert!(
        msg.contains(&format!(
            "every port of --rdzv-conf store_ports={base}-{} is in use on 127.0.0.1",
            base + 2
        )),
        "{msg}"
    );
    drop(second);
    assert_eq!(port(&b.bind_ip(lo).await.expect("freed")), base + 1);
}

#[tokio::test]
async fn names_bind_their_address_and_unusable_ones_fall_back_to_every_interface() {
    let mut b = StoreBinder::new(None);
    let l = b.bind_name("localhost", true).await.expect("bind");
    assert!(l.local_addr().expect("addr").ip().is_loopback());
    // Not a loopback job: localhost's loopback addresses are no use to other nodes.
    let l = b.bind_name("localhost", false).await.expect("bind");
    assert!(l.local_addr().expect("addr").ip().is_unspecified());
    assert!(b.warned_any);
}
