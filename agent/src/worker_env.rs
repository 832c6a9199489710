//! The environment each worker gets: torchrun's contract (reference:
//! torchrun §2), computed by a pure function so it is unit-tested.
//!
//! Workers inherit the agent's whole environment; the variables below are set
//! on top of it.

use crate::agent::round::RoundInfo;
use crate::config::{Config, Entrypoint};

/// The variables set for local rank `local_rank`; `agent_env` reads the
/// agent's own environment.
pub(crate) fn worker_env(
    cfg: &Config,
    round: &RoundInfo,
    local_rank: u32,
    error_file: &str,
    agent_env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(&'static str, String)> {
    let rank = round.base_rank + local_rank;
    let mut env = vec![
        (
            "LOCAL_RANK",
            if cfg.virtual_local_rank {
                0
            } else {
                local_rank
            }
            .to_string(),
        ),
        ("RANK", rank.to_string()),
        ("GROUP_RANK", round.node_rank.to_string()),
        ("ROLE_RANK", rank.to_string()),
        ("ROLE_NAME", cfg.role.clone()),
        ("LOCAL_WORLD_SIZE", cfg.nproc_per_node.to_string()),
        ("WORLD_SIZE", round.world_size.to_string()),
        ("GROUP_WORLD_SIZE", round.nnodes.to_string()),
        ("ROLE_WORLD_SIZE", round.world_size.to_string()),
        ("MASTER_ADDR", round.master_addr.clone()),
        ("MASTER_PORT", round.master_port.to_string()),
        (
            "TORCHELASTIC_RESTART_COUNT",
            round.restart_count.to_string(),
        ),
        ("TORCHELASTIC_MAX_RESTARTS", round.max_restarts.to_string()),
        ("TORCHELASTIC_RUN_ID", cfg.run_id.clone()),
        // The node-rank-0 agent serves the store at MASTER_ADDR:MASTER_PORT.
        ("TORCHELASTIC_USE_AGENT_STORE", "True".into()),
        (
            "TORCH_NCCL_ASYNC_ERROR_HANDLING",
            agent_env("TORCH_NCCL_ASYNC_ERROR_HANDLING").unwrap_or_else(|| "1".into()),
        ),
        ("TORCHELASTIC_ERROR_FILE", error_file.to_owned()),
        ("TORCHELASTIC_SIGNALS_TO_HANDLE", cfg.signals_text.clone()),
    ];
    // Where this node sits (docs/src/topology.md): its path, and the run of
    // node ranks that share it, for building groups by segment. Only for a
    // node given a path: without one, workers see exactly torchrun's set.
    if !cfg.topology.is_empty() {
        env.extend([
            ("ACCEL_TOPOLOGY", cfg.topology.clone()),
            ("ACCEL_SEGMENT", round.segment.index.to_string()),
            (
                "ACCEL_SEGMENT_FIRST_NODE",
                round.segment.first_node.to_string(),
            ),
            ("ACCEL_SEGMENT_NODES", round.segment.nodes.to_string()),
        ]);
    }
    if let Some(omp) = omp_num_threads(cfg.nproc_per_node, agent_env) {
        env.push(("OMP_NUM_THREADS", omp));
    }
    if cfg.virtual_local_rank {
        let parent = parent_devices(agent_env);
        let device = parent
            .as_ref()
            .and_then(|(_, list)| list.get(local_rank as usize).cloned())
            .unwrap_or_else(|| local_rank.to_string());
        env.push(("CUDA_VISIBLE_DEVICES", device.clone()));
        if matches!(parent, Some(("HIP_VISIBLE_DEVICES", _))) {
            env.push(("HIP_VISIBLE_DEVICES", device));
        }
    }
    env
}

/// `--virtual-local-rank`'s parent mapping, as torch 2.15 reads it: the
/// agent's `HIP_VISIBLE_DEVICES` when set and not empty (on ROCm it takes
/// precedence over `CUDA_VISIBLE_DEVICES`), else its `CUDA_VISIBLE_DEVICES`;
/// the variable's name and its devices. `None`: no mapping (local rank `i`
/// gets device `i`). Worker `i` gets the `i`-th device in
/// `CUDA_VISIBLE_DEVICES`, and in `HIP_VISIBLE_DEVICES` too when that was
/// the mapping.
pub(crate) fn parent_devices(
    agent_env: &dyn Fn(&str) -> Option<String>,
) -> Option<(&'static str, Vec<String>)> {
    let list = |v: String| v.split(',').map(|d| d.trim().to_owned()).collect();
    match agent_env("HIP_VISIBLE_DEVICES") {
        Some(v) if !v.is_empty() => Some(("HIP_VISIBLE_DEVICES", list(v))),
        _ => agent_env("CUDA_VISIBLE_DEVICES").map(|v| ("CUDA_VISIBLE_DEVICES", list(v))),
    }
}

/// Everything set for local rank `local_rank`: the configuration's base
/// variables, then torchrun's (when on), which see the base ones as part of
/// the agent's environment.
pub(crate) fn full_env(
    cfg: &Config,
    round: &RoundInfo,
    local_rank: u32,
    error_file: &str,
    agent_env: &dyn Fn(&str) -> Option<String>,
) -> Vec<(String, String)> {
    let base = |k: &str| {
        cfg.base_env
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .or_else(|| agent_env(k))
    };
    let mut env = cfg.base_env.clone();
    if cfg.torchrun_env {
        env.extend(
            worker_env(cfg, round, local_rank, error_file, &base)
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v)),
        );
    }
    env
}

/// The environment of `--preload`'s zygote: what every worker of this node
/// shares, so a module that reads the environment when it is imported sees
/// what a cold worker would. That is the agent's environment (`agent_env`,
/// every variable; the rendezvous token removed), the launcher's variables,
/// and `OMP_NUM_THREADS`; the round's and the rank's variables come with
/// each fork.
pub(crate) fn zygote_env(
    cfg: &Config,
    agent_env: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = agent_env
        .into_iter()
        .filter(|(k, _)| !crate::supervisor::SECRET_VARIABLES.contains(&k.as_str()))
        .collect();
    let set = |env: &mut Vec<(String, String)>, k: &str, v: String| {
        env.retain(|(n, _)| n != k);
        env.push((k.to_owned(), v));
    };
    for (k, v) in &cfg.base_env {
        set(&mut env, k, v.clone());
    }
    if cfg.torchrun_env {
        let lookup = |k: &str| {
            env.iter()
                .rev()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.clone())
        };
        if let Some(omp) = omp_num_threads(cfg.nproc_per_node, &lookup) {
            set(&mut env, "OMP_NUM_THREADS", omp);
        }
    }
    env
}

/// torchrun's rule: one OpenMP thread per worker when several share a node,
/// unless the user chose a value.
pub(crate) fn omp_num_threads(
    nproc_per_node: u32,
    agent_env: &dyn Fn(&str) -> Option<String>,
) -> Option<String> {
    match agent_env("OMP_NUM_THREADS") {
        Some(v) => Some(v),
        None if nproc_per_node > 1 => Some("1".into()),
        None => None,
    }
}

/// The worker's argv (program first) with `${local_rank}` substituted.
pub(crate) fn worker_argv(entry: &Entrypoint, local_rank: u32) -> Vec<String> {
    let lr = local_rank.to_string();
    std::iter::once(entry.program.clone())
        .chain(entry.leading_args.iter().cloned())
        .chain(
            entry
                .script_args
                .iter()
                .map(|a| a.replace("${local_rank}", &lr)),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::AgentArgs;
    use clap::Parser;

    fn cfg(args: &[&str], env: &dyn Fn(&str) -> Option<String>) -> Config {
        let args = AgentArgs::try_parse_from(args.iter().copied()).expect("args parse");
        crate::config::LaunchOptions::from(args)
            .build(env)
            .expect("valid config")
    }

    fn round() -> RoundInfo {
        RoundInfo {
            round: 3,
            node_rank: 1,
            nnodes: 2,
            world_size: 8,
            base_rank: 4,
            restart_count: 2,
            max_restarts: 5,
            master_addr: "head".into(),
            master_port: 4242,
            segment: Default::default(),
            peer_key: Vec::new(),
        }
    }

    fn get<'a>(env: &'a [(&'static str, String)], k: &str) -> Option<&'a str> {
        env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str())
    }

    #[test]
    fn torchrun_contract() {
        let none = |_: &str| None;
        let c = cfg(
            &[
                "accel-agent",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "4",
                "--rdzv-backend",
                "c10d",
                "--rdzv-id",
                "job7",
                "--role",
                "trainer",
                "train.py",
            ],
            &none,
        );
        let env = worker_env(&c, &round(), 3, "/logs/err.json", &none);
        let expect = [
            ("LOCAL_RANK", "3"),
            ("RANK", "7"),
            ("GROUP_RANK", "1"),
            ("ROLE_RANK", "7"),
            ("ROLE_NAME", "trainer"),
            ("LOCAL_WORLD_SIZE", "4"),
            ("WORLD_SIZE", "8"),
            ("GROUP_WORLD_SIZE", "2"),
            ("ROLE_WORLD_SIZE", "8"),
            ("MASTER_ADDR", "head"),
            ("MASTER_PORT", "4242"),
            ("TORCHELASTIC_RESTART_COUNT", "2"),
            ("TORCHELASTIC_MAX_RESTARTS", "5"),
            ("TORCHELASTIC_RUN_ID", "job7"),
            ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
            ("TORCHELASTIC_ERROR_FILE", "/logs/err.json"),
            ("OMP_NUM_THREADS", "1"),
            (
                "TORCHELASTIC_SIGNALS_TO_HANDLE",
                "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
            ),
        ];
        for (k, v) in expect {
            assert_eq!(get(&env, k), Some(v), "{k}");
        }
        assert_eq!(get(&env, "CUDA_VISIBLE_DEVICES"), None);
        assert_eq!(
            get(&env, "ACCEL_TOPOLOGY"),
            None,
            "no path: torchrun's set only"
        );
    }

    #[test]
    fn a_node_with_a_topology_path_tells_its_workers_their_segment() {
        let none = |_: &str| None;
        let c = cfg(
            &[
                "accel-agent",
                "--nproc-per-node",
                "4",
                "--topology",
                "dc/rack-9",
                "train.py",
            ],
            &none,
        );
        let mut r = round();
        r.segment = crate::agent::round::Segment {
            index: 1,
            first_node: 1,
            nodes: 1,
        };
        let env = worker_env(&c, &r, 0, "/e.json", &none);
        for (k, v) in [
            ("ACCEL_TOPOLOGY", "dc/rack-9"),
            ("ACCEL_SEGMENT", "1"),
            ("ACCEL_SEGMENT_FIRST_NODE", "1"),
            ("ACCEL_SEGMENT_NODES", "1"),
        ] {
            assert_eq!(get(&env, k), Some(v), "{k}");
        }
    }

    #[test]
    fn user_values_win_and_single_workers_keep_openmp_alone() {
        let user = |k: &str| match k {
            "OMP_NUM_THREADS" => Some("8".to_owned()),
            "TORCH_NCCL_ASYNC_ERROR_HANDLING" => Some("0".to_owned()),
            _ => None,
        };
        let none = |_: &str| None;
        let c = cfg(&["accel-agent", "--nproc-per-node", "2", "t.py"], &none);
        let env = worker_env(&c, &round(), 0, "", &user);
        assert_eq!(get(&env, "OMP_NUM_THREADS"), Some("8"));
        assert_eq!(get(&env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), Some("0"));
        let c = cfg(&["accel-agent", "t.py"], &none);
        assert_eq!(
            get(&worker_env(&c, &round(), 0, "", &none), "OMP_NUM_THREADS"),
            None
        );
    }

    #[test]
    fn the_zygote_shares_what_every_worker_gets_and_no_secret() {
        let none = |_: &str| None;
        let mut c = cfg(&["accel-agent", "--nproc-per-node", "2", "t.py"], &none);
        c.base_env = vec![("ACCELERATE_MIXED_PRECISION".into(), "bf16".into())];
        let agent = vec![
            ("PATH".to_owned(), "/bin".to_owned()),
            ("ACCEL_RDZV_TOKEN".to_owned(), "s3cret".to_owned()),
        ];
        let env = zygote_env(&c, agent.clone());
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("PATH"), Some("/bin"));
        assert_eq!(get("ACCELERATE_MIXED_PRECISION"), Some("bf16"));
        assert_eq!(get("OMP_NUM_THREADS"), Some("1"));
        assert_eq!(get("ACCEL_RDZV_TOKEN"), None);
        assert_eq!(get("RANK"), None, "per-rank variables come with each fork");
        // A user's OMP_NUM_THREADS is kept, as workers keep it.
        let mut with_omp = agent;
        with_omp.push(("OMP_NUM_THREADS".into(), "4".into()));
        let env = zygote_env(&c, with_omp);
        let omp: Vec<_> = env.iter().filter(|(n, _)| n == "OMP_NUM_THREADS").collect();
        assert_eq!(omp, [&("OMP_NUM_THREADS".to_owned(), "4".to_owned())]);
    }

    #[test]
    fn virtual_local_rank_pins_one_device() {
        let env = |k: &str| (k == "CUDA_VISIBLE_DEVICES").then(|| "4,5,6".to_owned());
        let c = cfg(
            &[
                "accel-agent",
                "--nproc-per-node",
                "3",
                "--virtual-local-rank",
                "t.py",
            ],
            &env,
        );
        let w = worker_env(&c, &round(), 2, "", &env);
        assert_eq!(get(&w, "LOCAL_RANK"), Some("0"));
        assert_eq!(get(&w, "CUDA_VISIBLE_DEVICES"), Some("6"));
    }

    #[test]
    fn virtual_local_rank_maps_through_hip_visible_devices_first_as_torch_2_15() {
        let both = |k: &str| match k {
            "HIP_VISIBLE_DEVICES" => Some("2, 3".to_owned()),
            "CUDA_VISIBLE_DEVICES" => Some("0,1".to_owned()),
            _ => None,
        };
        let args = [
            "accel-agent",
            "--nproc-per-node",
            "2",
            "--virtual-local-rank",
            "t.py",
        ];
        let c = cfg(&args, &both);
        let w = worker_env(&c, &round(), 1, "", &both);
        assert_eq!(get(&w, "CUDA_VISIBLE_DEVICES"), Some("3"));
        assert_eq!(get(&w, "HIP_VISIBLE_DEVICES"), Some("3"));
        // An empty HIP_VISIBLE_DEVICES is no mapping: CUDA's is used, and
        // HIP's is left as it was.
        let empty_hip = |k: &str| match k {
            "HIP_VISIBLE_DEVICES" => Some(String::new()),
            "CUDA_VISIBLE_DEVICES" => Some("0,1".to_owned()),
            _ => None,
        };
        let w = worker_env(&c, &round(), 1, "", &empty_hip);
        assert_eq!(get(&w, "CUDA_VISIBLE_DEVICES"), Some("1"));
        assert_eq!(get(&w, "HIP_VISIBLE_DEVICES"), None);
        // No mapping at all: device i.
        let none = |_: &str| None;
        let w = worker_env(&c, &round(), 1, "", &none);
        assert_eq!(get(&w, "CUDA_VISIBLE_DEVICES"), Some("1"));
        assert_eq!(get(&w, "HIP_VISIBLE_DEVICES"), None);
        // Fewer devices than workers: refused before anything runs.
        let one = |k: &str| (k == "HIP_VISIBLE_DEVICES").then(|| "5".to_owned());
        let args = AgentArgs::try_parse_from(args).expect("args parse");
        let e = crate::config::LaunchOptions::from(args)
            .build(&one)
            .expect_err("two workers, one device");
        assert!(
            e.to_string().contains("HIP_VISIBLE_DEVICES='5' lists 1"),
            "{e}"
        );
    }

    #[test]
    fn argv_forms() {
        let none = |_: &str| None;
        let py = |k: &str| (k == "PYTHON_EXEC").then(|| "/venv/bin/python".to_owned());
        let c = cfg(
            &[
                "accel-agent",
                "train.py",
                "--lr",
                "0.1",
                "--out=o${local_rank}",
            ],
            &py,
        );
        assert_eq!(
            worker_argv(&c.entrypoint, 2),
            [
                "/venv/bin/python",
                "-u",
                "train.py",
                "--lr",
                "0.1",
                "--out=o2"
            ]
        );
        let c = cfg(&["accel-agent", "-m", "pkg.train", "x"], &none);
        assert_eq!(
            worker_argv(&c.entrypoint, 0),
            ["python3", "-u", "-m", "pkg.train", "x"]
        );
        let c = cfg(
            &["accel-agent", "--no-python", "/bin/echo", "${local_rank}"],
            &none,
        );
        assert_eq!(worker_argv(&c.entrypoint, 1), ["/bin/echo", "1"]);
    }
}
