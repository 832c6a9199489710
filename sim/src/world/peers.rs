//! Each round's peer hub: the real `Hub`, `View` and `Timing` of
//! `agent/src/peers.rs` on peer links that fail apart from the server's.

use super::*;

impl World {
    /// Whether a peer datagram between nodes `a` and `b` is lost: either
    /// is cut off from its peers (a hub node's own pings never are).
    pub(super) fn peer_lost(&self, a: usize, b: usize) -> bool {
        a != b && (self.nodes[a].peer_cut.is_some() || self.nodes[b].peer_cut.is_some())
    }

    /// A ping or an answer arrives, as the agent's `peers::run` reads it.
    pub(super) fn peer_arrive(&mut self, msg: Msg) {
        let now = self.std(self.now);
        match msg {
            Msg::Ping {
                from,
                to,
                key,
                rank,
                seq,
                version,
                steady,
            } => {
                if self.peer_lost(from, to) || self.nodes[to].end.is_some() {
                    return;
                }
                let Some(p) = self.nodes[to].peer.as_mut().filter(|p| p.key == key) else {
                    return;
                };
                let Some(hub) = &mut p.hub else { return };
                if !hub.ping(now, rank, seq, steady) {
                    return;
                }
                let (heard, version, map, steady_others) = hub.answer(version, rank);
                let map = map.map(<[u8]>::to_vec);
                self.send_peer(Msg::Answer {
                    from: to,
                    to: from,
                    key,
                    rank,
                    seq,
                    heard,
                    version,
                    steady_others,
                    map,
                });
                self.publish(to);
            }
            Msg::Answer {
                from,
                to,
                key,
                rank,
                seq,
                heard,
                version,
                steady_others,
                map,
            } => {
                if self.peer_lost(from, to) || self.nodes[to].end.is_some() {
                    return;
                }
                let Some(p) = self.nodes[to].peer.as_mut().filter(|p| p.key == key) else {
                    return;
                };
                if rank == p.rank {
                    p.view
                        .answer(now, seq, heard, version, map.as_deref(), steady_others);
                }
                self.publish(to);
            }
            _ => {}
        }
    }

    /// Node `i`'s peer task ticks: a ping to the hub, and the hub's sweep.
    pub(super) fn peer_tick(&mut self, i: usize) {
        let now = self.now;
        let tk = self.std(now);
        let Some(p) = self.nodes[i].peer.as_mut().filter(|p| p.next <= now) else {
            return;
        };
        p.next = now + p.timing.every;
        let steady = p.view.steady(tk, p.timing.lag);
        let (seq, version) = p.view.ping(tk);
        let ping = p.hub_at.map(|to| Msg::Ping {
            from: i,
            to,
            key: p.key.clone(),
            rank: p.rank,
            seq,
            version,
            steady,
        });
        if let Some(hub) = &mut p.hub {
            hub.sweep(tk);
        }
        if let Some(ping) = ping {
            self.send_peer(ping);
        }
        self.publish(i);
    }

    /// What the peer task publishes after each step (`peers::Shared`): the
    /// vouch for the keep-alives, and the evidence's deadline given the
    /// node's last contact with the rendezvous (its fence clock).
    pub(super) fn publish(&mut self, i: usize) {
        let now = self.std(self.now);
        let base = self.base;
        let n = &mut self.nodes[i];
        let Some(p) = &n.peer else { return };
        let t = p.timing;
        n.vouch = p
            .view
            .vouch(now, p.round)
            .map(|v| ((v.round, v.ranks, v.all), self.now, t.fresh));
        let contact = n.answered.map(|a| base + a);
        let until = contact
            .and_then(|c| {
                p.view
                    .majority(now, t.lag)
                    .and_then(|sent| t.keeps_until(sent, c))
            })
            .map(|u| u.saturating_duration_since(base));
        if until != n.peers_until {
            n.peers_until = until;
            n.peers_moved = true;
        }
        if let Some(u) = until {
            n.peers_latest = Some(n.peers_latest.map_or(u, |l| l.max(u)));
        }
    }

    /// Node `i`'s round starts: its peer task for the round (node rank 0
    /// serves the hub), as the agent's `start_peers`.
    pub(super) fn start_peers(&mut self, i: usize, info: &accel_agent::agent::round::RoundInfo) {
        self.end_peers(i);
        let Some(timing) = self.spec.timing(info.nnodes) else {
            return;
        };
        if info.peer_key.is_empty() || info.node_rank >= info.nnodes {
            return;
        }
        let hub_at = info
            .master_addr
            .strip_suffix(".host")
            .and_then(|id| self.index_of(id));
        let hub = (info.node_rank == 0).then(|| Hub::new(info.nnodes, timing.fresh));
        self.nodes[i].peer = Some(Peer {
            key: info.peer_key.clone(),
            round: info.round,
            rank: info.node_rank,
            hub_at,
            timing,
            hub,
            view: View::new(info.node_rank, info.nnodes, timing.fresh),
            next: self.now,
        });
    }

    /// Node `i` left its round (its fence fell, or it was dropped): it
    /// leaves the round's hub at once (the agent's `quiet_peers`), keeping
    /// the latest evidence it had for the hold of a silent server's
    /// connection.
    pub(super) fn quiet_peers(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        n.peer = None;
        n.vouch = None;
        if n.peers_until.take().is_some() {
            n.peers_moved = true;
        }
    }

    /// The round's peer task ends (a new offer, the agent's end): nothing
    /// is vouched for or kept any more.
    pub(super) fn end_peers(&mut self, i: usize) {
        self.quiet_peers(i);
        self.nodes[i].peers_latest = None;
    }
}
