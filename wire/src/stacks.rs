//! Grouped stacks as text: `rdzv-server stacks`, the status page and the
//! failure report of a hang all print a job's stacks the same way.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use accel_proto::v1 as pb;

/// `ranks` as compact ranges: `0-2, 5, 7-8`.
pub fn ranges(ranks: &[u32]) -> String {
    let mut sorted = ranks.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push_str(", ");
        }
        match j > i {
            true => {
                let _ = write!(out, "{}-{}", sorted[i], sorted[j]);
            }
            false => {
                let _ = write!(out, "{}", sorted[i]);
            }
        }
        i = j + 1;
    }
    out
}

/// The grouped stacks as text (`rdzv-server stacks`, and the failure report
/// of a hang).
pub fn render(job: &str, r: &pb::StacksResponse) -> String {
    let ranks: u32 = r.groups.iter().map(|g| g.rank_count).sum::<u32>() + r.ranks_omitted;
    let mut out = format!(
        "job {job}, round {}: stacks of {ranks} rank{} from {} of {} node{}, {} distinct\n",
        r.round,
        plural(ranks),
        r.nodes_answered,
        r.nodes_asked,
        plural(r.nodes_asked),
        r.groups.len() as u32 + r.groups_omitted,
    );
    if !r.missing.is_empty() {
        let _ = writeln!(out, "no answer in time from: {}", r.missing.join(", "));
    }
    for g in &r.groups {
        let mut by_host: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
        for rank in &g.ranks {
            by_host.entry(&rank.host).or_default().push(rank.rank);
        }
        let all: Vec<u32> = g.ranks.iter().map(|r| r.rank).collect();
        let hosts: Vec<String> = by_host
            .iter()
            .map(|(h, rs)| format!("{h}: {}", ranges(rs)))
            .collect();
        let more = match g.rank_count as usize > g.ranks.len() {
            true => format!(" (and {} more)", g.rank_count as usize - g.ranks.len()),
            false => String::new(),
        };
        let _ = writeln!(
            out,
            "\n== {} rank{}: {}{more}  [{}]",
            g.rank_count,
            plural(g.rank_count),
            ranges(&all),
            hosts.join("; ")
        );
        // Every stack line indented: only the headers above start a line,
        // so no text a worker controls (a function named with a newline
        // and a made-up header) can pass for one.
        for line in g.stack.lines() {
            let _ = writeln!(out, "  {line}");
        }
    }
    if r.groups_omitted > 0 {
        let _ = writeln!(
            out,
            "\n({} more distinct stacks, of {} ranks, left out of this answer)",
            r.groups_omitted, r.ranks_omitted
        );
    }
    out
}

fn plural(n: u32) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}
