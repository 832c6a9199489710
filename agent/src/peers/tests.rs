use super::*;

const MS: Duration = Duration::from_millis(1);

fn key() -> hmac::Key {
    hmac::Key::new(hmac::HMAC_SHA256, &[7u8; 32])
}

fn default_timing(nnodes: u32) -> Timing {
    let d = Duration::from_secs(15);
    Timing::new(
        d,
        Duration::from_secs(5),
        Duration::from_secs(900),
        d - 200 * MS,
        nnodes,
    )
}

#[test]
fn the_timing_follows_the_drop_limit_and_leaves_evidence_worth_having() {
    let t = default_timing(4);
    assert_eq!(t.every, 250 * MS);
    // A stall of up to 2 s keeps a node's run of contact.
    assert_eq!(t.fresh, 2000 * MS);
    // 7.5 s until the rendezvous counts a node silent, plus the hub's
    // staleness and slack.
    assert_eq!(t.lag, Duration::from_millis(7500 + 500 + 2000 + 150));
    assert!(
        t.fence_in > t.lag,
        "a ping keeps workers {:?} longer",
        t.fence_in - t.lag
    );
    // Tests' short limits: 3 s drop limit, 1 s keep-alives.
    let short = Timing::new(
        Duration::from_secs(3),
        Duration::from_secs(1),
        Duration::from_secs(60),
        Duration::from_millis(2800),
        2,
    );
    assert_eq!(short.every, 75 * MS);
    assert!(short.fence_in > short.lag);
    // A stall of a few pings does not break a node's run of contact: the
    // hub counts a ping for two thirds of the room the limit leaves...
    assert_eq!(short.fresh, Duration::from_nanos(666_666_666));
    assert!(short.fence_in - short.lag > 300 * MS);
    // ...and two and a half pings where it does not.
    let tight = Timing::new(
        Duration::from_secs(1),
        Duration::from_millis(500),
        Duration::from_secs(60),
        Duration::from_millis(900),
        2,
    );
    assert_eq!(tight.every, 25 * MS);
    assert_eq!(tight.fresh, tight.every * 5 / 2);
    // Large rounds ping less often.
    assert_eq!(default_timing(10_000).every, Duration::from_secs(1));
}

#[test]
fn evidence_never_outlives_the_outage_limit_from_the_last_contact() {
    let t = default_timing(2);
    let contact = Instant::now();
    // A ping right after the contact is worth less than the contact itself.
    assert_eq!(t.keeps_until(contact + MS, contact), None);
    let sent = contact + Duration::from_secs(60);
    assert_eq!(
        t.keeps_until(sent, contact),
        Some(sent - t.lag + t.fence_in)
    );
    let late = contact + Duration::from_secs(2000);
    assert_eq!(
        t.keeps_until(late, contact),
        Some(contact + t.outage),
        "capped at the outage limit less the margin"
    );
    assert_eq!(t.outage, Duration::from_secs(900) - 200 * MS);
}

#[test]
fn the_hub_counts_fresh_pings_and_refuses_replays_and_strangers() {
    let t0 = Instant::now();
    let mut hub = Hub::new(3, 500 * MS);
    assert_eq!(hub.answer(0, 0), (0, 1, Some(&[0u8][..]), 0));
    assert!(hub.ping(t0, 0, 1, true));
    assert!(hub.ping(t0, 2, 1, false));
    assert!(!hub.ping(t0, 2, 1, true), "a replayed sequence number");
    assert!(!hub.ping(t0, 3, 9, true), "a rank the round does not have");
    let (heard, version, map, _) = hub.answer(0, 1);
    assert_eq!((heard, map), (2, Some(&[0b101u8][..])));
    // A node that has this version gets no bitmap; the steady ranks other
    // than the asker's are counted.
    assert_eq!(hub.answer(version, 1), (2, version, None, 1));
    assert_eq!(hub.answer(version, 0), (2, version, None, 0));
    assert_eq!(hub.answer(version, 2), (2, version, None, 1));
    // Rank 2 turns steady, then goes quiet; rank 0 pings on, no longer steady.
    assert!(hub.ping(t0 + 100 * MS, 2, 2, true));
    assert_eq!(hub.answer(version, 1).3, 2);
    assert!(hub.ping(t0 + 400 * MS, 0, 2, false));
    assert_eq!(hub.answer(version, 1).3, 1);
    hub.sweep(t0 + 700 * MS);
    let (heard, v2, map, steady) = hub.answer(version, 1);
    assert_eq!((heard, map, steady), (1, Some(&[0b001u8][..]), 0));
    assert!(v2 > version);
}

/// A peer that hears the hub only since a moment ago has not vouched for
/// this node yet (its next keep-alive may come after the rendezvous dropped
/// it): it does not count towards this node's majority until its own run
/// of answers is a lag long (accel-sim seed 351244).
#[test]
fn only_steady_peers_make_a_majority() {
    let t0 = Instant::now();
    let (fresh, lag) = (500 * MS, Duration::from_secs(1));
    let mut hub = Hub::new(2, fresh);
    let mut own = View::new(0, 2, fresh);
    let mut peer = View::new(1, 2, fresh);
    let mut at = t0;
    // Node 0 (the hub's own node) pings for 1.5 s; node 1 is cut off.
    while at <= t0 + 1500 * MS {
        let steady = own.steady(at, lag);
        let (seq, have) = own.ping(at);
        assert!(hub.ping(at, 0, seq, steady));
        let (heard, v, map, others) = hub.answer(have, 0);
        own.answer(at, seq, heard, v, map, others);
        at += 250 * MS;
    }
    assert!(own.steady(at, lag));
    // Node 1 comes back: the hub hears both, but node 1 is not steady.
    let mut peer_at = at;
    for _ in 0..4 {
        let steady = peer.steady(peer_at, lag);
        let (seq, have) = peer.ping(peer_at);
        assert!(hub.ping(peer_at, 1, seq, steady));
        let (heard, v, map, others) = hub.answer(have, 1);
        peer.answer(peer_at, seq, heard, v, map, others);
        let (seq, have) = own.ping(peer_at);
        assert!(hub.ping(peer_at, 0, seq, true));
        let (heard, v, map, others) = hub.answer(have, 0);
        assert_eq!(heard, 2);
        own.answer(peer_at, seq, heard, v, map, others);
        assert_eq!(
            own.majority(peer_at, lag),
            None,
            "a peer heard only since {:?}",
            peer_at - at
        );
        peer_at += 250 * MS;
    }
    // A lag later, node 1 says it is steady: now it counts.
    while peer_at <= at + lag + 250 * MS {
        let steady = peer.steady(peer_at, lag);
        let (seq, have) = peer.ping(peer_at);
        hub.ping(peer_at, 1, seq, steady);
        let (heard, v, map, others) = hub.answer(have, 1);
        peer.answer(peer_at, seq, heard, v, map, others);
        let (seq, have) = own.ping(peer_at);
        hub.ping(peer_at, 0, seq, true);
        let (heard, v, map, others) = hub.answer(have, 0);
        own.answer(peer_at, seq, heard, v, map, others);
        peer_at += 250 * MS;
    }
    let (seq, have) = own.ping(peer_at);
    hub.ping(peer_at, 0, seq, true);
    let (heard, v, map, others) = hub.answer(have, 0);
    assert_eq!(others, 1);
    own.answer(peer_at, seq, heard, v, map, others);
    assert_eq!(own.majority(peer_at, lag), Some(peer_at));
}

#[test]
fn a_majority_heard_through_the_hub_is_evidence_dated_by_the_ping() {
    let t0 = Instant::now();
    let fresh = 500 * MS;
    // Node 1 of 3.
    let mut view = View::new(1, 3, fresh);
    let (seq, have) = view.ping(t0);
    assert_eq!(have, 0);
    // The hub hears nodes 0 and 1: two of three.
    assert!(view.answer(t0 + 10 * MS, seq, 2, 5, Some(&[0b011]), 1));
    // The run of answers is as old as the ping: worth nothing yet.
    assert_eq!(view.majority(t0 + 20 * MS, 50 * MS), None);
    assert_eq!(view.majority(t0 + 20 * MS, Duration::ZERO), Some(t0));
    assert_eq!(
        view.vouch(t0 + 20 * MS, 7),
        Some(Vouch {
            round: 7,
            ranks: vec![0b011],
            all: false
        })
    );
    // An answer to a ping never sent is ignored.
    assert!(!view.answer(t0, 99, 3, 6, Some(&[0b111]), 2));
    // Every node heard: the vouch names them all at O(1) cost.
    let (seq, have) = view.ping(t0 + 100 * MS);
    assert_eq!(have, 5);
    assert!(view.answer(t0 + 110 * MS, seq, 3, 6, Some(&[0b111]), 2));
    assert_eq!(
        view.vouch(t0 + 120 * MS, 7),
        Some(Vouch {
            round: 7,
            ranks: vec![],
            all: true
        })
    );
    // A run of 100 ms covers a lag of 100 ms.
    assert_eq!(view.majority(t0 + 120 * MS, 100 * MS), Some(t0 + 100 * MS));
    assert_eq!(view.majority(t0 + 120 * MS, 101 * MS), None);
    // The answer ages: no vouch, and no evidence once the run is stale.
    assert_eq!(view.vouch(t0 + 700 * MS, 7), None);
    assert_eq!(view.majority(t0 + 1200 * MS, Duration::ZERO), None);
}

#[test]
fn half_of_the_round_is_no_majority() {
    let t0 = Instant::now();
    let mut view = View::new(0, 2, 500 * MS);
    let (seq, _) = view.ping(t0);
    view.answer(t0, seq, 1, 2, Some(&[0b01]), 0);
    assert_eq!(view.majority(t0, Duration::ZERO), None, "1 of 2 nodes");
    // A round of one node is a majority of itself.
    let mut alone = View::new(0, 1, 500 * MS);
    let (seq, _) = alone.ping(t0);
    alone.answer(t0, seq, 1, 2, Some(&[0b1]), 0);
    assert_eq!(alone.majority(t0, Duration::ZERO), Some(t0));
    // The hub hears a majority, but not this node: it is not in it.
    let mut outside = View::new(2, 3, 500 * MS);
    let (seq, _) = outside.ping(t0);
    outside.answer(t0, seq, 2, 2, Some(&[0b011]), 1);
    assert_eq!(outside.majority(t0, Duration::ZERO), None);
}

#[test]
fn a_break_in_the_hub_contact_voids_the_evidence_until_a_new_run_is_a_lag_long() {
    let t0 = Instant::now();
    let fresh = 500 * MS;
    let lag = Duration::from_secs(1);
    let mut view = View::new(0, 1, fresh);
    let mut at = t0;
    while at <= t0 + 1500 * MS {
        let (seq, _) = view.ping(at);
        view.answer(at, seq, 1, 2, Some(&[1]), 0);
        at += 250 * MS;
    }
    assert_eq!(view.majority(t0 + 1500 * MS, lag), Some(t0 + 1500 * MS));
    // Cut off from the hub for 2.5 s (more than `fresh`), then back.
    let back = t0 + Duration::from_secs(4);
    let (seq, _) = view.ping(back);
    view.answer(back, seq, 1, 2, None, 0);
    assert_eq!(
        view.majority(back, lag),
        None,
        "the new run is younger than the lag"
    );
    let later = back + lag;
    let (seq, _) = view.ping(back + 500 * MS);
    view.answer(back + 500 * MS, seq, 1, 2, None, 0);
    let (seq, _) = view.ping(later);
    view.answer(later, seq, 1, 2, None, 0);
    assert_eq!(view.majority(later, lag), Some(later));
}

#[test]
fn datagrams_round_trip_and_anything_else_is_dropped() {
    let k = key();
    let ping = encode_ping(&k, 4, 1, 9, 3, true);
    assert_eq!(
        decode(&k, 4, &ping),
        Some(Datagram::Ping {
            rank: 1,
            seq: 9,
            version: 3,
            steady: true
        })
    );
    let mut odd = encode_ping(&k, 4, 1, 9, 3, false);
    odd.truncate(odd.len() - 32);
    odd[33] = 2;
    let tag = hmac::sign(&k, &odd);
    odd.extend_from_slice(tag.as_ref());
    assert_eq!(decode(&k, 4, &odd), None, "a steady flag neither 0 nor 1");
    assert_eq!(decode(&k, 5, &ping), None, "another round");
    let other = hmac::Key::new(hmac::HMAC_SHA256, &[8u8; 32]);
    assert_eq!(decode(&other, 4, &ping), None, "another key");
    let mut tampered = ping.clone();
    tampered[14] ^= 1;
    assert_eq!(decode(&k, 4, &tampered), None);
    let answer = encode_answer(&k, 4, 1, 9, 2, 6, 1, Some(&[0b11]));
    assert_eq!(
        decode(&k, 4, &answer),
        Some(Datagram::Answer {
            rank: 1,
            seq: 9,
            heard: 2,
            version: 6,
            steady_others: 1,
            map: Some(&[0b11][..])
        })
    );
    let unchanged = encode_answer(&k, 4, 1, 9, 2, 6, 0, None);
    assert!(matches!(
        decode(&k, 4, &unchanged),
        Some(Datagram::Answer { map: None, .. })
    ));
    // Truncations and junk never panic.
    for n in 0..answer.len() {
        assert_eq!(decode(&k, 4, &answer[..n]), None);
    }
    assert_eq!(decode(&k, 4, &[0xff; 200]), None);
}

/// Three nodes' tasks on loopback, node 0 serving the hub: each hears a
/// majority, vouches for all, and its evidence outlasts its contact.
#[tokio::test]
async fn three_nodes_hear_each_other_through_the_hub() {
    let probe = std::net::UdpSocket::bind("127.0.0.1:0").expect("a free port");
    let port = probe.local_addr().expect("addr").port();
    drop(probe);
    let timing = Timing::new(
        Duration::from_secs(3),
        Duration::from_secs(1),
        Duration::from_secs(60),
        Duration::from_millis(2800),
        3,
    );
    let contact = Instant::now();
    let shared: Vec<Shared> = (0..3).map(|_| Shared::default()).collect();
    let tasks: Vec<_> = (0..3u32)
        .map(|rank| {
            let peer = PeerRound {
                round: 2,
                node_rank: rank,
                nnodes: 3,
                key: vec![1; 32],
                hub: format!("127.0.0.1:{port}"),
                serve: (rank == 0).then(|| SocketAddr::from(([127, 0, 0, 1], port))),
                timing,
            };
            // Each node reached the rendezvous a moment ago, after its first ping.
            spawn(peer, shared[rank as usize].clone(), move || {
                Some(contact + Duration::from_millis(300))
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = Instant::now();
        let all = shared
            .iter()
            .all(|s| s.vouch(now).is_some_and(|v| v.all && v.round == 2) && s.until().is_some());
        if all {
            break;
        }
        assert!(now < deadline, "the nodes did not hear each other");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Node 0 stops: the others lose their majority, and with it the vouch.
    tasks[0].abort();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let now = Instant::now();
    for s in &shared[1..] {
        assert_eq!(s.vouch(now), None);
    }
    for t in tasks {
        t.abort();
    }
}

#[test]
fn the_latest_word_never_moves_back_within_a_round() {
    let s = Shared::default();
    let t = Instant::now();
    s.publish(None, Some(t + 10 * MS));
    s.publish(None, Some(t + 30 * MS));
    s.publish(None, Some(t + 20 * MS));
    s.publish(None, None);
    assert_eq!(s.until(), None, "the evidence lapsed");
    assert_eq!(
        s.latest(),
        Some(t + 30 * MS),
        "what the machine's fence may still hold"
    );
    s.clear();
    assert_eq!(s.latest(), None, "a new round starts afresh");
}
