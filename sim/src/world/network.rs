//! The network between the nodes and the server: latency, losses, FIFO
//! links, partitions, and what arrives where.

use super::*;

impl World {
    pub(super) fn send(&mut self, link: usize, to_server: bool, msg: Msg) {
        let n = &self.nodes[link];
        // A connection's end is not a call that can go unanswered.
        let lossy = match &msg {
            Msg::Call { body, .. } => !matches!(body, Call::Closed(_) | Call::Abandon(_)),
            Msg::Reply { .. } | Msg::Joined { .. } => true,
            _ => false,
        };
        // Either the node's calls are lost (and never answered), or the
        // server's answers (its calls took effect).
        let lossy = lossy && n.drop_answers != to_server;
        if lossy && n.drop > 0.0 && self.rng.f64() < n.drop {
            self.say(|| format!("dropped {}", describe(&msg)));
            return;
        }
        let delay = self.spec.latency + n.delay;
        let last = match to_server {
            true => &mut self.fifo[link].0,
            false => &mut self.fifo[link].1,
        };
        let at = (self.now + delay).max(*last);
        *last = at;
        self.seq += 1;
        self.flight.push(Reverse((at, self.seq)));
        self.msgs.insert(self.seq, (self.server.epoch, msg));
    }

    pub(super) fn call(&mut self, i: usize, body: Call) {
        let n = &self.nodes[i];
        if n.end.is_some() {
            return;
        }
        self.seq += 1;
        let id = self.seq;
        let msg = Msg::Call {
            from: i,
            node_id: n.node_id.clone(),
            session: n.session.clone(),
            id,
            body: body.clone(),
        };
        let stream = n.stream;
        if !matches!(
            body,
            Call::Leave(..) | Call::Closed(_) | Call::Abandon(_) | Call::Join(..)
        ) {
            let at = self.now;
            self.nodes[i].outstanding.push((id, at, body, stream));
        }
        self.send(i, true, msg);
    }

    /// Sends a peer hub datagram: the link's latency, no order kept, no
    /// server in the way.
    pub(super) fn send_peer(&mut self, msg: Msg) {
        let at = self.now + self.spec.latency;
        self.seq += 1;
        self.flight.push(Reverse((at, self.seq)));
        self.msgs.insert(self.seq, (self.server.epoch, msg));
    }

    /// Delivers one message that arrived now.
    pub(super) fn arrive(&mut self, epoch: u64, msg: Msg) {
        let link = match &msg {
            Msg::Call { from, .. } => *from,
            Msg::Reply { to, .. }
            | Msg::Joined { to, .. }
            | Msg::Stream { to, .. }
            | Msg::StreamEnd { to, .. } => *to,
            Msg::Ping { .. } | Msg::Answer { .. } => return self.peer_arrive(msg),
        };
        // What the last server incarnation sent or was sent is gone.
        if (epoch != self.server.epoch || !self.server.up)
            && !matches!(msg, Msg::StreamEnd { silent: true, .. })
        {
            return;
        }
        if self.nodes[link].cut.is_some() {
            if matches!(msg, Msg::Stream { .. } | Msg::StreamEnd { .. }) {
                self.nodes[link].held.push(msg);
            }
            return;
        }
        if let (Some(_), Msg::Call { body, from, .. }) = (self.server.paused, &msg) {
            // A paused server reads nothing: the call waits in its buffers.
            // A join attempt the node gave up before the server read it
            // goes with its cancellation: the server reads the request and
            // the stream's reset together when it wakes, and a stream reset
            // before its handler runs never runs it (h2). Were it read
            // first, its cancelled stream's end would drop the node at once
            // (`known_abandoned_rejoin.sim`, open), and every pause longer
            // than the silence bound would drop every node.
            if let Call::Abandon(attempt) = body {
                let (attempt, from) = (*attempt, *from);
                let before = self.server.unread.len();
                self.server.unread.retain(|m| {
                    !matches!(m, Msg::Call { from: f, body: Call::Join(_, a), .. } if *f == from && *a == attempt)
                });
                if self.server.unread.len() < before {
                    return;
                }
            }
            self.server.unread.push(msg);
            return;
        }
        match msg {
            Msg::Call {
                from,
                node_id,
                session,
                id,
                body,
            } => self.serve(from, &node_id, &session, id, body),
            Msg::Reply { to, id, ok } => self.replied(to, id, ok),
            Msg::Joined {
                to,
                attempt,
                result,
            } => self.joined(to, attempt, result),
            Msg::Stream { to, stream, kind } => {
                let n = &mut self.nodes[to];
                if n.stream == Some(stream) && n.end.is_none() {
                    n.inbox.push_back(kind);
                }
            }
            Msg::StreamEnd { to, stream, silent } => {
                let n = &mut self.nodes[to];
                if n.stream == Some(stream) && n.end.is_none() && n.lost.is_none() {
                    n.lost = Some(match silent {
                        true => ("lost the rendezvous: the connection was reset".into(), true),
                        false => ("the rendezvous ended this node's session".into(), false),
                    });
                }
            }
            Msg::Ping { .. } | Msg::Answer { .. } => {}
        }
    }
}
