//! Node-rank order for dynamic rendezvous, following the machine.
//!
//! # Why
//! Ranks that talk most should share the fastest links. Collective
//! libraries build rings and trees in rank order, and users build their
//! data-parallel and tensor-parallel groups from contiguous ranks, so a job
//! whose consecutive node ranks sit in one rack (or one NVLink domain)
//! keeps its heaviest traffic there. Ordering by whatever joined first, or by
//! host name as text (`node10` before `node2`), scatters them.
//!
//! # The rule
//! Each node joins with a topology path, outermost part first
//! (`zone-a/rack-3/nvl-0`, possibly empty). Nodes with the same path form a
//! *segment*.
//! - **A round after none ran** orders every ready node by path (part by
//!   part), then host name, then node id, with numbers compared as numbers
//!   (`node2` < `node10`). Every segment is one run of node ranks.
//! - **Later rounds** keep every node of the last round at its place. A place
//!   whose node departed goes to a newcomer (a spare, or a node that joined
//!   since) of the departed node's segment, in the order above; that node
//!   takes the departed node's rank and no other node moves. Places nobody of
//!   that segment can take close up (the nodes after them move down by one
//!   each). Other newcomers follow the last node of their segment, or, for a
//!   segment new to the job, come after everyone, in the order above. (A job
//!   a replica restored from the store does not know the segment of a place
//!   whose node had departed before the record was taken: that place closes.)
//! - **At most MAX** take part: the nodes last in this order wait as
//!   spares, which takes the tail of the last segment, never a hole in the
//!   middle of one.
//!
//! So the order is the same round after round while membership holds, and
//! a segment stays one run of ranks as long as its nodes do not move
//! between segments.
//!
//! # Cost
//! O(n log n) in the ready nodes, once per round.

use std::cmp::Ordering;
use std::collections::{HashMap, VecDeque};

use super::{Job, Member};

/// `a` and `b` compared with every run of ASCII digits read as a number
/// (`node2` < `node10`; at equal value, fewer leading zeros first, so the
/// order is total), everything else byte by byte.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    while i < a.len() && j < b.len() {
        if a[i].is_ascii_digit() && b[j].is_ascii_digit() {
            let (si, sj) = (i, j);
            while i < a.len() && a[i].is_ascii_digit() {
                i += 1;
            }
            while j < b.len() && b[j].is_ascii_digit() {
                j += 1;
            }
            let (da, db) = (&a[si..i], &b[sj..j]);
            let trim = |d: &[u8]| {
                let zeros = d.iter().take_while(|c| **c == b'0').count();
                d.len() - zeros
            };
            let (va, vb) = (&da[da.len() - trim(da)..], &db[db.len() - trim(db)..]);
            let ord = va
                .len()
                .cmp(&vb.len())
                .then_with(|| va.cmp(vb))
                .then_with(|| da.len().cmp(&db.len()));
            if ord != Ordering::Equal {
                return ord;
            }
        } else {
            if a[i] != b[j] {
                return a[i].cmp(&b[j]);
            }
            i += 1;
            j += 1;
        }
    }
    (a.len() - i).cmp(&(b.len() - j))
}

/// Topology paths compared part by part, each part naturally.
pub fn topology_cmp(a: &str, b: &str) -> Ordering {
    let mut pa = a.split('/');
    let mut pb = b.split('/');
    loop {
        match (pa.next(), pb.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) => match natural_cmp(x, y) {
                Ordering::Equal => {}
                ord => return ord,
            },
        }
    }
}

/// The order of nodes new to a round: path, host name, node id, arrival.
fn newcomer_cmp((a, ma): &(&String, &Member), (b, mb): &(&String, &Member)) -> Ordering {
    topology_cmp(&ma.topology, &mb.topology)
        .then_with(|| natural_cmp(&ma.hostname, &mb.hostname))
        .then_with(|| natural_cmp(a, b))
        .then_with(|| ma.joined_seq.cmp(&mb.joined_seq))
}

/// Ready members in node-rank order for dynamic rendezvous (see the module
/// docs), before the cut at MAX.
pub(super) fn dynamic_order(job: &Job) -> Vec<String> {
    let max = job.config.max_nodes as usize;
    // A benched member's offer waits for its bench to end.
    let ready = job
        .members
        .iter()
        .filter(|(_, m)| m.ready.is_some() && !job.is_benched(m));
    // Places of the last round: its nodes' ranks (below MAX: a rank from a
    // damaged record must not size anything), and what the job remembers of
    // each place's segment (nothing for a relearned job's).
    let places = ready
        .clone()
        .filter_map(|(_, m)| m.rank)
        .map(|r| r as usize + 1)
        .filter(|p| *p <= max)
        .max()
        .unwrap_or(0)
        .max(job.slot_topologies.len().min(max));
    let mut placed: Vec<Option<&String>> = vec![None; places];
    let mut newcomers: Vec<(&String, &Member)> = Vec::new();
    for (id, m) in ready {
        match m.rank.map(|r| r as usize) {
            Some(r) if r < places && placed[r].is_none() => placed[r] = Some(id),
            // Two members claiming one place cannot happen, nor a rank
            // beyond MAX; if it did, the node is placed as a newcomer.
            _ => newcomers.push((id, m)),
        }
    }
    newcomers.sort_by(newcomer_cmp);

    // A departed node's place goes to the first newcomer of its segment.
    let mut by_segment: HashMap<&str, VecDeque<usize>> = HashMap::new();
    for (k, (_, m)) in newcomers.iter().enumerate() {
        by_segment.entry(&m.topology).or_default().push_back(k);
    }
    let mut taken = vec![false; newcomers.len()];
    for (r, place) in placed.iter_mut().enumerate() {
        if place.is_some() {
            continue;
        }
        let Some(Some(segment)) = job.slot_topologies.get(r) else {
            continue;
        };
        if let Some(k) = by_segment.get_mut(&**segment).and_then(VecDeque::pop_front) {
            *place = Some(newcomers[k].0);
            taken[k] = true;
        }
    }
    let kept: Vec<&String> = placed.into_iter().flatten().collect();

    // The other newcomers, as many as the round's size leaves room for (MAX,
    // or the largest count the job can use, `--nnodes-multiple-of`; in the
    // order above: the cut never takes a node that keeps its place): after
    // the last node of their segment, else at the end.
    let ready_count = u32::try_from(kept.len() + newcomers.len()).unwrap_or(u32::MAX);
    let size = (job.config.allowed(ready_count) as usize).min(max);
    let mut room = size.saturating_sub(kept.len());
    for t in taken.iter_mut().filter(|t| !**t) {
        if room == 0 {
            *t = true; // waits as a spare
        } else {
            room -= 1;
        }
    }
    let mut last_of: HashMap<&str, usize> = HashMap::new();
    for (i, id) in kept.iter().enumerate() {
        last_of.insert(&job.members[*id].topology, i);
    }
    // after[i]: the newcomers that follow kept[i]; new: those of new segments.
    let mut after: Vec<Vec<&String>> = vec![Vec::new(); kept.len()];
    let mut new = Vec::new();
    for (k, (id, m)) in newcomers.iter().enumerate() {
        if !taken[k] {
            match last_of.get(&*m.topology) {
                Some(&i) => after[i].push(*id),
                None => new.push(*id),
            }
        }
    }
    let mut order = Vec::with_capacity(newcomers.len() + kept.len());
    for (id, followers) in kept.into_iter().zip(after) {
        order.push(id.clone());
        order.extend(followers.into_iter().cloned());
    }
    order.extend(new.into_iter().cloned());
    order
}

/// For each node of `order` (by node rank), its segment: the index of its
/// run of equal topology paths among the round's runs, the run's first node
/// rank and its length.
pub(super) fn segments(topologies: &[&str]) -> Vec<(u32, u32, u32)> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (r, t) in topologies.iter().enumerate() {
        match runs.last_mut() {
            Some((first, len)) if topologies[*first as usize] == *t => *len += 1,
            _ => runs.push((r as u32, 1)),
        }
    }
    runs.iter()
        .enumerate()
        .flat_map(|(i, (first, len))| (0..*len).map(move |_| (i as u32, *first, *len)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_compare_as_numbers() {
        let mut hosts = vec![
            "node10", "node2", "node1", "node02", "gpu-b3", "gpu-a10", "node",
        ];
        hosts.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            hosts,
            ["gpu-a10", "gpu-b3", "node", "node1", "node2", "node02", "node10"]
        );
        assert_eq!(
            natural_cmp("a99999999999999999999999", "a100000000000000000000000"),
            Ordering::Less
        );
        assert_eq!(natural_cmp("x", "x"), Ordering::Equal);
        assert_eq!(natural_cmp("", "a"), Ordering::Less);
    }

    #[test]
    fn paths_compare_part_by_part() {
        let mut paths = vec![
            "z/rack-10/n",
            "z/rack-9/n",
            "z",
            "",
            "y/rack-99",
            "z/rack-9",
        ];
        paths.sort_by(|a, b| topology_cmp(a, b));
        assert_eq!(
            paths,
            [
                "",
                "y/rack-99",
                "z",
                "z/rack-9",
                "z/rack-9/n",
                "z/rack-10/n"
            ]
        );
    }

    #[test]
    fn segments_are_runs_of_equal_paths() {
        assert_eq!(
            segments(&["a", "a", "b", "", ""]),
            [(0, 0, 2), (0, 0, 2), (1, 2, 1), (2, 3, 2), (2, 3, 2)]
        );
        assert!(segments(&[]).is_empty());
    }
}
