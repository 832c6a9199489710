//! The bounds on text a client sends that both ends must agree on, and
//! the escaping of text that is stored and printed.
//!
//! The server refuses a failure report or a leave reason past these bounds
//! (its `limits` module uses them); the client cuts what it sends to them
//! first, so a long traceback is shortened, not refused. Both ends make
//! text printable the same way.

use std::time::Duration;

/// How long a finished job's tombstone is kept by default: a server's
/// `--tombstone-ttl`, and an agent-run rendezvous's `tombstone_ttl`.
pub const DEFAULT_TOMBSTONE_TTL: Duration = Duration::from_secs(600);

/// Most text a failure report may carry (reason, message, traceback, file).
pub const MAX_FAILURE_BYTES: usize = 64 * 1024;
/// Longest stack one worker may report (`ReportStacks`), in bytes.
pub const MAX_STACK_BYTES: usize = 64 * 1024;
/// Most stack text one node reports at once: its workers share it, so the
/// request stays under the server's request bound (256 KiB).
pub const MAX_STACKS_REPORT_BYTES: usize = 224 * 1024;
/// Longest leave reason, in bytes.
pub const MAX_REASON_BYTES: usize = 4096;

/// The longest prefix of `s` of at most `max` bytes that ends on a character
/// boundary.
pub fn truncated(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `s` with control characters escaped (`\n`, `\u{1b}`), so stored text
/// prints as one line and cannot drive a terminal. Tabs and newlines in a
/// traceback are kept where `keep_newlines` says so. Escaping can make a text
/// six times longer, so the result is cut at [`MAX_FAILURE_BYTES`].
pub fn printable_keeping(s: &str, keep_newlines: bool) -> String {
    if !s.chars().any(|c| c.is_control() || is_bidi(c)) && s.len() <= MAX_FAILURE_BYTES {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len().min(MAX_FAILURE_BYTES) + 8);
    for c in s.chars() {
        if out.len() >= MAX_FAILURE_BYTES {
            out.push('…');
            break;
        }
        match c {
            '\n' | '\t' if keep_newlines => out.push(c),
            c if c.is_control() || is_bidi(c) => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// Unicode's bidirectional formatting characters (embeddings, overrides,
/// isolates, marks): not control characters, but they reorder what a
/// terminal shows (U+202E turns the rest of a line around).
fn is_bidi(c: char) -> bool {
    matches!(c, '\u{061C}' | '\u{200E}' | '\u{200F}' | '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `s` with every control character escaped.
pub fn printable(s: &str) -> String {
    printable_keeping(s, false)
}
