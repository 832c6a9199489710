//! `rdzv-server`: the rendezvous daemon for the head node.

use std::process::ExitCode;

use rendezvous_server::config::{Command, ServerArgs};

/// The static (musl) builds' allocator: musl's malloc made the shipped
/// binaries slower and larger than the glibc build (BENCHMARKS.md,
/// "Shipped binaries"); glibc builds keep glibc's malloc.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Makes mimalloc return freed memory to the system at once: with its
/// default 10 ms purge delay, what a burst (every node joining) freed stayed
/// resident until the allocator's next busy moment, 9 % more memory per
/// connected agent than glibc's malloc at 10,000 agents, for no CPU saved.
/// First thing in `main`: mimalloc's options are set before any thread runs.
#[cfg(target_env = "musl")]
fn tune_allocator() {
    /// `mi_option_purge_delay` in mimalloc 2's `mi_option_t` (the crate's `v2`).
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: one store into mimalloc's option table, from the only thread.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, 0) }
}

fn main() -> ExitCode {
    #[cfg(target_env = "musl")]
    tune_allocator();
    if let Some(code) = accel_input::generated::<ServerArgs>() {
        return code;
    }
    // Usage errors exit 2 and quote only excerpts of the values.
    let args: ServerArgs = accel_input::parse_or_exit();
    accel_telemetry::logging::init(args.log_format, "RUST_LOG", "info", true);
    let env = |k: &str| std::env::var(k).ok();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("rdzv-server: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Some(command) = &args.command {
        return match runtime.block_on(rendezvous_server::status::run(command, &env)) {
            Ok(text) => {
                // A reader that went away (`rdzv-server stacks J | head`)
                // is not a failure, and never a panic.
                use std::io::Write as _;
                let mut out = std::io::stdout().lock();
                let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
                ExitCode::SUCCESS
            }
            Err(e) => {
                let name = match command {
                    Command::Status { .. } => "status",
                    Command::Quarantine { .. } => "quarantine",
                    Command::Stacks { .. } => "stacks",
                };
                eprintln!("rdzv-server {name}: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let settings = args.tokens(&env).and_then(|t| {
        let tls = args.tls().map_err(|e| e.to_string())?;
        args.check_exposure(&t, tls.is_some())?;
        Ok((t, tls))
    });
    let (tokens, tls) = match settings {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rdzv-server: {e}");
            return ExitCode::from(2);
        }
    };
    let files = accel_wire::raise_open_file_limit();
    runtime.block_on(async {
        let listener = match tokio::net::TcpListener::bind(args.bind).await {
            Ok(l) => l,
            Err(e) => {
                eprintln!(
                    "rdzv-server: cannot listen on {}: {e}; pick another --bind",
                    args.bind
                );
                return ExitCode::from(2);
            }
        };
        let bound = listener.local_addr().unwrap_or(args.bind);
        let metrics = match args.metrics() {
            accel_telemetry::Bind::Off => None,
            accel_telemetry::Bind::At(addr) => match accel_telemetry::http::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) => {
                    eprintln!("rdzv-server: {e}");
                    return ExitCode::from(2);
                }
            },
        };
        let metrics_addr = metrics.as_ref().and_then(|l| l.local_addr().ok());
        let lighthouse = match args.lighthouse {
            None => None,
            Some(addr) => match tokio::net::TcpListener::bind(addr).await {
                Ok(l) => Some(l),
                Err(e) => {
                    eprintln!("rdzv-server: cannot listen on {addr}: {e}; pick another --lighthouse");
                    return ExitCode::from(2);
                }
            },
        };
        let lighthouse_addr = lighthouse.as_ref().and_then(|l| l.local_addr().ok());
        let replication = match args.etcd(bound) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("rdzv-server: {e}");
                return ExitCode::from(2);
            }
        };
        let metrics_at = metrics_addr.map_or_else(|| "off".to_owned(), |a| a.to_string());
        tracing::info!(addr = %bound, metrics = %metrics_at, authenticated = tokens.required(), tls = tls.is_some(), open_files = files, "rdzv-server listening");
        if let Some(path) = &args.address_file {
            let text = rendezvous_server::config::address_file_text(
                bound,
                metrics_addr,
                lighthouse_addr,
            );
            if let Err(e) = rendezvous_server::config::write_address_file(path, &text) {
                eprintln!(
                    "rdzv-server: cannot write --address-file {}: {e}",
                    path.display()
                );
                return ExitCode::from(2);
            }
        }
        // A restart without etcd holds fresh jobs a drop limit (`incarnation`).
        let state_dir = args
            .state_dir
            .clone()
            .or_else(|| std::env::var_os("STATE_DIRECTORY").map(std::path::PathBuf::from));
        let restarted = match (&state_dir, &replication) {
            (Some(dir), None) => {
                use rendezvous_server::incarnation::Marker;
                if let Err(e) = Marker::usable(dir) {
                    eprintln!("rdzv-server: --state-dir {}: {e}", dir.display());
                    return ExitCode::from(2);
                }
                // A full or read-only disk must not keep the rendezvous
                // down: it serves, as after a restart (the safe side).
                let restarted = match Marker::take(dir, bound.port()) {
                    Ok((_, restarted)) => restarted,
                    Err(e) => {
                        tracing::warn!(state_dir = %dir.display(), error = %e, "cannot note this start in the state directory; serving as after a restart");
                        true
                    }
                };
                if restarted {
                    tracing::warn!(state_dir = %dir.display(), "an earlier rdzv-server ran on this port and may have left jobs running: a job this server does not know forms no round for one drop limit, so its running nodes are relearned first");
                }
                restarted
            }
            _ => false,
        };
        let options = rendezvous_server::ServeOptions {
            finished_job_ttl: args.finished_job_ttl,
            may_rejoin_after_shutdown: true,
            tokens,
            limits: args.limits(),
            tls,
            store: None,
            replication,
            ends_with_job: false,
            metrics: Default::default(),
            restarted,
        };
        let shutdown = rendezvous_server::signal::shutdown();
        let lighthouse = lighthouse.map(|l| {
            let shared = rendezvous_server::lighthouse::service::Shared::new(
                args.lighthouse_config(),
                args.lighthouse_allow.clone(),
            );
            (l, shared)
        });
        match rendezvous_server::serve_all(listener, metrics, lighthouse, options, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("rdzv-server: {e}");
                ExitCode::FAILURE
            }
        }
    })
}
