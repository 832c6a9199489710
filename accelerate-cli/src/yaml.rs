//! accelerate's YAML dialect: what PyYAML's `safe_load` reads and what
//! `safe_dump` writes, for configuration files.
//!
//! accelerate reads its files with PyYAML, which implements YAML 1.1: plain
//! `NO`, `off` and `yes` are booleans, `1e8` is a string (a float needs a dot),
//! `0755` is octal and `12:30` is a base-60 integer. YAML 1.2 readers disagree
//! on all of these, so this module resolves plain scalars itself, from the
//! parser's events (which keep each scalar's quoting style: quoted `'NO'` is a
//! string). The writer produces what `yaml.safe_dump(d)` produces for the
//! values a configuration holds: sorted keys, block style, indentless lists,
//! single quotes exactly where PyYAML would need them to read the string back.
//!
//! The reader refuses what accelerate's files never contain and what would
//! let a small file exhaust memory or the stack: anchors and aliases (nine
//! lines of nested aliases expand to billions of values; one such file grew
//! `accel launch` by 1.2 GB/s) and collections nested more than
//! [`MAX_DEPTH`] deep. The caller bounds the text's size.

use accel_input::excerpt;
use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A YAML text that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

/// Deepest nesting of collections accepted (accelerate's files nest two).
pub const MAX_DEPTH: usize = 32;

/// Reads the first document of `text` as PyYAML's `safe_load` does. An empty
/// text is `null`.
pub fn load(text: &str) -> Result<Value, YamlError> {
    refuse_special_characters(text)?;
    let mut parser = Parser::new_from_str(text);
    let mut builder = Builder::default();
    loop {
        let (event, mark) = parser.next_token().map_err(|e| YamlError(e.to_string()))?;
        match event {
            Event::StreamEnd | Event::DocumentEnd => break,
            other => builder.push(other, mark)?,
        }
    }
    Ok(builder.root.unwrap_or(Value::Null))
}

/// PyYAML's reader refuses control and other non-printable characters; so
/// must we, and before parsing: yaml-rust2 takes a NUL for the end of the
/// text and would silently drop the rest of the file.
fn refuse_special_characters(text: &str) -> Result<(), YamlError> {
    match text.char_indices().find(|(_, c)| !printable(*c)) {
        None => Ok(()),
        Some((at, c)) => Err(YamlError(format!(
            "line {}: unacceptable character #x{:04x}: special characters are not allowed (as in PyYAML); remove it",
            text[..at].matches('\n').count() + 1,
            u32::from(c)
        ))),
    }
}

/// The characters PyYAML's reader accepts in a text.
fn printable(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r' | ' '..='~' | '\u{85}' | '\u{a0}'..='\u{d7ff}' | '\u{e000}'..='\u{fffd}')
        || c >= '\u{10000}'
}

/// Builds values from parser events.
#[derive(Default)]
struct Builder {
    /// Open collections, each with the key awaiting its value (mappings).
    stack: Vec<(Value, Option<String>)>,
    root: Option<Value>,
}

impl Builder {
    fn push(&mut self, event: Event, mark: Marker) -> Result<(), YamlError> {
        let anchored = match &event {
            Event::Scalar(_, _, anchor, _)
            | Event::SequenceStart(anchor, _)
            | Event::MappingStart(anchor, _) => *anchor != 0,
            Event::Alias(_) => true,
            _ => false,
        };
        if anchored {
            return Err(YamlError(format!(
                "line {}: YAML anchors (&name) and aliases (*name) are not accepted in a \
                 configuration file (accelerate never writes them, and a few lines of them \
                 can expand to gigabytes); write each value out in full",
                mark.line()
            )));
        }
        match event {
            Event::Scalar(text, style, _, tag) => {
                let tag = tag.map(|t| t.suffix);
                let v = scalar(&text, style, tag.as_deref())
                    .map_err(|m| YamlError(format!("line {}: {m}", mark.line())))?;
                self.value(v, mark)
            }
            Event::SequenceStart(..) | Event::MappingStart(..) => {
                if self.stack.len() >= MAX_DEPTH {
                    return Err(YamlError(format!(
                        "line {}: collections nested more than {MAX_DEPTH} deep; \
                         an accelerate configuration nests two or three",
                        mark.line()
                    )));
                }
                let empty = match event {
                    Event::SequenceStart(..) => Value::Array(Vec::new()),
                    _ => Value::Object(Map::new()),
                };
                self.stack.push((empty, None));
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some((v, _)) => self.value(v, mark),
                None => Err(YamlError("unbalanced document".into())),
            },
            _ => Ok(()),
        }
    }

    fn value(&mut self, v: Value, mark: Marker) -> Result<(), YamlError> {
        let Some((parent, key)) = self.stack.last_mut() else {
            self.root = Some(v);
            return Ok(());
        };
        match parent {
            Value::Array(items) => items.push(v),
            Value::Object(map) => match key.take() {
                None => {
                    *key = Some(match v {
                        Value::String(s) => s,
                        Value::Null => "null".into(),
                        Value::Bool(b) => if b { "True" } else { "False" }.into(),
                        Value::Number(n) => n.to_string(),
                        _ => {
                            return Err(YamlError(format!(
                                "line {}: a mapping key must be a scalar",
                                mark.line()
                            )))
                        }
                    })
                }
                Some(k) => {
                    map.insert(k, v);
                }
            },
            // Only collections are pushed on the stack.
            _ => {}
        }
        Ok(())
    }
}

/// One scalar as PyYAML resolves it: quoted and block scalars are strings,
/// plain ones go through YAML 1.1's implicit types.
fn scalar(text: &str, style: TScalarStyle, tag: Option<&str>) -> Result<Value, String> {
    match tag {
        Some("str") => return Ok(Value::String(text.into())),
        Some("bool") => {
            return bool11(text)
                .map(Value::Bool)
                .ok_or_else(|| format!("'{}' is not a boolean", excerpt(text)))
        }
        Some("int") => {
            return int11(text).ok_or_else(|| format!("'{}' is not an integer", excerpt(text)))
        }
        Some("float") => {
            return float11(text)
                .or_else(|| int11(text).and_then(|v| v.as_f64()).map(float_value))
                .ok_or_else(|| format!("'{}' is not a number", excerpt(text)))
        }
        Some("null") => return Ok(Value::Null),
        _ => {}
    }
    if style != TScalarStyle::Plain {
        return Ok(Value::String(text.into()));
    }
    Ok(resolve_plain(text))
}

/// YAML 1.1 implicit resolution of a plain scalar.
pub fn resolve_plain(text: &str) -> Value {
    if matches!(text, "" | "~" | "null" | "Null" | "NULL") {
        return Value::Null;
    }
    if let Some(b) = bool11(text) {
        return Value::Bool(b);
    }
    if let Some(v) = int11(text) {
        return v;
    }
    if let Some(v) = float11(text) {
        return v;
    }
    Value::String(text.into())
}

fn bool11(t: &str) -> Option<bool> {
    match t {
        "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => Some(true),
        "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => Some(false),
        _ => None,
    }
}

fn split_sign(t: &str) -> (bool, &str) {
    match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    }
}

/// PyYAML's int forms: decimal, `0b`, `0x`, leading-zero octal, base 60;
/// underscores anywhere after the first digit.
fn int11(t: &str) -> Option<Value> {
    let (neg, body) = split_sign(t);
    let digits = |s: &str, radix: u32| -> Option<i128> {
        let clean: String = s.chars().filter(|c| *c != '_').collect();
        if clean.is_empty() {
            return None;
        }
        i128::from_str_radix(&clean, radix).ok()
    };
    let magnitude = if let Some(b) = body.strip_prefix("0b") {
        digits(b, 2)?
    } else if let Some(x) = body.strip_prefix("0x") {
        digits(x, 16)?
    } else if body.contains(':') {
        let mut parts = body.split(':');
        let first = parts.next()?;
        if !first.starts_with(|c: char| ('1'..='9').contains(&c)) {
            return None;
        }
        let mut v = digits(first, 10)?;
        for p in parts {
            if p.is_empty() || p.len() > 2 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: i128 = p.parse().ok()?;
            if n > 59 {
                return None;
            }
            // Beyond i128, like a decimal beyond i128: not an int.
            v = v.checked_mul(60)?.checked_add(n)?;
        }
        v
    } else if body == "0" {
        0
    } else if body.starts_with('0') {
        if !body
            .bytes()
            .all(|b| (b'0'..=b'7').contains(&b) || b == b'_')
        {
            return None;
        }
        digits(body, 8)?
    } else {
        if !body.starts_with(|c: char| c.is_ascii_digit())
            || !body.bytes().all(|b| b.is_ascii_digit() || b == b'_')
        {
            return None;
        }
        digits(body, 10)?
    };
    let v = if neg { -magnitude } else { magnitude };
    Some(match i64::try_from(v) {
        Ok(i) => Value::Number(i.into()),
        Err(_) => float_value(v as f64),
    })
}

/// PyYAML's float forms: a dot is required; an exponent needs a sign.
fn float11(t: &str) -> Option<Value> {
    let (neg, body) = split_sign(t);
    match body {
        ".inf" | ".Inf" | ".INF" => {
            return Some(Value::String(if neg { "-.inf" } else { ".inf" }.into()))
        }
        ".nan" | ".NaN" | ".NAN" if t == body => return Some(Value::String(".nan".into())),
        _ => {}
    }
    let (mantissa, exponent) = match body.find(['e', 'E']) {
        Some(i) => (&body[..i], Some(&body[i + 1..])),
        None => (body, None),
    };
    let (int_part, frac) = mantissa.split_once('.')?;
    let digits_ok = |s: &str| s.bytes().all(|b| b.is_ascii_digit() || b == b'_');
    let int_ok = if int_part.is_empty() {
        frac.starts_with(|c: char| c.is_ascii_digit())
    } else {
        int_part.starts_with(|c: char| c.is_ascii_digit()) && digits_ok(int_part)
    };
    if !int_ok || !digits_ok(frac) {
        return None;
    }
    if let Some(e) = exponent {
        // The sign is one ASCII byte; anything else (a multi-byte
        // character included: fuzzing found `1.0eս`) is not a float.
        let rest = e.strip_prefix(['+', '-'])?;
        if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse::<f64>().ok().map(float_value)
}

fn float_value(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

mod dump;
pub use dump::{dump, float_repr};

#[cfg(test)]
mod tests;
