//! TLS for every rendezvous link (rustls through tonic): the server's
//! identity and, optionally, the CA its clients' certificates must chain to
//! (mutual TLS); a client's CA and, optionally, its own identity.
//!
//! Files are read and parsed here, before anything is served or dialled, so
//! a wrong path, a key in the certificate's place or an empty file is one
//! line naming the file and the cause, not a handshake failure later.
//!
//! Both ends' files are here, in the client crate, because both ends read
//! PEM files the same way; the server (`server_config`) and `rdzv-server
//! status` use this module through the server's `tls` re-export.

use std::path::{Path, PathBuf};

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

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

/// The server's TLS settings: its certificate chain and key, and, for
/// mutual TLS, the CA every client certificate must chain to.
pub fn server_config(
    cert: Option<&Path>,
    key: Option<&Path>,
    client_ca: Option<&Path>,
) -> Result<Option<ServerTlsConfig>, TlsError> {
    let Some((cert, key)) = pair(cert, key, ("--tls-cert", "--tls-key"))? else {
        if client_ca.is_some() {
            return Err(TlsError::Incomplete(
                "--tls-client-ca needs --tls-cert and --tls-key".into(),
            ));
        }
        return Ok(None);
    };
    let mut config = ServerTlsConfig::new().identity(identity(cert, key)?);
    if let Some(ca) = client_ca {
        config = config.client_ca_root(Certificate::from_pem(certificates("client CA", ca)?));
    }
    Ok(Some(config))
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
        let e = server_config(Some(&junk), Some(&junk), None)
            .expect_err("junk")
            .to_string();
        assert!(
            e.contains("junk.pem") && e.contains("no certificate"),
            "{e}"
        );
        let missing = dir.join("missing.pem");
        let e = server_config(Some(&missing), Some(&junk), None)
            .expect_err("missing")
            .to_string();
        assert!(
            e.contains("missing.pem") && e.contains("cannot read"),
            "{e}"
        );
        let e = server_config(Some(&junk), None, None)
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
