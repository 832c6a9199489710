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
//! compared). An agent may join when it is of the server's release line:
//! the same MAJOR, or, before 1.0, the same MAJOR.MINOR (as Cargo reads
//! versions). Patch releases of one line speak the same protocol: new
//! fields are optional, and each side ignores fields it does not know. An
//! agent that says no version predates this check; it is admitted, and the
//! server says once that such agents are in use.

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

/// The release line of a version: `(MAJOR, None)` from 1.0 on, `(0,
/// Some(MINOR))` before it.
fn line(v: (u64, u64, u64)) -> (u64, Option<u64>) {
    match v.0 {
        0 => (0, Some(v.1)),
        major => (major, None),
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
    if line(a) == line(s) {
        return Ok(());
    }
    let older = if a < s { "older" } else { "newer" };
    Err(format!(
        "accel-agent {agent} is {older} than rdzv-server {server} and of another release line: \
         run agents and server of one line ({}); the agent in the training image and the server \
         are upgraded separately",
        match line(s) {
            (0, Some(minor)) => format!("0.{minor}.x"),
            (major, _) => format!("{major}.x"),
        }
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
    fn agents_of_the_server_s_release_line_join_others_are_refused_by_name() {
        // Before 1.0 the line is MAJOR.MINOR.
        assert_eq!(compatible("0.1.0", "0.1.0"), Ok(()));
        assert_eq!(compatible("0.1.3", "0.1.0"), Ok(()));
        assert_eq!(compatible("0.1.0", "0.1.9-rc.1"), Ok(()));
        let e = compatible("0.2.0", "0.1.4").expect_err("older line");
        assert!(
            e.contains("accel-agent 0.1.4 is older than rdzv-server 0.2.0"),
            "{e}"
        );
        assert!(e.contains("(0.2.x)"), "{e}");
        let e = compatible("0.1.0", "1.0.0").expect_err("newer line");
        assert!(e.contains("newer"), "{e}");
        // From 1.0 on, MAJOR.
        assert_eq!(compatible("1.4.2", "1.0.0"), Ok(()));
        assert_eq!(compatible("1.0.0", "1.7.1+build.5"), Ok(()));
        let e = compatible("2.0.0", "1.9.9").expect_err("major");
        assert!(e.contains("(2.x)"), "{e}");
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
