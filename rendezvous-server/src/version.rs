//! Version skew between agents and the rendezvous server.
//!
//! # Why
//! The agent is baked into training images, which live for months; the
//! server is upgraded with the cluster. An agent and a server that disagree
//! on what a message means must not meet silently: the agent says its
//! version when it joins (`JoinRequest.agent_version`), and the server
//! refuses one of another release line, naming both versions.
//!
//! # The rule
//! Versions are `MAJOR.MINOR.PATCH` (a pre-release or build suffix is not
//! compared). A release line is the same MAJOR, or, before 1.0, the same
//! MAJOR.MINOR (as Cargo reads versions). An agent may join when it is of
//! the server's release line or of an adjacent one: one line older (agents
//! in training images lag the cluster's server) or one newer (a server
//! rolled back, or upgraded after the images). So a server upgrade by one
//! line never refuses the agents of running jobs when they reconnect, and
//! a rollback never refuses the agents started meanwhile.
//!
//! That holds because the protocol only grows between adjacent lines: new
//! fields are optional, each side ignores fields it does not know, and
//! nothing an adjacent line sends changes meaning. A change that would
//! break that waits two lines. Agents two or more lines apart are refused
//! at their join, before they run anything, naming both versions and the
//! lines the server admits; a running job's agent is never that far from
//! the server it joined unless the server skipped a line, which the
//! upgrade notes forbid. An agent that says no version predates this
//! check; it is admitted, and the server says once that such agents are in
//! use.

use std::sync::Once;

/// This server's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Longest version text a join may carry.
pub const MAX_VERSION_BYTES: usize = 64;

/// `MAJOR.MINOR.PATCH` of `v`, ignoring a `-pre` or `+build` suffix.
fn parse(v: &str) -> Option<(u64, u64, u64)> {
    let core = v.split(['-', '+']).next()?;
    let mut parts = core.split('.');
    let mut num = || parts.next()?.parse::<u64>().ok();
    let parsed = (num()?, num()?, num()?);
    parts.next().is_none().then_some(parsed)
}

/// The release line of a version, as a number that grows by one per line:
/// MINOR before 1.0 (`0.MINOR`), MAJOR from 1.0 on, offset past every
/// pre-1.0 line, so no 0.x line is adjacent to 1.x: 1.0 will name the 0.x
/// line it speaks with when it is released.
fn line(v: (u64, u64, u64)) -> u64 {
    match v.0 {
        // A minor that large would reach the 1.x lines: kept below them.
        0 => v.1.min(PRE_ONE_LINES - 1),
        major => PRE_ONE_LINES.saturating_add(major),
    }
}

/// How many lines before 1.0 are counted apart from 1.0 and on.
const PRE_ONE_LINES: u64 = 1_000_000;

/// A line as users write it: `0.2.x`, `1.x`.
fn show(line: u64) -> String {
    if line < PRE_ONE_LINES {
        format!("0.{line}.x")
    } else {
        format!("{}.x", line - PRE_ONE_LINES)
    }
}

/// Whether an agent of version `agent` may join a server of version
/// `server` (see the module docs); `Err` says why not, naming both.
pub fn compatible(server: &str, agent: &str) -> Result<(), String> {
    if agent.is_empty() {
        return Ok(());
    }
    let Some(a) = parse(agent) else {
        return Err(format!(
            "agent version '{}' is not MAJOR.MINOR.PATCH",
            accel_input::excerpt(agent)
        ));
    };
    let s = parse(server)
        .ok_or_else(|| format!("this server's version '{server}' is not MAJOR.MINOR.PATCH"))?;
    let (al, sl) = (line(a), line(s));
    if al.abs_diff(sl) <= 1 {
        return Ok(());
    }
    let older = if a < s { "older" } else { "newer" };
    // The lines beside the server's, never across 0.x and 1.x (no 0.x
    // line is adjacent to 1.x).
    let beside =
        |l: u64| (l / PRE_ONE_LINES == sl / PRE_ONE_LINES && l != PRE_ONE_LINES).then_some(l);
    let admitted = [sl.checked_sub(1).and_then(beside), Some(sl), beside(sl + 1)]
        .into_iter()
        .flatten()
        .map(show)
        .collect::<Vec<_>>()
        .join(", ");
    Err(format!(
        "accel-agent {agent} is {older} than rdzv-server {server} by more than one release line: \
         this server admits agents of {admitted}; rebuild the training image with an agent of \
         one of those lines (or run a server of the agent's line beside this one)"
    ))
}

/// Checks a joining agent's version against this server's; says once per
/// process that agents without a version (older than the check) joined.
pub fn check_agent(agent: &str) -> Result<(), String> {
    if agent.len() > MAX_VERSION_BYTES || agent.chars().any(char::is_control) {
        return Err(format!(
            "agent_version must be at most {MAX_VERSION_BYTES} bytes without control characters"
        ));
    }
    if agent.is_empty() {
        static SAID: Once = Once::new();
        SAID.call_once(|| {
            tracing::warn!(server = VERSION, "an agent that does not say its version joined (older than rdzv-server's version check); it is admitted, but upgrade it: agents and server should be of one release line");
        });
    }
    compatible(VERSION, agent)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agents_of_the_server_s_line_and_the_adjacent_ones_join_others_are_refused_by_name() {
        // Before 1.0 the line is MAJOR.MINOR.
        assert_eq!(compatible("0.1.0", "0.1.0"), Ok(()));
        assert_eq!(compatible("0.1.3", "0.1.0"), Ok(()));
        assert_eq!(compatible("0.1.0", "0.1.9-rc.1"), Ok(()));
        // One line apart, either way: an upgrade, and its rollback.
        assert_eq!(compatible("0.2.0", "0.1.4"), Ok(()));
        assert_eq!(compatible("0.1.4", "0.2.0"), Ok(()));
        let e = compatible("0.3.0", "0.1.4").expect_err("two lines older");
        assert!(
            e.contains("accel-agent 0.1.4 is older than rdzv-server 0.3.0"),
            "{e}"
        );
        assert!(e.contains("admits agents of 0.2.x, 0.3.x, 0.4.x"), "{e}");
        let e = compatible("0.1.0", "0.3.0").expect_err("two lines newer");
        assert!(e.contains("newer") && e.contains("0.1.x, 0.2.x"), "{e}");
        // 0.x and 1.x are not adjacent (1.0 will say which 0.x it takes).
        let e = compatible("1.0.0", "0.9.2").expect_err("across 1.0");
        assert!(e.contains("admits agents of 1.x, 2.x;"), "{e}");
        let e = compatible("0.1.0", "0.5.0").expect_err("four newer");
        assert!(e.contains("admits agents of 0.0.x, 0.1.x, 0.2.x;"), "{e}");
        assert!(compatible("0.9.2", "1.3.0").is_err());
        // From 1.0 on, MAJOR.
        assert_eq!(compatible("1.4.2", "1.0.0"), Ok(()));
        assert_eq!(compatible("1.0.0", "1.7.1+build.5"), Ok(()));
        assert_eq!(compatible("2.0.0", "1.9.9"), Ok(()));
        let e = compatible("3.0.0", "1.9.9").expect_err("two majors");
        assert!(e.contains("2.x, 3.x, 4.x"), "{e}");
    }

    #[test]
    fn an_agent_without_a_version_is_admitted_and_garbage_is_not() {
        assert_eq!(compatible("0.1.0", ""), Ok(()));
        for bad in ["1", "1.2", "1.2.3.4", "one.two.three", "1..3", " 1.2.3"] {
            let e = compatible("0.1.0", bad).expect_err(bad);
            assert!(e.contains("MAJOR.MINOR.PATCH"), "{bad}: {e}");
        }
        assert!(check_agent(&"9".repeat(65)).is_err());
        assert!(check_agent("0.1.0\n").is_err());
        assert_eq!(check_agent(VERSION), Ok(()));
    }
}
