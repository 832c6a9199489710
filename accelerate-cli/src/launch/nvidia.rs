//! accelerate's RTX 40 rule: consumer RTX 40 GPUs on drivers older than
//! 550.40.07 hang in NCCL's peer-to-peer and InfiniBand paths, so with more
//! than one such GPU accelerate turns both off (`NCCL_P2P_DISABLE=1`,
//! `NCCL_IB_DISABLE=1`, unless already set) for its multi-GPU and DeepSpeed
//! launchers. It asks `nvidia-smi`, not CUDA, and so does accel.

use std::process::Command;

/// The driver version from which P2P and IB work on RTX 40 cards.
const FIXED_DRIVER: [u64; 3] = [550, 40, 7];

/// Whether the GPUs lack P2P/IB support: `gpus` is `nvidia-smi
/// --query-gpu=count,name --format=csv,noheader` output, `driver` the
/// first line of `--query-gpu=driver_version`.
pub fn p2p_ib_unsupported(gpus: &str, driver: &str) -> bool {
    let names: Vec<&str> = gpus
        .trim()
        .lines()
        .filter_map(|l| l.split_once(',').map(|(_, name)| name.trim()))
        .collect();
    if names.len() < 2 || !names.iter().any(|n| n.contains("RTX 40")) {
        return false;
    }
    let version: Vec<u64> = driver
        .trim()
        .lines()
        .next()
        .unwrap_or("")
        .split('.')
        .map(|p| p.trim().parse().unwrap_or(0))
        .collect();
    version.as_slice() < FIXED_DRIVER.as_slice()
}

/// Asks `nvidia-smi` (on `PATH`); `false` when it is missing or fails, as
/// accelerate treats any error.
pub fn detect() -> bool {
    let query = |arg: &str| {
        Command::new("nvidia-smi")
            .args([arg, "--format=csv,noheader"])
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    match query("--query-gpu=count,name") {
        Some(gpus) => query("--query-gpu=driver_version")
            .is_some_and(|driver| p2p_ib_unsupported(&gpus, &driver)),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::p2p_ib_unsupported;

    #[test]
    fn only_several_rtx_40_on_old_drivers() {
        let two = "2, NVIDIA GeForce RTX 4090\n2, NVIDIA GeForce RTX 4090\n";
        assert!(p2p_ib_unsupported(two, "535.104.05\n535.104.05"));
        assert!(!p2p_ib_unsupported(two, "550.40.07"));
        assert!(!p2p_ib_unsupported(two, "560.1"));
        assert!(!p2p_ib_unsupported("1, NVIDIA GeForce RTX 4090\n", "535.1"));
        assert!(!p2p_ib_unsupported(
            "2, NVIDIA A100\n2, NVIDIA A100\n",
            "535.1"
        ));
    }
}
