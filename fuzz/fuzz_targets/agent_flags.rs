//! The agent's command line as a user (or a launcher passing user input)
//! can write it: clap's parsing of [`AgentArgs`], then
//! `LaunchOptions::build` with an injected environment, plus the value
//! parsers on their own (`--rdzv-conf`, durations, `--nnodes`, endpoints).
//! Besides "no panic", a configuration that is accepted must be one the
//! agent can run with: counts in range, positive intervals, and every
//! duration small enough to add to the current instant.
//!
//! # Input
//! UTF-8 text, one item a line: `$NAME=VALUE` sets a variable of the
//! injected environment, any other line is the next command-line argument.
//! The whole text is also given to `RdzvConf::parse`, and each line to the
//! single-value parsers.

#![no_main]

use std::time::{Duration, Instant};

use accel_agent::cli::AgentArgs;
use accel_agent::config::{
    parse_endpoint, parse_nnodes, Config, LaunchOptions, RdzvConf, Rendezvous,
};
use clap::Parser;
use libfuzzer_sys::fuzz_target;
use accel_input::parse_duration;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut args = vec!["accel-agent".to_owned()];
    let mut env = Vec::new();
    for line in text.lines() {
        match line.strip_prefix('$').and_then(|l| l.split_once('=')) {
            Some((name, value)) => env.push((name.to_owned(), value.to_owned())),
            None => args.push(line.to_owned()),
        }
        single_values(line);
    }
    rdzv_conf(text);
    let lookup = |name: &str| {
        env.iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let parsed = match AgentArgs::try_parse_from(&args) {
        Ok(a) => a,
        Err(e) => {
            assert!(!e.to_string().is_empty());
            return;
        }
    };
    assert_duration("--monitor-interval", parsed.monitor_interval);
    assert_duration("--exit-barrier-timeout", parsed.exit_barrier_timeout);
    match LaunchOptions::from(parsed).build(&lookup) {
        Ok(config) => check_config(&config),
        Err(e) => assert!(!e.to_string().is_empty(), "an error without a message"),
    }
});

/// What an accepted configuration promises the rest of the agent.
fn check_config(c: &Config) {
    assert!(0 < c.min_nodes && c.min_nodes <= c.max_nodes, "nnodes {}:{}", c.min_nodes, c.max_nodes);
    assert!(c.nproc_per_node > 0);
    assert!(!c.monitor_interval.is_zero());
    assert!(!c.run_id.is_empty() && !c.role.is_empty());
    if let Rendezvous::Static { node_rank, .. } = c.rendezvous {
        assert!(node_rank < c.max_nodes, "node rank {node_rank} of {}", c.max_nodes);
    }
    for (what, d) in [
        ("monitor_interval", c.monitor_interval),
        ("shutdown_timeout", c.shutdown_timeout),
        ("exit_barrier_timeout", c.exit_barrier_timeout),
        ("join_timeout", c.join_timeout()),
    ] {
        assert_duration(what, d);
    }
    check_rdzv(&c.rdzv);
}

fn rdzv_conf(text: &str) {
    match RdzvConf::parse(text) {
        Ok(r) => check_rdzv(&r),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

fn check_rdzv(r: &RdzvConf) {
    assert!(!r.read_timeout.is_zero() && !r.keep_alive_interval.is_zero());
    assert!(r.keep_alive_max_attempt > 0);
    for (what, d) in [
        ("join_timeout", r.join_timeout),
        ("last_call_timeout", r.last_call_timeout),
        ("close_timeout", r.close_timeout),
        ("keep_alive_interval", r.keep_alive_interval),
        ("read_timeout", r.read_timeout),
        ("timeout", r.timeout),
        ("reconnect_grace", r.reconnect_grace),
    ] {
        assert_duration(what, d);
    }
    // The keep-alive limit the agent derives and sends to the server in ms:
    // within the server's bound, and never shorter than one interval.
    let limit = r.dead_after();
    assert!(
        limit <= accel_input::MAX_DURATION
            && limit >= r.keep_alive_interval.min(accel_input::MAX_DURATION),
        "keep_alive_interval {:?} x keep_alive_max_attempt {} gave {limit:?}",
        r.keep_alive_interval,
        r.keep_alive_max_attempt
    );
}

/// The value parsers alone, on one line.
fn single_values(line: &str) {
    match parse_duration(line) {
        Ok(d) => assert_duration("a duration", d),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
    if let Ok((min, max)) = parse_nnodes(line) {
        assert!(0 < min && min <= max, "--nnodes {line:?} gave {min}:{max}");
    }
    if let Ok((host, _)) = parse_endpoint(line, Some(29_400)) {
        assert!(!host.is_empty(), "--rdzv-endpoint {line:?} gave an empty host");
    }
}

/// A duration from user input can be added to the current instant: the
/// agent computes deadlines that way.
fn assert_duration(what: &str, d: Duration) {
    assert!(
        Instant::now().checked_add(d).is_some(),
        "{what} of {d:?} cannot be added to an instant: it must be refused when parsed"
    );
}
