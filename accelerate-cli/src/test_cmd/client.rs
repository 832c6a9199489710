//! A small blocking client for PyTorch's TCPStore protocol.
//!
//! `accel test-worker` must reach the launch's store exactly as a PyTorch
//! worker would (`torch.distributed.TCPStore(MASTER_ADDR, MASTER_PORT)`),
//! so it speaks the wire format itself rather than calling accel's server
//! code: a mistake on either side then shows up as a failed check. A
//! request is a command byte and fields; integers are little-endian, keys
//! and values a `u64` length and the bytes. Only the commands the check
//! needs are here. Every call has a time limit, so a missing peer becomes
//! an error instead of a hang.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::thread;
use std::time::{Duration, Instant};

/// The magic number a connection starts with (PyTorch's `validationMagicNumber`).
pub const MAGIC: u32 = 0x3C85_F7CE;

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const CHECK: u8 = 5;
const WAIT: u8 = 6;
const PING: u8 = 13;

/// Why a store request failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The host name does not resolve.
    #[error("cannot resolve the store address {addr}: {source}")]
    Resolve {
        /// `host:port`.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Nothing accepted the connection in time.
    #[error("cannot connect to the store at {addr} within {limit:?}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// How long it tried.
        limit: Duration,
        /// The last attempt's error.
        #[source]
        source: std::io::Error,
    },
    /// No answer in time.
    #[error("the store at {addr} did not answer {what} within {limit:?}")]
    TimedOut {
        /// `host:port`.
        addr: String,
        /// The request.
        what: String,
        /// The limit.
        limit: Duration,
    },
    /// The connection broke.
    #[error("lost the connection to the store at {addr} during {what}: {source}")]
    Io {
        /// `host:port`.
        addr: String,
        /// The request.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The peer answered something a TCPStore would not.
    #[error("the server at {addr} does not speak PyTorch's TCPStore protocol: {detail}")]
    Protocol {
        /// `host:port`.
        addr: String,
        /// What was wrong.
        detail: String,
    },
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u64).to_le_bytes());
    out.extend_from_slice(b);
}

fn keys_request(code: u8, keys: &[&[u8]]) -> Vec<u8> {
    let mut o = vec![code];
    o.extend_from_slice(&(keys.len() as u64).to_le_bytes());
    for k in keys {
        put_bytes(&mut o, k);
    }
    o
}

/// The bytes of each request.
pub mod encode {
    use super::*;

    /// `VALIDATE magic` (no reply).
    pub fn validate() -> Vec<u8> {
        let mut o = vec![VALIDATE];
        o.extend_from_slice(&MAGIC.to_le_bytes());
        o
    }
    /// `PING nonce` (reply: the nonce).
    pub fn ping(nonce: u32) -> Vec<u8> {
        let mut o = vec![PING];
        o.extend_from_slice(&nonce.to_le_bytes());
        o
    }
    /// `SET key value` (no reply).
    pub fn set(key: &[u8], value: &[u8]) -> Vec<u8> {
        let mut o = vec![SET];
        put_bytes(&mut o, key);
        put_bytes(&mut o, value);
        o
    }
    /// `GET key` (reply: length and bytes).
    pub fn get(key: &[u8]) -> Vec<u8> {
        let mut o = vec![GET];
        put_bytes(&mut o, key);
        o
    }
    /// `ADD key delta` (reply: the new value).
    pub fn add(key: &[u8], delta: i64) -> Vec<u8> {
        let mut o = vec![ADD];
        put_bytes(&mut o, key);
        o.extend_from_slice(&delta.to_le_bytes());
        o
    }
    /// `CHECK keys` (reply: 0 when all exist).
    pub fn check(keys: &[&[u8]]) -> Vec<u8> {
        keys_request(CHECK, keys)
    }
    /// `WAIT keys` (reply: 0 once all exist).
    pub fn wait(keys: &[&[u8]]) -> Vec<u8> {
        keys_request(WAIT, keys)
    }
}

/// One connection to a store.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    addr: String,
    limit: Duration,
}

impl Client {
    /// Connects to `host:port` (retrying until `limit`, as PyTorch's client
    /// does while the server starts), validates and pings.
    pub fn connect(host: &str, port: u16, limit: Duration) -> Result<Self, ClientError> {
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let addr = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let targets: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|source| ClientError::Resolve {
                addr: addr.clone(),
                source,
            })?
            .collect();
        let deadline = Instant::now() + limit;
        let mut pause = Duration::from_millis(50);
        let stream = 'connect: loop {
            let mut last = std::io::Error::new(ErrorKind::NotFound, "no address");
            for t in &targets {
                let left = deadline.saturating_duration_since(Instant::now());
                match TcpStream::connect_timeout(t, left.max(Duration::from_millis(1))) {
                    Ok(s) => break 'connect s,
                    Err(e) => last = e,
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Connect {
                    addr,
                    limit,
                    source: last,
                });
            }
            thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_secs(1));
        };
        let _ = stream.set_nodelay(true);
        let mut client = Self {
            stream,
            addr,
            limit,
        };
        client.send("VALIDATE", &encode::validate())?;
        let nonce = std::process::id();
        client.send("PING", &encode::ping(nonce))?;
        let answer = client.read_u32("PING")?;
        if answer != nonce {
            return Err(client.protocol(format!("PING {nonce} answered {answer}")));
        }
        Ok(client)
    }

    /// `host:port` as given.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Sets `key`.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ClientError> {
        self.send(
            &format!("SET {key}"),
            &encode::set(key.as_bytes(), value.as_bytes()),
        )
    }

    /// Reads `key` (which must exist: WAIT first, as PyTorch does).
    pub fn get(&mut self, key: &str) -> Result<Vec<u8>, ClientError> {
        let what = format!("GET {key}");
        self.send(&what, &encode::get(key.as_bytes()))?;
        let len = self.read_u64(&what)?;
        if len > 8 * 1024 * 1024 {
            return Err(self.protocol(format!("{what} announced {len} bytes")));
        }
        let mut buf = vec![0; len as usize];
        self.read(&what, &mut buf)?;
        Ok(buf)
    }

    /// Adds `delta` to the counter at `key`; returns the new value.
    pub fn add(&mut self, key: &str, delta: i64) -> Result<i64, ClientError> {
        let what = format!("ADD {key}");
        self.send(&what, &encode::add(key.as_bytes(), delta))?;
        Ok(self.read_u64(&what)? as i64)
    }

    /// Whether every key exists.
    pub fn check(&mut self, keys: &[String]) -> Result<bool, ClientError> {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        self.send("CHECK", &encode::check(&refs))?;
        match self.read_u8("CHECK")? {
            0 => Ok(true),
            1 => Ok(false),
            other => Err(self.protocol(format!("CHECK answered {other}"))),
        }
    }

    /// Blocks until every key exists (or the time limit passes).
    pub fn wait(&mut self, keys: &[String]) -> Result<(), ClientError> {
        let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_bytes()).collect();
        let what = match keys {
            [one] => format!("WAIT {one}"),
            _ => format!("WAIT for {} keys", keys.len()),
        };
        self.send(&what, &encode::wait(&refs))?;
        match self.read_u8(&what)? {
            0 => Ok(()),
            other => Err(self.protocol(format!("{what} answered {other}"))),
        }
    }

    fn protocol(&self, detail: String) -> ClientError {
        ClientError::Protocol {
            addr: self.addr.clone(),
            detail,
        }
    }

    fn io(&self, what: &str, e: std::io::Error) -> ClientError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => ClientError::TimedOut {
                addr: self.addr.clone(),
                what: what.to_owned(),
                limit: self.limit,
            },
            _ => ClientError::Io {
                addr: self.addr.clone(),
                what: what.to_owned(),
                source: e,
            },
        }
    }

    fn send(&mut self, what: &str, bytes: &[u8]) -> Result<(), ClientError> {
        let _ = self.stream.set_write_timeout(Some(self.limit));
        self.stream.write_all(bytes).map_err(|e| self.io(what, e))
    }

    fn read(&mut self, what: &str, buf: &mut [u8]) -> Result<(), ClientError> {
        let _ = self.stream.set_read_timeout(Some(self.limit));
        self.stream.read_exact(buf).map_err(|e| self.io(what, e))
    }

    fn read_u8(&mut self, what: &str) -> Result<u8, ClientError> {
        let mut b = [0; 1];
        self.read(what, &mut b)?;
        Ok(b[0])
    }

    fn read_u32(&mut self, what: &str) -> Result<u32, ClientError> {
        let mut b = [0; 4];
        self.read(what, &mut b)?;
        Ok(u32::from_le_bytes(b))
    }

    fn read_u64(&mut self, what: &str) -> Result<u64, ClientError> {
        let mut b = [0; 8];
        self.read(what, &mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

#[cfg(test)]
pub(crate) mod tests;
