//! Ids as key segments: a job or node id is percent-escaped (`%`, `/` and
//! control characters) wherever it becomes one segment of a path, so that
//! no id can name another's key (the etcd store's keys, the agents' own
//! rendezvous prefix).

use std::fmt::Write as _;

/// Escapes an id for use as one key segment.
pub fn escape(id: &str) -> String {
    let mut out = String::with_capacity(id.len());
    for c in id.chars() {
        if c == '%' || c == '/' || c.is_control() {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Reverses [`escape`]; `None` for a segment no id escapes to.
pub fn unescape(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_and_keeps_slashes_out() {
        for id in ["job", "a/b", "50%", "tab\there", "ünï"] {
            let e = escape(id);
            assert!(!e.contains('/'), "{e}");
            assert_eq!(unescape(&e).as_deref(), Some(id));
        }
        assert_eq!(unescape("%zz"), None);
    }
}
