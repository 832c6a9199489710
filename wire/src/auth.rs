//! The rendezvous token on the client's side, and the token itself.
//!
//! A server with a token refuses every call that does not carry
//! `authorization: Bearer <token>`; a client attaches it to every call
//! ([`AttachToken`]). The token is defined here, below both ends: the agent
//! and `rdzv-server status` load it ([`client_token`]), the server checks it
//! ([`Token::admits`], in constant time). `Token`'s `Debug` hides it, and it
//! is never logged.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// A token file larger than this is not a token.
const MAX_TOKEN_FILE: u64 = 4096;
/// The metadata key the token travels in.
pub const AUTHORIZATION: &str = "authorization";

/// Why a token could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    /// The file could not be read.
    #[error("cannot read the token file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is too large to hold a token.
    #[error("the token file {path} has {len} bytes; a token is at most {MAX_TOKEN_FILE} bytes (is it the right file?)")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// The token is empty or cannot travel in a gRPC header.
    #[error("the token from {origin} {problem}; use a random string of printable ASCII without spaces, e.g. `openssl rand -hex 32`")]
    Invalid {
        /// Where it came from (a file, or a variable).
        origin: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

/// The shared secret of a rendezvous.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(..)")
    }
}

impl Token {
    /// A token from a string (an environment variable's value); surrounding
    /// whitespace is ignored. `origin` names where it came from, for errors.
    pub fn new(value: &str, origin: &str) -> Result<Self, TokenError> {
        let value = value.trim();
        let invalid = |problem| TokenError::Invalid {
            origin: origin.to_owned(),
            problem,
        };
        if value.is_empty() {
            return Err(invalid("is empty"));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(invalid(
                "contains spaces, control characters or non-ASCII bytes",
            ));
        }
        if value.len() < 16 {
            return Err(invalid("is shorter than 16 characters"));
        }
        Ok(Self(value.to_owned()))
    }

    /// The token in file `path` (surrounding whitespace, such as the final
    /// newline, is ignored). Warns when other users may read the file.
    pub fn from_file(path: &Path) -> Result<Self, TokenError> {
        Self::check_file(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::new(&text, &format!("file {}", path.display()))
    }

    /// The token a client sends from file `path`: its first (a server's
    /// file may hold a current and a next token, one a line; during a
    /// rotation the first is the one to send).
    pub fn first_in_file(path: &Path) -> Result<Self, TokenError> {
        Self::check_file(path)?;
        let text = std::fs::read_to_string(path).map_err(|source| TokenError::Read {
            path: path.to_owned(),
            source,
        })?;
        let origin = format!("file {}", path.display());
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
        Self::new(first, &origin)
    }

    /// What a token file must be before it is read: at most
    /// `MAX_TOKEN_FILE` bytes; a warning when other users may read it.
    pub fn check_file(path: &Path) -> Result<(), TokenError> {
        let read = |source| TokenError::Read {
            path: path.to_owned(),
            source,
        };
        let meta = std::fs::metadata(path).map_err(read)?;
        if meta.len() > MAX_TOKEN_FILE {
            return Err(TokenError::TooLarge {
                path: path.to_owned(),
                len: meta.len(),
            });
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::{MetadataExt, PermissionsExt};
            // Readable by its group is how a service group shares it
            // (Kubernetes' fsGroup, a unit's Group=): fine when that group
            // is one of this process's (primary or supplementary); anyone
            // else's access is worth a word.
            let mode = meta.permissions().mode();
            let gid = nix::unistd::Gid::from_raw(meta.gid());
            let own_group = gid == nix::unistd::getegid()
                || nix::unistd::getgroups().is_ok_and(|g| g.contains(&gid));
            if mode & 0o007 != 0 || (mode & 0o070 != 0 && !own_group) {
                tracing::warn!(file = %path.display(), "the token file may be read by other users; restrict it with chmod 600 (or 640 with this service's own group)");
            }
        }
        Ok(())
    }

    /// The token from `file` if given, else from the environment variable
    /// `var` (looked up through `env`); `None` when neither is set.
    pub fn resolve(
        file: Option<&Path>,
        var: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Self>, TokenError> {
        if let Some(file) = file {
            return Self::from_file(file).map(Some);
        }
        match env(var) {
            Some(v) => Self::new(&v, &format!("${var}")).map(Some),
            None => Ok(None),
        }
    }

    /// The `authorization` metadata value that carries it.
    pub fn bearer(&self) -> MetadataValue<Ascii> {
        // Checked printable ASCII at construction, so always a valid value.
        MetadataValue::try_from(format!("Bearer {}", self.0))
            .unwrap_or_else(|_| MetadataValue::from_static(""))
    }

    /// Whether a request's `authorization` value carries this token (the
    /// server's check, compared in constant time).
    pub fn admits(&self, header: Option<&MetadataValue<Ascii>>) -> bool {
        self.admits_bytes(header.map(MetadataValue::as_bytes))
    }

    /// [`Token::admits`] for an `authorization` header's raw bytes (an HTTP
    /// request's).
    pub fn admits_bytes(&self, header: Option<&[u8]>) -> bool {
        let Some(presented) = header else {
            return false;
        };
        let presented = presented.strip_prefix(b"Bearer ").unwrap_or(presented);
        constant_time_eq(presented, self.0.as_bytes())
    }
}

/// The client's side: adds the token to every call (nothing without one).
/// Its `Debug` output never shows the token. Clones share the value, so a
/// [`ClientToken`] that re-reads its file changes what every channel made
/// with it sends from the next call on.
#[derive(Clone, Default)]
pub struct AttachToken(Arc<RwLock<Option<MetadataValue<Ascii>>>>);

impl fmt::Debug for AttachToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.value().is_some() {
            "AttachToken(..)"
        } else {
            "AttachToken(None)"
        })
    }
}

/// A token as the `authorization` value, marked sensitive, so HTTP/2 never
/// indexes it in its header tables.
fn sensitive(t: &Token) -> MetadataValue<Ascii> {
    let mut v = t.bearer();
    v.set_sensitive(true);
    v
}

impl AttachToken {
    /// Sends `token` with every call.
    pub fn new(token: Option<&Token>) -> Self {
        Self(Arc::new(RwLock::new(token.map(sensitive))))
    }

    fn value(&self) -> Option<MetadataValue<Ascii>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Interceptor for AttachToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = self.value() {
            request.metadata_mut().insert(AUTHORIZATION, v);
        }
        Ok(request)
    }
}

/// A client's token and the file it came from. When the server refuses it
/// (`UNAUTHENTICATED`: the token was rotated), [`ClientToken::reread`]
/// reads the file again; if it now holds another token, every channel made
/// with [`ClientToken::attach`] sends that one from the next call on, and
/// the refused call is worth making once more. A file of several tokens (a
/// server's current and next) is sent its first.
#[derive(Clone, Debug, Default)]
pub struct ClientToken {
    file: Option<PathBuf>,
    attach: AttachToken,
    /// How many times [`ClientToken::reread`] changed the token: a call
    /// refused with an older one is worth making again even when another
    /// caller did the re-reading.
    changes: Arc<AtomicU64>,
}

impl ClientToken {
    /// `token`, read from `file` if it came from one.
    pub fn new(token: Option<&Token>, file: Option<&Path>) -> Self {
        Self {
            file: file.map(Path::to_owned),
            attach: AttachToken::new(token),
            changes: Arc::default(),
        }
    }

    /// Which token is sent now: pass it to [`ClientToken::refused`] when a
    /// call made now is refused.
    pub fn generation(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// A call made at `generation` was refused `UNAUTHENTICATED`: reads
    /// the file again, and says whether another token is sent now (by this
    /// re-read or a concurrent one), so the call is worth making once more.
    pub fn refused(&self, generation: u64) -> bool {
        self.reread();
        self.generation() != generation
    }

    /// The interceptor for a channel: shares this token's value.
    pub fn attach(&self) -> AttachToken {
        self.attach.clone()
    }

    /// Reads the file again; true when it now holds a token other than the
    /// one sent so far (a retry may pass). A variable's token, an unreadable
    /// file or the same token: false.
    pub fn reread(&self) -> bool {
        let Some(file) = &self.file else {
            return false;
        };
        let Ok(token) = Token::first_in_file(file) else {
            return false;
        };
        let fresh = sensitive(&token);
        let mut current = self
            .attach
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if current.as_ref().map(MetadataValue::as_bytes) == Some(fresh.as_bytes()) {
            return false;
        }
        *current = Some(fresh);
        self.changes.fetch_add(1, Ordering::AcqRel);
        true
    }
}

/// Compares two byte strings without stopping at the first difference, so
/// the time taken reveals at most whether the lengths are equal.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // Keep the optimiser from turning the fold into an early exit.
    std::hint::black_box(diff) == 0
}

/// The token a client (`status`, an agent) presents: `file`'s first if
/// given, else `ACCEL_RDZV_TOKEN`, else `RDZV_TOKEN`, looked up through
/// `env`.
pub fn client_token(
    file: Option<&std::path::Path>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<Token>, TokenError> {
    if let Some(file) = file {
        return Token::first_in_file(file).map(Some);
    }
    match Token::resolve(None, "ACCEL_RDZV_TOKEN", env)? {
        Some(t) => Ok(Some(t)),
        None => Token::resolve(None, "RDZV_TOKEN", env),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "0123456789abcdef0123";

    #[test]
    fn tokens_are_checked_and_hidden() {
        let t = Token::new(&format!(" {T}\n"), "test").expect("valid");
        assert_eq!(format!("{t:?}"), "Token(..)");
        assert!(Token::new("", "x").is_err());
        assert!(Token::new("short", "x").is_err());
        let err = Token::new("has a space in the middle!", "$X")
            .expect_err("space")
            .to_string();
        assert!(err.contains("$X") && err.contains("spaces"), "{err}");
    }

    #[test]
    fn a_client_token_rereads_its_file_and_every_channel_sends_the_new_one() {
        let dir = tempfile::tempdir().expect("dir");
        let f = dir.path().join("token");
        std::fs::write(&f, format!("{T}\n")).expect("write");
        let first = Token::from_file(&f).expect("read");
        let client = ClientToken::new(Some(&first), Some(&f));
        let mut channel = client.attach();
        let sent = |a: &mut AttachToken| {
            a.call(Request::new(()))
                .expect("ok")
                .metadata()
                .get(AUTHORIZATION)
                .map(|v| v.as_bytes().to_vec())
        };
        assert_eq!(sent(&mut channel), Some(format!("Bearer {T}").into_bytes()));
        assert!(!client.reread(), "the same token: nothing to retry");
        // Rotated: the file holds the next token first.
        let next = "next-token-abcdef0123456789";
        std::fs::write(&f, format!("{next}\n{T}\n")).expect("write");
        assert!(client.reread(), "another token: worth a retry");
        assert_eq!(
            sent(&mut channel),
            Some(format!("Bearer {next}").into_bytes())
        );
        // A half-written file changes nothing.
        std::fs::write(&f, "").expect("write");
        assert!(!client.reread());
        assert_eq!(
            sent(&mut channel),
            Some(format!("Bearer {next}").into_bytes())
        );
        // A call refused before another caller re-read is worth another
        // try; one refused with the token sent now is not.
        let before = client.generation();
        std::fs::write(&f, format!("{T}\n")).expect("write");
        assert!(client.reread());
        assert!(client.refused(before), "changed since the call was made");
        assert!(!client.refused(client.generation()), "nothing new to send");
        // A variable's token has no file to read.
        assert!(!ClientToken::new(Some(&first), None).reread());
    }

    #[test]
    fn token_files_are_bounded() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).expect("dir");
        let f = dir.join("token");
        std::fs::write(&f, format!("{T}\n")).expect("write");
        let env = |_: &str| None;
        let t = Token::resolve(Some(&f), "X", &env)
            .expect("ok")
            .expect("some");
        assert!(t.admits(Some(&t.bearer())));
        std::fs::write(&f, vec![b'a'; 5000]).expect("write");
        assert!(matches!(
            Token::from_file(&f),
            Err(TokenError::TooLarge { .. })
        ));
        let env = |k: &str| (k == "X").then(|| T.to_owned());
        assert!(Token::resolve(None, "X", &env).expect("ok").is_some());
        std::fs::remove_dir_all(&dir).ok();
    }
}
