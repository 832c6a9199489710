//! The tokens a server accepts, re-read from its token file when it changes.
//!
//! # Why
//! A token read once at start cannot be rotated without restarting every
//! server replica, and an operator who rotates a Kubernetes Secret expects
//! the new value to take effect as the kubelet updates the mounted file. So
//! the server's token file may hold a *current* and a *next* token, one a
//! line, both accepted: write `current\nnext`, move the agents to `next`,
//! then write `next` alone, and the old one is refused from then on. No
//! restart, and no running job loses its rendezvous.
//!
//! # How
//! Every check looks at the file's size, modification time and inode at
//! most once a second ([`RECHECK`]), and reads it again only when they
//! changed. One caller looks while the others go on with the tokens they
//! have, so a file system that hangs holds one call, never every call. A file that cannot be read or holds no valid token keeps the
//! tokens last read (a half-written file must not lock every agent out),
//! with a warning once per change. Every accepted token is compared, in
//! constant time, whichever matches: the time taken says nothing about
//! which one did.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tonic::metadata::{Ascii, MetadataValue};

use crate::auth::{Token, TokenError};
use crate::stamp::{lock_unless_busy, Stamp};

/// How often the file is looked at, at most.
pub const RECHECK: Duration = Duration::from_secs(1);
/// Most tokens a file may hold (a current and a next, and room for an
/// operator's overlap of two rotations).
pub const MAX_TOKENS: usize = 4;

/// The tokens a server accepts; cheap to clone (one shared state).
#[derive(Clone)]
pub struct Accepted(Arc<Inner>);

impl std::fmt::Debug for Accepted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Accepted(..)")
    }
}

struct Inner {
    /// Where they come from (`None`: a variable, fixed).
    file: Option<PathBuf>,
    /// The tokens accepted now: read by every call.
    tokens: RwLock<Arc<Vec<Token>>>,
    /// When the file was last looked at, and how it looked: taken by the
    /// one caller that looks again (`try_lock`: a file system that hangs
    /// holds that caller, never the others).
    check: Mutex<Check>,
}

struct Check {
    /// What the file looked like when it was last read.
    stamp: Option<Stamp>,
    /// When the file was last looked at.
    checked: Instant,
}

/// The tokens of a file's text: one a line, blank lines skipped, at least
/// one and at most [`MAX_TOKENS`].
pub fn parse_tokens(text: &str, origin: &str) -> Result<Vec<Token>, TokenError> {
    let tokens = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| Token::new(l, origin))
        .collect::<Result<Vec<_>, _>>()?;
    match tokens.len() {
        0 => Err(TokenError::Invalid {
            origin: origin.to_owned(),
            problem: "is empty",
        }),
        n if n > MAX_TOKENS => Err(TokenError::Invalid {
            origin: origin.to_owned(),
            problem: "holds more than 4 tokens (one a line: the current and the next)",
        }),
        _ => Ok(tokens),
    }
}

impl Accepted {
    /// One fixed token (a variable's, or an embedded server's).
    pub fn fixed(token: Token) -> Self {
        Self(Arc::new(Inner {
            file: None,
            tokens: RwLock::new(Arc::new(vec![token])),
            check: Mutex::new(Check {
                stamp: None,
                checked: Instant::now(),
            }),
        }))
    }

    /// The tokens of file `path`, read now (an error here is a start-up
    /// error) and again whenever it changes.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        let stamp = Stamp::of(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let tokens = read(path)?;
        Ok(Self(Arc::new(Inner {
            file: Some(path.to_owned()),
            tokens: RwLock::new(Arc::new(tokens)),
            check: Mutex::new(Check {
                stamp: Some(stamp),
                checked: Instant::now(),
            }),
        })))
    }

    /// From `file` if given, else the variable `var` (through `env`);
    /// `None` when neither is set.
    pub fn resolve(
        file: Option<&Path>,
        var: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TokenError> {
        if let Some(file) = file {
            return Self::from_file(file).map(Some);
        }
        Ok(Token::resolve(None, var, env)?.map(Self::fixed))
    }

    /// Whether a request's `authorization` value carries one of the
    /// tokens (the file looked at again first, at most once a second).
    pub fn admits(&self, header: Option<&MetadataValue<Ascii>>) -> bool {
        self.admits_bytes(header.map(MetadataValue::as_bytes))
    }

    /// [`Accepted::admits`] for an `authorization` header's raw bytes.
    pub fn admits_bytes(&self, header: Option<&[u8]>) -> bool {
        self.look_again(Instant::now());
        // Every token compared: the time says nothing of which matched.
        self.tokens()
            .iter()
            .fold(false, |any, t| t.admits_bytes(header) | any)
    }

    /// How many tokens are accepted now.
    pub fn count(&self) -> usize {
        self.tokens().len()
    }

    fn tokens(&self) -> Arc<Vec<Token>> {
        self.0
            .tokens
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Looks at the file again if it is due (and nobody else is looking),
    /// taking its tokens if it changed.
    fn look_again(&self, now: Instant) {
        let Some(file) = &self.0.file else {
            return;
        };
        let Some(mut check) = lock_unless_busy(&self.0.check) else {
            return;
        };
        if let Some(tokens) = refresh(file, &mut check, now) {
            *self
                .0
                .tokens
                .write()
                .unwrap_or_else(PoisonError::into_inner) = Arc::new(tokens);
        }
    }
}

fn read(path: &Path) -> Result<Vec<Token>, TokenError> {
    // Token::from_file's checks (size, who may read it), on the whole file.
    Token::check_file(path)?;
    let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_tokens(&text, &format!("file {}", path.display()))
}

/// Reads the file again if it changed since it was last read, at most once
/// every [`RECHECK`]: its tokens, if it changed and holds valid ones; a file
/// that cannot be read, or holds no valid token, keeps the tokens last read
/// (`None`, a warning once per change).
fn refresh(path: &Path, state: &mut Check, now: Instant) -> Option<Vec<Token>> {
    if now.saturating_duration_since(state.checked) < RECHECK {
        return None;
    }
    state.checked = now;
    let stamp = Stamp::of(path).ok();
    if stamp.is_none() || stamp == state.stamp {
        return None;
    }
    state.stamp = stamp;
    match read(path) {
        Ok(tokens) => {
            tracing::info!(file = %path.display(), tokens = tokens.len(), "the token file changed: accepting its tokens from now on");
            Some(tokens)
        }
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "the token file changed but holds no valid token; still accepting the tokens last read");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "current-token-0123456789";
    const B: &str = "next-token-0123456789abc";

    fn bearer(t: &str) -> Vec<u8> {
        format!("Bearer {t}").into_bytes()
    }

    #[test]
    fn a_file_of_two_tokens_admits_both_and_one_line_files_still_work() {
        assert_eq!(
            parse_tokens(&format!("{A}\n\n{B}\n"), "f")
                .expect("two")
                .len(),
            2
        );
        assert_eq!(
            parse_tokens(&format!("  {A}  \n"), "f").expect("one").len(),
            1
        );
        assert!(parse_tokens("\n \n", "f").is_err());
        let five = [A; 5].join("\n");
        assert!(parse_tokens(&five, "f").is_err());
        assert!(parse_tokens("has a space inside it here", "f").is_err());
    }

    #[test]
    fn a_rotation_is_seen_without_a_restart_and_a_bad_write_keeps_the_last_tokens() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("token");
        std::fs::write(&f, format!("{A}\n")).expect("write");
        let accepted = Accepted::from_file(&f).expect("read");
        assert!(accepted.admits_bytes(Some(&bearer(A))));
        assert!(!accepted.admits_bytes(Some(&bearer(B))));
        assert!(!accepted.admits_bytes(None));
        let t = accepted.0.check.lock().expect("check").checked;
        // Current and next: both, once the file is looked at again.
        std::fs::write(&f, format!("{A}\n{B}\n")).expect("write");
        accepted.look_again(t + RECHECK / 2);
        assert_eq!(accepted.count(), 1, "not looked at twice within a second");
        accepted.look_again(t + RECHECK);
        assert_eq!(accepted.count(), 2);
        // A half-written file: the last tokens stay.
        std::fs::write(&f, "").expect("write");
        accepted.look_again(t + RECHECK * 2);
        assert_eq!(accepted.count(), 2);
        // Next alone: the current one is refused from then on.
        std::fs::write(&f, format!("{B}\n")).expect("write");
        accepted.look_again(t + RECHECK * 3);
        assert_eq!(accepted.count(), 1);
        let tokens = accepted.tokens();
        assert!(tokens[0].admits_bytes(Some(&bearer(B))));
        assert!(!tokens[0].admits_bytes(Some(&bearer(A))));
        // While one caller looks (a file system that hangs), the others
        // go on with the tokens they have.
        let looking = accepted.0.check.lock().expect("check");
        std::fs::write(&f, format!("{A}\n")).expect("write");
        accepted.look_again(t + RECHECK * 4);
        assert_eq!(accepted.count(), 1);
        assert!(accepted.admits_bytes(Some(&bearer(B))));
        drop(looking);
    }
}
