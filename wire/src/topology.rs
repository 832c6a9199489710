//! A node's topology path: where it sits in the machine, outermost part
//! first (`zone-a/rack-3/nvl-0`). The server orders node ranks by it, so that
//! nodes sharing the innermost group (a rack, a switch, an NVLink domain)
//! get contiguous ranks.
//!
//! Both ends check a path the same way: the agent before it joins (so a
//! typo in `--topology` is named at start, with the flag), the server on
//! every join (a path is untrusted input that is stored, compared and
//! printed). The syntax is deliberately narrow, the characters of host
//! names and Slurm switch names, so a path never needs escaping in logs,
//! status output or environment variables.

/// Longest topology path, in bytes.
pub const MAX_TOPOLOGY_BYTES: usize = 256;
/// Most `/`-separated parts of a topology path.
pub const MAX_TOPOLOGY_PARTS: usize = 16;

/// Why a topology path is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// Longer than [`MAX_TOPOLOGY_BYTES`].
    #[error("the topology path has {0} bytes; the limit is {MAX_TOPOLOGY_BYTES}")]
    TooLong(usize),
    /// More than [`MAX_TOPOLOGY_PARTS`] parts.
    #[error("the topology path has {0} parts; the limit is {MAX_TOPOLOGY_PARTS}")]
    TooDeep(usize),
    /// An empty part (`a//b`, a leading or trailing `/`).
    #[error("the topology path '{0}' has an empty part; write parts joined by single '/', like zone-a/rack-3/nvl-0")]
    EmptyPart(String),
    /// A character outside letters, digits and `. _ : -`.
    #[error("the topology path has the character {0:?}; parts may hold only letters, digits and . _ : - (like zone-a/rack-3/nvl-0)")]
    BadChar(char),
}

/// Checks a topology path; the empty path (no topology known) is valid.
pub fn check(path: &str) -> Result<(), TopologyError> {
    if path.is_empty() {
        return Ok(());
    }
    if path.len() > MAX_TOPOLOGY_BYTES {
        return Err(TopologyError::TooLong(path.len()));
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '/' | '.' | '_' | ':' | '-')))
    {
        return Err(TopologyError::BadChar(c));
    }
    let parts = path.split('/').count();
    if parts > MAX_TOPOLOGY_PARTS {
        return Err(TopologyError::TooDeep(parts));
    }
    if path.split('/').any(str::is_empty) {
        return Err(TopologyError::EmptyPart(path.to_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_of_names_joined_by_slashes_pass() {
        for p in ["", "nvl-0", "zone-a/rack-3/nvl-0", "s0.s1:x_y", "a/b/c/d"] {
            assert_eq!(check(p), Ok(()), "{p}");
        }
    }

    #[test]
    fn each_refusal_names_its_limit() {
        assert_eq!(check("a//b"), Err(TopologyError::EmptyPart("a//b".into())));
        assert!(matches!(check("/a"), Err(TopologyError::EmptyPart(_))));
        assert!(matches!(check("a/"), Err(TopologyError::EmptyPart(_))));
        assert_eq!(check("rack 3"), Err(TopologyError::BadChar(' ')));
        assert_eq!(check("r\u{1b}[31m"), Err(TopologyError::BadChar('\u{1b}')));
        assert_eq!(check("zoné"), Err(TopologyError::BadChar('é')));
        assert_eq!(check(&"a".repeat(257)), Err(TopologyError::TooLong(257)));
        assert_eq!(check(&["a"; 17].join("/")), Err(TopologyError::TooDeep(17)));
        assert!(check(&["a"; 16].join("/")).is_ok());
        let msg = check("rack 3").expect_err("refused").to_string();
        assert!(msg.contains("zone-a/rack-3/nvl-0"), "{msg}");
    }
}
