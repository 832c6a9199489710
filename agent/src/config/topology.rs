//! This node's topology path, from the first source that names one:
//!
//! | source | example |
//! |---|---|
//! | `--topology PATH` (`PET_TOPOLOGY`) | `zone-a/rack-3/nvl-0` |
//! | `--topology-file FILE` (`PET_TOPOLOGY_FILE`): the file's text, trimmed | an operator's per-host file |
//! | Slurm's `SLURM_TOPOLOGY_ADDR`, its switch parts (by `SLURM_TOPOLOGY_ADDR_PATTERN`) joined by `/` | `s0.s3.node17` with `switch.switch.node` gives `s0/s3` |
//! | none | empty: the node's place is unknown |
//!
//! The rendezvous orders node ranks by it (the server's `job::placement`).
//! A path given on purpose (a flag, a file) that is not valid stops the
//! agent with the reason; one found in the environment (Slurm) that is
//! not valid is left out with a warning, since the job can run without it.

use std::path::Path;

use accel_rdzv_client::topology::check;

/// Most bytes read from a `--topology-file`.
const MAX_FILE_BYTES: u64 = 4096;

/// The path this node joins with; `warnings` gets what was left out.
pub(super) fn resolve(
    flag: Option<&str>,
    file: Option<&Path>,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<String, String> {
    if let Some(path) = flag.map(str::trim).filter(|p| !p.is_empty()) {
        check(path).map_err(|e| format!("--topology: {e}"))?;
        return Ok(path.to_owned());
    }
    if let Some(file) = file.filter(|f| !f.as_os_str().is_empty()) {
        let path = read_file(file)?;
        check(&path).map_err(|e| format!("--topology-file {}: {e}", file.display()))?;
        return Ok(path);
    }
    if let Some(addr) = env("SLURM_TOPOLOGY_ADDR").filter(|a| !a.is_empty()) {
        let pattern = env("SLURM_TOPOLOGY_ADDR_PATTERN").unwrap_or_default();
        let path = from_slurm(&addr, &pattern);
        return match check(&path) {
            Ok(()) => Ok(path),
            Err(e) => {
                warnings.push(format!(
                    "SLURM_TOPOLOGY_ADDR '{}' does not make a topology path ({e}); \
                     joining without one (pass --topology to set it)",
                    accel_input::excerpt(&addr)
                ));
                Ok(String::new())
            }
        };
    }
    Ok(String::new())
}

fn read_file(file: &Path) -> Result<String, String> {
    use std::io::Read as _;
    let mut text = String::new();
    std::fs::File::open(file)
        .and_then(|f| f.take(MAX_FILE_BYTES + 1).read_to_string(&mut text))
        .map_err(|e| format!("--topology-file {}: {e}", file.display()))?;
    if text.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "--topology-file {}: more than {MAX_FILE_BYTES} bytes; it should hold one path, like zone-a/rack-3/nvl-0",
            file.display()
        ));
    }
    Ok(text.trim().to_owned())
}

/// The switch parts of a Slurm topology address: the parts whose pattern
/// entry is not `node` (without a pattern, every part but the last, the
/// node's own name), joined by `/`.
pub(super) fn from_slurm(addr: &str, pattern: &str) -> String {
    let parts: Vec<&str> = addr.split('.').collect();
    let kinds: Vec<&str> = pattern.split('.').collect();
    let switches: Vec<&str> = if pattern.is_empty() || kinds.len() != parts.len() {
        parts[..parts.len().saturating_sub(1)].to_vec()
    } else {
        parts
            .iter()
            .zip(&kinds)
            .filter(|(_, k)| **k != "node")
            .map(|(p, _)| *p)
            .collect()
    };
    switches.join("/")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        }
    }

    #[test]
    fn slurm_addresses_keep_their_switches() {
        assert_eq!(from_slurm("s0.s3.node17", "switch.switch.node"), "s0/s3");
        assert_eq!(from_slurm("s0.s3.node17", ""), "s0/s3");
        assert_eq!(from_slurm("node17", "node"), "");
        assert_eq!(from_slurm("b2.node17", "block.node"), "b2");
    }

    #[test]
    fn the_flag_comes_first_then_the_file_then_slurm() {
        let slurm = env_of(&[
            ("SLURM_TOPOLOGY_ADDR", "s0.s1.n1"),
            ("SLURM_TOPOLOGY_ADDR_PATTERN", "switch.switch.node"),
        ]);
        let mut w = Vec::new();
        assert_eq!(
            resolve(Some("zone-a/rack-1"), None, &slurm, &mut w).as_deref(),
            Ok("zone-a/rack-1")
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("topology");
        std::fs::write(&file, "zone-b/rack-2\n").expect("write");
        assert_eq!(
            resolve(None, Some(&file), &slurm, &mut w).as_deref(),
            Ok("zone-b/rack-2")
        );
        assert_eq!(resolve(None, None, &slurm, &mut w).as_deref(), Ok("s0/s1"));
        assert_eq!(resolve(None, None, &env_of(&[]), &mut w).as_deref(), Ok(""));
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn a_bad_path_given_on_purpose_stops_one_found_is_left_out() {
        let none = env_of(&[]);
        let mut w = Vec::new();
        let e = resolve(Some("rack 3"), None, &none, &mut w).expect_err("refused");
        assert!(e.starts_with("--topology: ") && e.contains("' '"), "{e}");
        let e = resolve(
            None,
            Some(Path::new("/nonexistent/topology")),
            &none,
            &mut w,
        )
        .expect_err("refused");
        assert!(e.contains("/nonexistent/topology"), "{e}");
        let odd = env_of(&[("SLURM_TOPOLOGY_ADDR", "sw 1.n1")]);
        assert_eq!(resolve(None, None, &odd, &mut w).as_deref(), Ok(""));
        assert_eq!(w.len(), 1);
        assert!(w[0].contains("SLURM_TOPOLOGY_ADDR"), "{w:?}");
    }
}
