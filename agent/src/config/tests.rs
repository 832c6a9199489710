use super::*;
use crate::cli::AgentArgs;
use clap::Parser;

fn parse(args: &[&str]) -> Result<Config, ConfigError> {
    let mut v = vec!["accel-agent"];
    v.extend_from_slice(args);
    // A value's own error comes from its parser, clipped as the binaries
    // print it.
    let a = AgentArgs::try_parse_from(v)
        .map_err(|e| ConfigError(accel_input::clip_message(&e.render().to_string())))?;
    LaunchOptions::from(a).build(&|_| None)
}

#[test]
fn one_node_without_endpoint_is_standalone() {
    let c = parse(&["t.py"]).expect("valid");
    assert_eq!(c.rendezvous, Rendezvous::Standalone);
    assert_eq!(c.run_id.len(), 36);
    assert_eq!(
        parse(&["--standalone", "t.py"]).expect("valid").rendezvous,
        Rendezvous::Standalone
    );
    // Giving a master port keeps static, as torchrun does.
    let c = parse(&["--master-port", "1234", "t.py"]).expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::Static {
            host: "127.0.0.1".into(),
            port: 1234,
            node_rank: 0
        }
    );
}

#[test]
fn static_and_c10d_endpoints() {
    let c = parse(&[
        "--nnodes",
        "2",
        "--node_rank",
        "1",
        "--master_addr",
        "h0",
        "t.py",
    ])
    .expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::Static {
            host: "h0".into(),
            port: 29500,
            node_rank: 1
        }
    );
    let c = parse(&[
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "[::1]:7",
        "--rdzv-id",
        "x",
        "t.py",
    ])
    .expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::C10d {
            host: "::1".into(),
            port: 7,
            replicas: Vec::new(),
        }
    );
    let c = parse(&[
        "--nnodes",
        "2",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "head",
        "t.py",
    ])
    .expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::C10d {
            host: "head".into(),
            port: 29400,
            replicas: Vec::new(),
        }
    );
    assert!(c.warnings.iter().any(|w| w.contains("--rdzv-id")));
}

#[test]
fn bad_values_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (&["--nnodes", "0", "t.py"], "--nnodes"),
        (&["--nnodes", "3:2", "t.py"], "--nnodes"),
        (&["--nnodes", "1:2:3", "t.py"], "--nnodes"),
        (&["--nproc-per-node", "zero", "t.py"], "--nproc-per-node"),
        (&["--nproc-per-node", "0", "t.py"], "--nproc-per-node"),
        (
            &["--nnodes", "2", "--node-rank", "2", "t.py"],
            "--node-rank",
        ),
        (
            &["--rdzv-backend", "zookeeper", "--nnodes", "2", "t.py"],
            "--rdzv-backend",
        ),
        (
            &["--rdzv-conf", "join_timout=5", "t.py"],
            "unknown key 'join_timout'",
        ),
        (&["--rdzv-conf", "join_timeout", "t.py"], "has no value"),
        (
            &["--rdzv-conf", "join_timeout=soon", "t.py"],
            "join_timeout",
        ),
        (&["--no-python", "-m", "t"], "--no-python"),
        (
            &["--signals-to-handle", "SIGNOPE", "t.py"],
            "--signals-to-handle",
        ),
        (&["--standalone", "--nnodes", "2", "t.py"], "--standalone"),
    ];
    for (args, needle) in cases {
        let e = parse(args).expect_err(&format!("{args:?} must be rejected"));
        assert!(
            e.0.contains(needle),
            "{args:?}: '{}' should mention {needle}",
            e.0
        );
    }
}

#[test]
fn rdzv_conf_values() {
    let c = RdzvConf::parse("join_timeout=5, keep_alive_interval=0.5,keep_alive_max_attempt=2,is_host=no,read_timeout=250ms")
        .expect("valid");
    assert_eq!(c.join_timeout, Duration::from_secs(5));
    assert_eq!(c.keep_alive_interval, Duration::from_millis(500));
    assert_eq!(c.keep_alive_max_attempt, 2);
    assert_eq!(c.is_host, Some(false));
    assert_eq!(c.read_timeout, Duration::from_millis(250));
    assert_eq!(RdzvConf::parse("").expect("empty"), RdzvConf::default());
}

#[test]
fn torch_2_15s_cas_backoff_max_seconds_paces_the_attempts_to_reach_the_rendezvous() {
    let c = RdzvConf::parse("cas_backoff_max_seconds=0.5").expect("valid");
    assert_eq!(c.cas_backoff_max, Some(Duration::from_millis(500)));
    // torchrun's default, 0, is "no extra wait": accel's own pace.
    let c = RdzvConf::parse("cas_backoff_max_seconds=0").expect("valid");
    assert_eq!(c.cas_backoff_max, None);
    for bad in ["-1", "inf", "nan", "x"] {
        let e = RdzvConf::parse(&format!("cas_backoff_max_seconds={bad}"))
            .expect_err("must be finite and not negative");
        assert!(e.to_string().contains("cas_backoff_max_seconds"), "{e}");
    }
}

#[test]
fn torchs_store_type_is_taken_as_tcp_and_file_is_refused_with_the_fix() {
    assert!(RdzvConf::parse("store_type=tcp").is_ok());
    assert!(RdzvConf::parse("store_type=TCP").is_ok());
    let e = RdzvConf::parse("store_type=file").expect_err("no FileStore");
    assert!(
        e.to_string().contains("use store_type=tcp or leave it out"),
        "{e}"
    );
}

#[test]
fn print_completion_needs_no_script_and_takes_torchruns_shells() {
    let a = AgentArgs::try_parse_from(["accel-agent", "--print-completion", "tcsh"])
        .expect("no script needed");
    assert_eq!(a.print_completion.as_deref(), Some("tcsh"));
    assert!(AgentArgs::try_parse_from(["accel-agent", "--print-completion", "fish"]).is_err());
    assert!(
        AgentArgs::try_parse_from(["accel-agent"]).is_err(),
        "a script is needed otherwise"
    );
}

#[test]
fn endpoints() {
    assert_eq!(parse_endpoint("h:1", None), Ok(("h".into(), Some(1))));
    assert_eq!(parse_endpoint("h", Some(9)), Ok(("h".into(), Some(9))));
    assert_eq!(
        parse_endpoint("[fe80::1]", Some(9)),
        Ok(("fe80::1".into(), Some(9)))
    );
    assert!(parse_endpoint("h:notaport", None).is_err());
    assert!(parse_endpoint(":1", None).is_err());
}

#[test]
fn nproc_forms() {
    let resolve = |s: &str| s.parse::<Nproc>().and_then(|n| n.resolve(&|_| None));
    assert_eq!(resolve("3"), Ok(3));
    assert!(resolve("cpu").expect("cpu") >= 1);
    assert!(resolve("auto").expect("auto") >= 1);
}

#[test]
fn elastic_ranges_need_c10d() {
    let c = parse(&[
        "--nnodes",
        "2:4",
        "--rdzv-backend",
        "c10d",
        "--rdzv-id",
        "j",
        "t.py",
    ])
    .expect("valid");
    assert_eq!((c.min_nodes, c.max_nodes), (2, 4));
    let e = parse(&["--nnodes", "2:4", "t.py"]).expect_err("static needs a fixed count");
    assert!(
        e.0.contains("static rendezvous needs a fixed node count"),
        "{}",
        e.0
    );
}

#[test]
fn huge_values_are_usage_errors_not_crashes() {
    // Each of these once aborted the agent (exit 134).
    for args in [
        ["--monitor-interval", "100000000000000000000"],
        ["--exit-barrier-timeout", "10000000000000000000"],
        ["--shutdown-timeout", "1e20"],
    ] {
        let e = AgentArgs::try_parse_from(["accel-agent", args[0], args[1], "t.py"])
            .expect_err("too long");
        assert_eq!(e.exit_code(), 2);
        let text = e.render().to_string();
        assert!(
            text.contains(&format!("invalid value for {}: ", args[0]))
                && text.contains("is too long; at most 10 years"),
            "{text}"
        );
    }
    for key in [
        "join_timeout",
        "last_call_timeout",
        "close_timeout",
        "keep_alive_interval",
        "read_timeout",
        "timeout",
        "reconnect_grace",
    ] {
        let e = parse(&[
            "--rdzv-conf",
            &format!("{key}=10000000000000000000"),
            "t.py",
        ])
        .expect_err(key);
        let expected = format!(
            "--rdzv-conf {key}: '10000000000000000000' is too long; at most 10 years (315576000 s)"
        );
        assert!(e.0.contains(&expected), "{}", e.0);
    }
    // The longest accepted values make a configuration whose deadlines fit.
    let c = parse(&[
        "--rdzv-conf",
        "join_timeout=315576000,keep_alive_interval=87660h,keep_alive_max_attempt=4294967295",
        "--exit-barrier-timeout",
        "315576000",
        "t.py",
    ])
    .expect("ten years is accepted");
    assert_eq!(c.join_timeout(), accel_input::MAX_DURATION);
    let long_id = "j".repeat(257);
    let e = parse(&["--rdzv-backend", "c10d", "--rdzv-id", &long_id, "t.py"]).expect_err("id");
    assert!(e.0.ends_with("is too long; at most 256 bytes"), "{}", e.0);
    let ok_id = "j".repeat(256);
    parse(&["--rdzv-backend", "c10d", "--rdzv-id", &ok_id, "t.py"]).expect("256 bytes");
    let long_prefix = "p".repeat(100_000);
    let e = parse(&["--log-line-prefix-template", &long_prefix, "t.py"]).expect_err("prefix");
    assert_eq!(
        e.0,
        "--log-line-prefix-template is 100000 bytes; at most 1024"
    );
    let e = parse(&["--nproc-per-node", "4000000000", "t.py"]).expect_err("too many");
    assert!(e.0.contains("at most 65536 workers per node"), "{}", e.0);
    let e = parse(&["--rdzv-conf", &format!("{}=1", "k".repeat(100_000)), "t.py"])
        .expect_err("unknown key");
    assert!(
        e.0.len() < 1200 && e.0.contains("(100000 bytes)"),
        "{}",
        e.0
    );
    let endpoint = format!("{}:x", "h".repeat(100_000));
    let e = parse(&[
        "--rdzv-endpoint",
        &endpoint,
        "--rdzv-backend",
        "c10d",
        "t.py",
    ])
    .expect_err("bad endpoint");
    assert!(e.0.len() < 600, "{}", e.0);
}

#[test]
fn store_ports_and_budget() {
    let c = RdzvConf::parse("store_ports=29500-29509,store_max_bytes=64MiB").expect("valid");
    assert_eq!(
        c.store_ports,
        Some(PortRange {
            first: 29500,
            last: 29509
        })
    );
    assert_eq!(c.store_ports.map(|r| r.ports()), Some(10));
    assert_eq!(c.store_max_bytes, 64 << 20);
    assert_eq!(RdzvConf::default().store_max_bytes, 1 << 30);
    assert_eq!(parse_bytes("4096"), Ok(4096));
    assert_eq!(parse_bytes("2G"), Ok(2 << 30));
    for (conf, needle) in [
        (
            "store_ports=29500",
            "is not a range; write it as FIRST-LAST",
        ),
        ("store_ports=29500-29500", "at least two ports"),
        ("store_ports=29510-29500", "the first below the last"),
        ("store_ports=0-10", "'0' is not a port (1-65535)"),
        ("store_ports=1-70000", "'70000' is not a port"),
        ("store_ports=a-b", "'a' is not a port"),
        ("store_max_bytes=0", "not a positive byte count"),
        ("store_max_bytes=1TiB", "unknown unit"),
        ("store_max_bytes=99999999999G", "not a positive byte count"),
    ] {
        let e = RdzvConf::parse(conf).expect_err(conf);
        assert!(e.0.contains(needle), "{conf}: {}", e.0);
        let key = conf.split('=').next().expect("key");
        assert!(e.0.contains(&format!("--rdzv-conf {key}")), "{}", e.0);
    }
}

#[test]
fn the_flags_defaults_are_the_options_defaults() {
    // Whoever builds options without flags gets what `accel-agent SCRIPT`
    // gets (PET_* variables would change the flags' side: none is set here).
    let flags = AgentArgs::try_parse_from(["accel-agent", "t.py"]).expect("syntax");
    assert_eq!(LaunchOptions::from(flags), LaunchOptions::new("t.py"));
}

#[test]
fn options_build_without_any_command_line() {
    let mut o = LaunchOptions::new("train.py");
    o.nnodes = NodeCount { min: 2, max: 3 };
    o.rdzv_backend = Backend::C10d;
    o.rdzv_endpoint = "head:7".into();
    o.rdzv_id = "job".into();
    o.nproc_per_node = Nproc::Count(4);
    o.base_env.push(("A".into(), "1".into()));
    o.torchrun_env = false;
    o.warnings.push("from the launcher".into());
    let c = o.build(&|_| None).expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::C10d {
            host: "head".into(),
            port: 7,
            replicas: Vec::new(),
        }
    );
    assert_eq!((c.min_nodes, c.max_nodes, c.nproc_per_node), (2, 3, 4));
    assert_eq!(c.base_env, vec![("A".to_owned(), "1".to_owned())]);
    assert!(!c.torchrun_env);
    assert!(c.warnings.iter().any(|w| w == "from the launcher"));
    // The environment is read only through the lookup given.
    let c = LaunchOptions::new("t.py")
        .build(&|k| (k == "PYTHON_EXEC").then(|| "/opt/py".to_owned()))
        .expect("valid");
    assert_eq!(c.entrypoint.program, "/opt/py");
    o.rdzv_backend = Backend::Etcd;
    let c = o.build(&|_| None).expect("etcd");
    assert_eq!(
        c.rendezvous,
        Rendezvous::Etcd {
            endpoints: vec!["http://head:7".into()]
        }
    );
}

#[test]
fn etcd_endpoints_and_settings() {
    let etcd = |endpoint: &str, conf: &str| {
        parse(&[
            "--nnodes",
            "2:4",
            "--rdzv-backend",
            "etcd-v2",
            "--rdzv-endpoint",
            endpoint,
            "--rdzv-id",
            "j",
            "--rdzv-conf",
            conf,
            "t.py",
        ])
    };
    let c = etcd(
        "e1, e2:3000,[::1]",
        "protocol=https,cacert=/ca.pem,cert=/c.pem,key=/k.pem,etcd_prefix=/team/rdzv,etcd_lease=3s",
    )
    .expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::Etcd {
            endpoints: vec![
                "https://e1:2379".into(),
                "https://e2:3000".into(),
                "https://[::1]:2379".into()
            ]
        }
    );
    let e = &c.rdzv.etcd;
    assert!(e.https);
    assert_eq!(e.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
    assert_eq!(e.prefix, "/team/rdzv");
    assert_eq!(e.lease, std::time::Duration::from_secs(3));
    // etcd-v2's names for the same files.
    let c = etcd(
        "e1",
        "protocol=https,ca_cert=/a,ssl_cert=/b,ssl_cert_key=/c",
    )
    .expect("valid");
    assert_eq!(
        (c.rdzv.etcd.ca, c.rdzv.etcd.cert, c.rdzv.etcd.key),
        (Some("/a".into()), Some("/b".into()), Some("/c".into()))
    );
    assert_eq!(
        etcd("http://e1:2379", "").expect("a URL").rendezvous,
        Rendezvous::Etcd {
            endpoints: vec!["http://e1:2379".into()]
        }
    );
    for (endpoint, conf, names) in [
        ("", "", "--rdzv-endpoint"),
        ("http://e1", "protocol=https", "protocol"),
        ("e1", "protocol=grpc", "protocol"),
        ("e1", "protocol=https,cert=/c.pem", "cert and key"),
        ("e1", "cacert=/ca.pem", "protocol=https"),
        ("e1", "etcd_lease=500ms", "etcd_lease"),
        ("e1", "etcd_prefix=accel", "etcd_prefix"),
        ("e1", "is_host=true", "is_host"),
    ] {
        let err = etcd(endpoint, conf).expect_err(conf).to_string();
        assert!(err.contains(names), "{endpoint} {conf}: {err}");
    }
    // The etcd keys mean nothing to another backend: refused, not ignored.
    let err = parse(&[
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "h:1",
        "--rdzv-conf",
        "protocol=https",
        "t.py",
    ])
    .expect_err("etcd key with c10d")
    .to_string();
    assert!(err.contains("--rdzv-backend etcd"), "{err}");
}

#[test]
fn several_c10d_endpoints_are_replicas_that_no_agent_hosts() {
    let c = parse(&[
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "head1:7, [::1]:8,head3",
        "--rdzv-id",
        "x",
        "t.py",
    ])
    .expect("valid");
    assert_eq!(
        c.rendezvous,
        Rendezvous::C10d {
            host: "head1".into(),
            port: 7,
            replicas: vec![("::1".into(), 8), ("head3".into(), 29400)],
        }
    );
    let refused = parse(&[
        "--nnodes",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "a:1,b:2",
        "--rdzv-conf",
        "is_host=true",
        "t.py",
    ])
    .expect_err("is_host with replicas");
    assert!(refused.to_string().contains("is_host"), "{refused}");
    let bad = parse(&[
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        "a:1,,b",
        "t.py",
    ])
    .expect_err("an empty endpoint");
    assert!(bad.to_string().contains("--rdzv-endpoint"), "{bad}");
}

#[test]
fn preload_takes_module_names_for_a_python_entrypoint() {
    let c = parse(&["--preload", "torch,torch.distributed", "t.py"]).expect("valid");
    assert_eq!(c.preload, ["torch", "torch.distributed"]);
    assert!(parse(&["t.py"]).expect("valid").preload.is_empty());
    for (args, says) in [
        (
            &["--preload", "torch;rm", "t.py"][..],
            "is not a module name",
        ),
        (&["--preload", "9lives", "t.py"][..], "is not a module name"),
        (
            &["--preload", "torch..nn", "t.py"][..],
            "is not a module name",
        ),
        (
            &["--preload", "torch", "--no-python", "prog"][..],
            "cannot be used with --no-python",
        ),
        (
            &["--preload", "torch", "--fork-server-fd", "5", "t.py"][..],
            "use one",
        ),
    ] {
        let e = parse(args).expect_err("refused").to_string();
        assert!(e.contains(says), "{args:?}: {e}");
    }
    let many = vec!["m"; MAX_PRELOAD + 1].join(",");
    let e = parse(&["--preload", &many, "t.py"]).expect_err("too many");
    assert!(e.to_string().contains("at most"), "{e}");
}

#[test]
fn restart_backoff_reads_base_and_max() {
    let c = parse(&["t.py"]).expect("valid");
    assert_eq!(c.restart_backoff, RestartBackoff::default());
    let c = parse(&[
        "--restart-backoff",
        "500ms:4",
        "--restart-backoff-window",
        "2m",
        "t.py",
    ])
    .expect("valid");
    assert_eq!(
        c.restart_backoff,
        RestartBackoff {
            base: Duration::from_millis(500),
            max: Duration::from_secs(4),
            window: Duration::from_secs(120)
        }
    );
    assert!(parse(&["--restart-backoff", "0", "t.py"])
        .expect("valid")
        .restart_backoff
        .base
        .is_zero());
    let e = parse(&["--restart-backoff", "10:2", "t.py"]).expect_err("max < base");
    assert!(e.to_string().contains("shorter than BASE"), "{e}");
    let e = parse(&["--restart-backoff", "soon", "t.py"]).expect_err("junk");
    assert!(e.to_string().contains("--restart-backoff"), "{e}");
    let b = RestartBackoff::default();
    assert_eq!(b.wait(1), Duration::ZERO);
    assert_eq!(
        b.wait(40),
        Duration::from_secs(30),
        "at most MAX, no overflow"
    );
    assert_eq!(b.wait(u32::MAX), Duration::from_secs(30));
}

#[test]
fn the_file_timer_follows_torchruns_switch_and_path() {
    let build = |env: &[(&str, &str)]| {
        let a = AgentArgs::try_parse_from(["accel-agent", "t.py"]).expect("args");
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        LaunchOptions::from(a)
            .build(&|k| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()))
            .expect("valid")
    };
    assert_eq!(build(&[]).file_timer, None);
    assert_eq!(
        build(&[("TORCHELASTIC_ENABLE_FILE_TIMER", "0")]).file_timer,
        None
    );
    let c = build(&[("TORCHELASTIC_ENABLE_FILE_TIMER", "1")]);
    let path = c.file_timer.expect("on");
    assert!(path.starts_with(std::env::temp_dir()));
    assert!(c.base_env.contains(&(
        "TORCHELASTIC_TIMER_FILE".into(),
        path.to_string_lossy().into_owned()
    )));
    let c = build(&[
        ("TORCHELASTIC_ENABLE_FILE_TIMER", "1"),
        ("TORCHELASTIC_TIMER_FILE", "/run/job/timer"),
    ]);
    assert_eq!(c.file_timer, Some(PathBuf::from("/run/job/timer")));
}

#[test]
fn numa_binding_is_chosen_when_the_options_are_built() {
    let root = tempfile::tempdir().expect("tempdir");
    let at_root =
        |k: &str| (k == crate::numa::ROOT_VARIABLE).then(|| root.path().display().to_string());
    let args = [
        "accel-agent",
        "--nproc-per-node",
        "2",
        "--numa_binding",
        "socket",
        "t.py",
    ];
    let a = AgentArgs::try_parse_from(args).expect("parse");
    assert_eq!(a.numa_binding, Some(crate::numa::AffinityMode::Socket));
    let options = LaunchOptions::from(a);
    // No GPU on the fake machine: refused before anything runs, naming the flag.
    let e = options.build(&at_root).expect_err("no GPU");
    assert!(
        e.0.starts_with("--numa-binding") && e.0.contains("no NVIDIA GPU"),
        "{e}"
    );
    // Without the flag nothing is read.
    let plain = LaunchOptions::new("t.py").build(&at_root).expect("valid");
    assert_eq!(plain.numa_binding, None);
}

#[test]
fn torchruns_logging_and_event_flags_in_both_spellings() {
    use crate::events::EventHandler;
    use crate::logs::filter::LineFilter;
    for (out, err, handler, specs) in [
        (
            "--duplicate-stdout-filters",
            "--duplicate-stderr-filters",
            "--event-log-handler",
            "--logs-specs",
        ),
        (
            "--duplicate_stdout_filters",
            "--duplicate_stderr_filters",
            "--event_log_handler",
            "--logs_specs",
        ),
    ] {
        let cfg = parse(&[
            out, "a,,b,c", err, "", handler, "console", specs, "default", "t.py",
        ])
        .expect("valid");
        assert_eq!(cfg.logs.stdout_filter, Some(LineFilter::parse("a,,b,c")));
        assert_eq!(cfg.logs.stderr_filter, Some(LineFilter::parse("")));
        assert_eq!(cfg.event_log_handler, EventHandler::Console);
    }
    let cfg = parse(&["t.py"]).expect("defaults");
    assert_eq!(cfg.logs.stdout_filter, None, "not given: no filtered file");
    assert_eq!(cfg.event_log_handler, EventHandler::Null);
    assert_eq!(
        cfg.rdzv_backend_name, "c10d",
        "standalone, as torchrun makes it"
    );
    let e = AgentArgs::try_parse_from(["accel-agent", "--logs-specs", "mine", "t.py"])
        .expect_err("no Python to load it");
    assert!(e.to_string().contains("runs no Python"), "{e}");
}

#[test]
fn nnodes_multiple_of_needs_a_dynamic_rendezvous_and_a_range_that_holds_a_multiple() {
    let c10d = |nnodes: &str, k: &str| {
        parse(&[
            "--nnodes",
            nnodes,
            "--nnodes-multiple-of",
            k,
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "h:29400",
            "t.py",
        ])
    };
    assert_eq!(c10d("2:8", "2").expect("valid").nnodes_multiple_of, 2);
    assert_eq!(parse(&["t.py"]).expect("valid").nnodes_multiple_of, 1);
    let e = c10d("3:3", "2").expect_err("no pair in 3..3").to_string();
    assert!(
        e.contains("--nnodes 3:3 holds no multiple") && e.contains("--nnodes 4:4"),
        "{e}"
    );
    let e = c10d("2:8", "0").expect_err("zero").to_string();
    assert!(e.contains("--nnodes-multiple-of"), "{e}");
    let e = parse(&[
        "--nnodes",
        "2",
        "--nnodes-multiple-of",
        "2",
        "--master-addr",
        "h0",
        "t.py",
    ])
    .expect_err("static")
    .to_string();
    assert!(e.contains("needs a dynamic rendezvous"), "{e}");
}
