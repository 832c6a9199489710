//! TLS for every rendezvous link (rustls through tonic): the server's
//! identity and, optionally, the CA its clients' certificates must chain to
//! (mutual TLS); a client's CA and, optionally, its own identity.
//!
//! Files are read and parsed here, before anything is served or dialled, so
//! a wrong path, a key in the certificate's place or an empty file is one
//! line naming the file and the cause, not a handshake failure later.
//!
//! Both ends' files are here, in the client crate, because both ends read
//! PEM files the same way; the server ([`ServerTls`]) and `rdzv-server
//! status` use this module through the server's `tls` re-export.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::stamp::{lock_unless_busy, Stamp};

/// A PEM file larger than this is not a certificate chain or a key.
const MAX_PEM_BYTES: u64 = 1 << 20;

/// A TLS file that cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// The file cannot be read.
    #[error("TLS: cannot read {what} {path}: {source}")]
    Read {
        /// Which file (certificate, key, CA).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file holds no usable PEM object of the expected kind.
    #[error("TLS: {what} {path} {problem}")]
    Content {
        /// Which file.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
    },
    /// A certificate without its key, or the other way round.
    #[error("TLS: {0}")]
    Incomplete(String),
}

fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let err = |source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let len = std::fs::metadata(path).map_err(err)?.len();
    if len > MAX_PEM_BYTES {
        return Err(TlsError::Content {
            what,
            path: path.to_owned(),
            problem: format!("has {len} bytes; PEM files are at most 1 MiB"),
        });
    }
    std::fs::read(path).map_err(err)
}

/// Certificates in PEM file `path` (a chain, or a CA bundle).
fn certificates(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read(what, path)?;
    let content = |problem: String| TlsError::Content {
        what,
        path: path.to_owned(),
        problem,
    };
    let mut n = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| content(format!("is not valid PEM: {e}")))?;
        n += 1;
    }
    if n == 0 {
        return Err(content(
            "holds no certificate (expected -----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(pem)
}

/// The private key in PEM file `path`.
fn private_key(path: &Path) -> Result<Vec<u8>, TlsError> {
    let pem = read("key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Content {
        what: "key",
        path: path.to_owned(),
        problem: format!("holds no private key (PKCS#8, PKCS#1 or SEC1 PEM): {e}"),
    })?;
    Ok(pem)
}

fn identity(cert: &Path, key: &Path) -> Result<Identity, TlsError> {
    Ok(Identity::from_pem(
        certificates("certificate", cert)?,
        private_key(key)?,
    ))
}

fn pair<'a>(
    cert: Option<&'a Path>,
    key: Option<&'a Path>,
    names: (&str, &str),
) -> Result<Option<(&'a Path, &'a Path)>, TlsError> {
    match (cert, key) {
        (Some(c), Some(k)) => Ok(Some((c, k))),
        (None, None) => Ok(None),
        (Some(_), None) => Err(TlsError::Incomplete(format!(
            "{} needs {} (the certificate's private key)",
            names.0, names.1
        ))),
        (None, Some(_)) => Err(TlsError::Incomplete(format!(
            "{} needs {} (the key's certificate)",
            names.1, names.0
        ))),
    }
}

/// How often a server's TLS files are looked at, at most.
pub const RECHECK: Duration = Duration::from_secs(1);

/// A server's TLS: its certificate chain and key and, for mutual TLS, the
/// CA every client certificate must chain to; re-read when the files
/// change, so a renewed certificate (cert-manager, a Secret's update, a
/// `mv` into place) is served from the next connection on, without a
/// restart and without touching the connections already made.
///
/// The files are looked at (size, modification time, inode) at most once a
/// [`RECHECK`], by the handshake of a connection (one at a time: the others
/// take the configuration there is); when any changed, all are read again
/// and checked as at start. Files that do not make a configuration
/// (a certificate written before its key) keep the last good one, with a
/// warning, and are tried again at their next change.
#[derive(Clone)]
pub struct ServerTls(Arc<ServerTlsInner>);

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.0.files.cert)
            .field("client_ca", &self.0.files.client_ca)
            .finish_non_exhaustive()
    }
}

struct ServerTlsInner {
    files: TlsFiles,
    /// The configuration new connections get.
    config: RwLock<Arc<rustls::ServerConfig>>,
    /// When the files were last looked at, and how they looked: taken by
    /// the one caller that looks again (`try_lock`: a file system that
    /// hangs holds that handshake, never the others).
    check: Mutex<ServerTlsState>,
}

/// A server's TLS files.
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    client_ca: Option<PathBuf>,
}

struct ServerTlsState {
    stamps: Vec<Option<Stamp>>,
    checked: Instant,
}

impl ServerTls {
    /// The server's TLS from its files (`None`: plain HTTP/2), read and
    /// checked now: an error here is a start-up error naming the file.
    pub fn from_files(
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Result<Option<Self>, TlsError> {
        let Some((cert, key)) = pair(cert, key, ("--tls-cert", "--tls-key"))? else {
            if client_ca.is_some() {
                return Err(TlsError::Incomplete(
                    "--tls-client-ca needs --tls-cert and --tls-key".into(),
                ));
            }
            return Ok(None);
        };
        let files = TlsFiles {
            cert: cert.to_owned(),
            key: key.to_owned(),
            client_ca: client_ca.map(Path::to_owned),
        };
        let stamps = files.stamps();
        let config = Arc::new(files.build()?);
        let inner = ServerTlsInner {
            files,
            config: RwLock::new(config),
            check: Mutex::new(ServerTlsState {
                stamps,
                checked: Instant::now(),
            }),
        };
        Ok(Some(Self(Arc::new(inner))))
    }

    /// The configuration to accept a connection with now (the files looked
    /// at first, at most once a [`RECHECK`]).
    pub fn current(&self) -> Arc<rustls::ServerConfig> {
        self.current_at(Instant::now())
    }

    fn current_at(&self, now: Instant) -> Arc<rustls::ServerConfig> {
        self.look_again(now);
        self.0
            .config
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Looks at the files again if it is due (and nobody else is looking),
    /// taking a new configuration if they changed and make one.
    fn look_again(&self, now: Instant) {
        let files = &self.0.files;
        let Some(mut state) = lock_unless_busy(&self.0.check) else {
            return;
        };
        if now.saturating_duration_since(state.checked) < RECHECK {
            return;
        }
        state.checked = now;
        let stamps = files.stamps();
        if stamps == state.stamps || !stamps.iter().all(Option::is_some) {
            return;
        }
        state.stamps = stamps;
        match files.build() {
            Ok(config) => {
                tracing::info!(cert = %files.cert.display(), "the TLS files changed: new connections get the new certificate");
                *self
                    .0
                    .config
                    .write()
                    .unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
            }
            Err(e) => {
                tracing::warn!(error = %e, "the TLS files changed but do not make a configuration; still serving the last good one");
            }
        }
    }
}

impl TlsFiles {
    fn stamps(&self) -> Vec<Option<Stamp>> {
        [Some(&self.cert), Some(&self.key), self.client_ca.as_ref()]
            .into_iter()
            .flatten()
            .map(|p| Stamp::of(p).ok())
            .collect()
    }

    /// Reads and checks every file; a configuration that speaks HTTP/2.
    fn build(&self) -> Result<rustls::ServerConfig, TlsError> {
        let content = |what, path: &Path, problem: String| TlsError::Content {
            what,
            path: path.to_owned(),
            problem,
        };
        let chain = CertificateDer::pem_slice_iter(&certificates("certificate", &self.cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| content("certificate", &self.cert, format!("is not valid PEM: {e}")))?;
        let key = PrivateKeyDer::from_pem_slice(&private_key(&self.key)?)
            .map_err(|e| content("key", &self.key, format!("holds no private key: {e}")))?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Incomplete(e.to_string()))?;
        let builder = match &self.client_ca {
            None => builder.with_no_client_auth(),
            Some(ca) => {
                let mut roots = rustls::RootCertStore::empty();
                for c in CertificateDer::pem_slice_iter(&certificates("client CA", ca)?) {
                    let c =
                        c.map_err(|e| content("client CA", ca, format!("is not valid PEM: {e}")))?;
                    roots.add(c).map_err(|e| {
                        content(
                            "client CA",
                            ca,
                            format!("holds a certificate that is not a CA: {e}"),
                        )
                    })?;
                }
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots),
                    provider(),
                )
                .build()
                .map_err(|e| content("client CA", ca, e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            content(
                "certificate",
                &self.cert,
                format!(
                    "and key {} do not make a TLS identity: {e}",
                    self.key.display()
                ),
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(config)
    }
}

/// The cryptography every TLS configuration here uses (ring, as tonic's).
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A client's TLS settings: the CA the server's certificate must chain to
/// and, for mutual TLS, the client's own certificate and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTlsFiles {
    /// CA bundle (PEM) that signs the server's certificate.
    pub ca: Option<PathBuf>,
    /// This client's certificate chain (PEM), for mutual TLS.
    pub cert: Option<PathBuf>,
    /// This client's private key (PEM).
    pub key: Option<PathBuf>,
}

impl ClientTlsFiles {
    /// Whether the link uses TLS at all.
    pub fn enabled(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }

    /// Files from `ACCEL_RDZV_TLS_CA`, `_CERT` and `_KEY`, for each one not
    /// already given.
    pub fn or_env(mut self, env: &dyn Fn(&str) -> Option<String>) -> Self {
        let get = |k: &str| env(k).filter(|v| !v.is_empty()).map(PathBuf::from);
        self.ca = self.ca.or_else(|| get("ACCEL_RDZV_TLS_CA"));
        self.cert = self.cert.or_else(|| get("ACCEL_RDZV_TLS_CERT"));
        self.key = self.key.or_else(|| get("ACCEL_RDZV_TLS_KEY"));
        self
    }

    /// The tonic configuration for a server named `host`; `None` without TLS.
    pub fn config(&self, host: &str) -> Result<Option<ClientTlsConfig>, TlsError> {
        if !self.enabled() {
            return Ok(None);
        }
        let Some(ca) = &self.ca else {
            return Err(TlsError::Incomplete(
                "tls_cert or tls_key is set but tls_ca is not; give the CA that signed the server's certificate".into(),
            ));
        };
        let mut config = ClientTlsConfig::new()
            .domain_name(host.trim_start_matches('[').trim_end_matches(']'))
            .ca_certificate(Certificate::from_pem(certificates("CA", ca)?));
        if let Some((cert, key)) = pair(
            self.cert.as_deref(),
            self.key.as_deref(),
            ("tls_cert", "tls_key"),
        )? {
            config = config.identity(identity(cert, key)?);
        }
        Ok(Some(config))
    }

    /// Checks every file now (a misconfigured agent fails at start, naming
    /// the file), for a server named `host`.
    pub fn check(&self, host: &str) -> Result<(), TlsError> {
        self.config(host).map(drop)
    }
}

/// `scheme://host:port` for a rendezvous endpoint, bracketing IPv6 literals.
pub fn endpoint_uri(host: &str, port: u16, tls: bool) -> String {
    let scheme = if tls { "https" } else { "http" };
    if host.contains(':') && !host.starts_with('[') {
        format!("{scheme}://[{host}]:{port}")
    } else {
        format!("{scheme}://{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_files_name_the_file_and_the_cause() {
        let scratch = tempfile::tempdir().expect("scratch dir");
        let dir = scratch.path().to_path_buf();
        std::fs::create_dir_all(&dir).expect("dir");
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").expect("write");
        let e = ServerTls::from_files(Some(&junk), Some(&junk), None)
            .expect_err("junk")
            .to_string();
        assert!(
            e.contains("junk.pem") && e.contains("no certificate"),
            "{e}"
        );
        let missing = dir.join("missing.pem");
        let e = ServerTls::from_files(Some(&missing), Some(&junk), None)
            .expect_err("missing")
            .to_string();
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );
        let e = ServerTls::from_files(Some(&junk), None, None)
            .expect_err("half")
            .to_string();
        assert!(e.contains("--tls-key"), "{e}");
        let files = ClientTlsFiles {
            cert: Some(junk.clone()),
            ..Default::default()
        };
        assert!(files
            .check("h")
            .expect_err("no ca")
            .to_string()
            .contains("tls_ca"));
        assert_eq!(endpoint_uri("::1", 5, true), "https://[::1]:5");
        assert_eq!(endpoint_uri("h", 5, false), "http://h:5");
        std::fs::remove_dir_all(&dir).ok();
    }
}
