//! Reading what a person types (flags, environment variables, `key=value`
//! settings) so that no value can crash a binary or flood its output. Shared
//! by `rdzv-server`, `accel-agent` and `accel`, which is why it is a crate of
//! its own rather than a module of any of them: each binary accepts the same
//! duration syntax and quotes bad values the same way.
//!
//! Two rules:
//! - **Durations are bounded** by [`MAX_DURATION`] (ten years). Every
//!   deadline computed from one (`now + timeout`) then fits in the clock.
//!   Unbounded, `--monitor-interval 1e20` did not fit in a `Duration` and
//!   `join_timeout=1e19` overflowed `Instant + Duration`: both aborted the
//!   process (exit 134) instead of printing a usage error.
//! - **Error messages quote at most an excerpt** of the input ([`excerpt`]):
//!   its first [`EXCERPT_CHARS`] characters with control characters escaped,
//!   so a 100 KiB argument or a terminal escape sequence is not echoed back.
//!   [`parse_or_exit`] applies the same rule to clap's own messages, which
//!   quote whole values.
//!
//! [`parse_duration`] is written here rather than taken from `humantime`:
//! torchrun's timeouts are seconds as floats (`0.5`, `1e3`), and people write
//! `1.5m` or `0.5s`, which `humantime` refuses (it has no fractions); the
//! ten-year bound and the excerpting errors are this crate's either way.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::fmt::{self, Write as _};
use std::time::Duration;

use clap::error::ErrorKind;

/// The longest duration any flag or setting accepts: ten years (of 365.25
/// days). Far beyond any real timeout, far below what a clock can add.
pub const MAX_DURATION: Duration = Duration::from_secs(315_576_000);

/// Characters of an input that an error message quotes.
pub const EXCERPT_CHARS: usize = 200;

/// A line of a clap message longer than this is cut (a backstop for values
/// with spaces, whose words are each short).
const MAX_LINE_CHARS: usize = 1000;

/// Why a text is not a duration. Each message quotes an excerpt of the input
/// and says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a number followed by an optional unit.
    #[error("'{0}' is not a duration; use seconds like 30 or 0.5, or 500ms, 2m, 1h")]
    NotANumber(String),
    /// A minus sign.
    #[error("'{0}' is negative; a duration is 0 or more")]
    Negative(String),
    /// A unit other than ms, s, m, min or h.
    #[error("unknown duration unit '{unit}' in '{input}'; use ms, s, m or h")]
    UnknownUnit {
        /// The unit, excerpted.
        unit: String,
        /// The whole input, excerpted.
        input: String,
    },
    /// Longer than [`MAX_DURATION`].
    #[error("'{0}' is too long; at most 10 years ({max} s)", max = MAX_DURATION.as_secs())]
    TooLong(String),
}

/// Parses plain seconds (`30`, `0.5`, `1e3`) or a number with a unit
/// (`500ms`, `30s`, `2m`, `1h`), at most [`MAX_DURATION`].
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let quoted = || excerpt(s).to_string();
    if s.starts_with('-') {
        return Err(DurationError::Negative(quoted()));
    }
    let (num, unit) = s.split_at(number_len(s));
    let value: f64 = num
        .parse()
        .map_err(|_| DurationError::NotANumber(quoted()))?;
    let scale = match unit.trim() {
        "" | "s" => 1.0,
        "ms" => 1e-3,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        other => {
            return Err(DurationError::UnknownUnit {
                unit: excerpt(other).to_string(),
                input: quoted(),
            })
        }
    };
    let secs = value * scale;
    // An exponent like 1e999 parses as infinity.
    if secs.is_nan() || secs > MAX_DURATION.as_secs_f64() {
        return Err(DurationError::TooLong(quoted()));
    }
    Duration::try_from_secs_f64(secs).map_err(|_| DurationError::TooLong(quoted()))
}

/// `d` as [`parse_duration`] reads it, in the largest unit that holds it
/// whole: `1h`, `10m`, `30s`, `250ms` (for messages that quote a setting).
pub fn duration_words(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0 => "0s".to_owned(),
        _ if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 60_000 == 0 => format!("{}m", ms / 60_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// Length of the leading number of `s`: digits and dots, then an exponent
/// (`e`, optional sign, digits) when one follows.
fn number_len(s: &str) -> usize {
    let b = s.as_bytes();
    let mantissa = b
        .iter()
        .take_while(|c| c.is_ascii_digit() || **c == b'.')
        .count();
    if mantissa == 0 || !matches!(b.get(mantissa), Some(b'e' | b'E')) {
        return mantissa;
    }
    let mut j = mantissa + 1;
    if matches!(b.get(j), Some(b'+' | b'-')) {
        j += 1;
    }
    let digits = b
        .get(j..)
        .unwrap_or_default()
        .iter()
        .take_while(|c| c.is_ascii_digit())
        .count();
    if digits == 0 {
        mantissa
    } else {
        j + digits
    }
}

/// A clap value parser for durations ([`parse_duration`]) whose error names
/// the flag and quotes only an excerpt of the value.
#[derive(Debug, Clone, Copy, Default)]
pub struct DurationParser;

impl clap::builder::TypedValueParser for DurationParser {
    type Value = Duration;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<Duration, clap::Error> {
        let name = arg
            .and_then(|a| a.get_long())
            .map_or_else(|| "a duration".to_owned(), |l| format!("--{l}"));
        let result = match value.to_str() {
            Some(text) => parse_duration(text).map_err(|e| e.to_string()),
            None => Err(format!(
                "'{}' is not UTF-8 text",
                excerpt(&value.to_string_lossy())
            )),
        };
        result.map_err(|message| {
            clap::Error::raw(
                ErrorKind::ValueValidation,
                format!("invalid value for {name}: {message}\n"),
            )
            .with_cmd(cmd)
        })
    }
}

/// An excerpt of `input` for an error message; see [`Excerpt`].
pub fn excerpt(input: &str) -> Excerpt<'_> {
    Excerpt(input)
}

/// Displays the first [`EXCERPT_CHARS`] characters of a text, control
/// characters escaped (`\n`, `\u{1b}`), and, when it is longer,
/// `… (N bytes)`.
#[derive(Debug, Clone, Copy)]
pub struct Excerpt<'a>(&'a str);

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (shown, c) in self.0.chars().enumerate() {
            if shown == EXCERPT_CHARS {
                return write!(f, "… ({} bytes)", self.0.len());
            }
            if c.is_control() {
                write!(f, "{}", c.escape_default())?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// `PROG completions SHELL` (bash, zsh, fish, elvish, powershell) prints
/// the shell's completion script for `P`'s flags; `PROG manpage` prints its
/// man page (roff). Checked before parsing, so it works for a program whose
/// first argument is otherwise a script's name. `None`: neither was asked.
pub fn generated<P: clap::CommandFactory>() -> Option<std::process::ExitCode> {
    use std::io::Write as _;
    // Not `args()`: a non-UTF-8 argument is for clap to report, not a panic.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).take(3).collect();
    let args: Vec<&str> = args.iter().map(|a| a.to_str().unwrap_or("")).collect();
    let mut cmd = P::command();
    let name = cmd.get_name().to_owned();
    let mut out = std::io::stdout().lock();
    match args[..] {
        ["completions", shell] => {
            let Ok(shell) = shell.parse::<clap_complete::Shell>() else {
                eprintln!(
                    "{name} completions: unknown shell '{}'; use bash, zsh, fish, elvish or powershell",
                    excerpt(shell)
                );
                return Some(std::process::ExitCode::from(2));
            };
            // Generated whole first: written to a closed pipe
            // (`completions bash | head`), it is not an error.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, name, &mut script);
            let _ = out.write_all(&script);
        }
        ["completions"] => {
            eprintln!("usage: {name} completions bash|zsh|fish|elvish|powershell");
            return Some(std::process::ExitCode::from(2));
        }
        ["manpage"] => {
            match clap_mangen::Man::new(cmd).render(&mut out) {
                // A closed pipe (`manpage | head`) is not an error.
                Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                    eprintln!("{name} manpage: {e}");
                    return Some(std::process::ExitCode::FAILURE);
                }
                _ => {}
            }
        }
        _ => return None,
    }
    let _ = out.flush();
    Some(std::process::ExitCode::SUCCESS)
}

/// torchrun's `--print-completion SHELL`: prints `P`'s completion script
/// for bash, zsh (clap's generators) or tcsh ([`tcsh_completion`]).
pub fn print_completion<P: clap::CommandFactory>(shell: &str) -> std::process::ExitCode {
    use std::io::Write as _;
    let mut cmd = P::command();
    let name = cmd.get_name().to_owned();
    let script = match shell {
        "tcsh" => tcsh_completion(&cmd).into_bytes(),
        other => {
            let Ok(shell) = other.parse::<clap_complete::Shell>() else {
                eprintln!(
                    "{name}: --print-completion: unknown shell '{}'; use bash, zsh or tcsh",
                    excerpt(other)
                );
                return std::process::ExitCode::from(2);
            };
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut cmd, name, &mut script);
            script
        }
    };
    // Written to a closed pipe (`| head`), it is not an error.
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(&script);
    let _ = out.flush();
    std::process::ExitCode::SUCCESS
}

/// A tcsh `complete` command for `cmd`'s flags (clap has no tcsh
/// generator): `--` completes to every long flag (both spellings), a flag
/// with fixed values completes its value to them, anything else to files.
pub fn tcsh_completion(cmd: &clap::Command) -> String {
    let name = cmd.get_name();
    let mut longs: Vec<String> = Vec::new();
    let mut values: Vec<String> = Vec::new();
    for arg in cmd.get_arguments() {
        let mut spellings: Vec<&str> = arg.get_long().into_iter().collect();
        spellings.extend(arg.get_all_aliases().unwrap_or_default());
        // tcsh word lists are split on spaces; every flag is one word.
        spellings.retain(|s| {
            s.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        });
        let choices: Vec<String> = arg
            .get_possible_values()
            .iter()
            .filter(|v| !v.is_hide_set())
            .map(|v| v.get_name().to_owned())
            .filter(|v| {
                v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
            })
            .collect();
        for s in &spellings {
            longs.push((*s).to_owned());
            if arg.get_action().takes_values() && !choices.is_empty() {
                values.push(format!("'n/--{s}/({})/'", choices.join(" ")));
            }
        }
    }
    longs.sort();
    longs.dedup();
    let mut line = format!("complete {name} 'c/--/({})/'", longs.join(" "));
    for v in values {
        line.push(' ');
        line.push_str(&v);
    }
    line.push_str(" 'p/*/f/'\n");
    line
}

/// Parses the process's arguments as `P`; on a usage error, prints clap's
/// message with every long word (a quoted value) excerpted and exits with
/// clap's code (2). `--help` and `--version` behave as usual.
pub fn parse_or_exit<P: clap::Parser>() -> P {
    parse_with_matches_or_exit().0
}

/// [`parse_or_exit`], with clap's matches too: they say which values the
/// user gave and which are defaults ([`clap::ArgMatches::value_source`]).
pub fn parse_with_matches_or_exit<P: clap::Parser>() -> (P, clap::ArgMatches) {
    let parsed = P::command()
        .try_get_matches()
        .and_then(|m| P::from_arg_matches(&m).map(|p| (p, m)));
    match parsed {
        Ok(p) => p,
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            let plain = e.render().to_string();
            let clipped = clip_message(&plain);
            if clipped == plain {
                // Nothing to cut: clap prints it, in colour on a terminal.
                e.exit()
            }
            eprint!("{clipped}");
            std::process::exit(e.exit_code())
        }
    }
}

/// `text` with each word longer than [`EXCERPT_CHARS`] (and a little slack)
/// excerpted, then each line longer than 1,000 characters cut.
pub fn clip_message(text: &str) -> String {
    let mut out = String::with_capacity(text.len().min(64 * 1024));
    for line in text.split_inclusive('\n') {
        let (body, end) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let mut clipped = String::new();
        for (i, word) in body.split(' ').enumerate() {
            if i > 0 {
                clipped.push(' ');
            }
            // The slack keeps an excerpt already made (quotes, `…`) whole.
            if word.chars().nth(EXCERPT_CHARS + 8).is_some() {
                let _ = write!(clipped, "{}", excerpt(word));
            } else {
                clipped.push_str(word);
            }
        }
        if let Some((cut, _)) = clipped.char_indices().nth(MAX_LINE_CHARS) {
            let total = clipped.len();
            clipped.truncate(cut);
            let _ = write!(clipped, "… ({total} bytes)");
        }
        out.push_str(&clipped);
        out.push_str(end);
    }
    out
}

#[cfg(test)]
mod tests;
