//! The writer: what PyYAML's `safe_dump` prints for configuration values.

use serde_json::{Map, Value};

use super::{printable, resolve_plain};

/// Writes `value` as `yaml.safe_dump(value)` does (sorted keys, block style).
pub fn dump(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(map) if !map.is_empty() => mapping(&mut out, map, 0),
        Value::Array(items) if !items.is_empty() => sequence(&mut out, items, 0),
        other => {
            out.push_str(&inline(other));
            out.push('\n');
            if !matches!(other, Value::Object(_) | Value::Array(_)) {
                out.push_str("...\n");
            }
        }
    }
    out
}

fn mapping(out: &mut String, map: &Map<String, Value>, indent: usize) {
    let mut keys: Vec<&String> = map.keys().collect();
    keys.sort();
    for k in keys {
        let v = &map[k];
        out.push_str(&" ".repeat(indent));
        out.push_str(&string(k));
        out.push(':');
        match v {
            Value::Object(m) if !m.is_empty() => {
                out.push('\n');
                mapping(out, m, indent + 2);
            }
            Value::Array(items) if !items.is_empty() => {
                out.push('\n');
                sequence(out, items, indent);
            }
            other => {
                out.push(' ');
                let column = indent + string(k).chars().count() + 2;
                out.push_str(&wrap(&inline(other), column, indent + 2));
                out.push('\n');
            }
        }
    }
}

/// PyYAML's line folding: a single space inside a scalar becomes a line
/// break (continued at `indent`) once the line is past 80 columns.
fn wrap(text: &str, start_column: usize, indent: usize) -> String {
    if text.starts_with('"') {
        return text.to_owned();
    }
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut column = start_column;
    for (i, &c) in chars.iter().enumerate() {
        let quoted_edge = i == 1 && chars[0] == '\'';
        let single_space = c == ' '
            && i > 0
            && !quoted_edge
            && chars[i - 1] != ' '
            && chars.get(i + 1).is_some_and(|n| *n != ' ' && *n != '\'');
        if single_space && column > 80 {
            out.push('\n');
            out.push_str(&" ".repeat(indent));
            column = indent;
        } else {
            out.push(c);
            column += 1;
        }
    }
    out
}

fn sequence(out: &mut String, items: &[Value], indent: usize) {
    for v in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match v {
            Value::Object(m) if !m.is_empty() => {
                // PyYAML puts the first key on the dash's line.
                let mut inner = String::new();
                mapping(&mut inner, m, indent + 2);
                out.push(' ');
                out.push_str(inner.trim_start());
            }
            Value::Array(inner) if !inner.is_empty() => {
                let mut nested = String::new();
                sequence(&mut nested, inner, indent + 2);
                out.push(' ');
                out.push_str(nested.trim_start());
            }
            other => {
                out.push(' ');
                out.push_str(&wrap(&inline(other), indent + 2, indent + 2));
                out.push('\n');
            }
        }
    }
}

fn inline(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => i.to_string(),
            (None, Some(u), _) => u.to_string(),
            (_, _, Some(f)) => float_repr(f),
            _ => n.to_string(),
        },
        Value::String(s) => string(s),
        Value::Array(_) => "[]".into(),
        Value::Object(_) => "{}".into(),
    }
}

/// Python's `repr(float)` as PyYAML writes it (`1.0e+16`, `100000000.0`).
pub fn float_repr(f: f64) -> String {
    if f.is_nan() {
        return ".nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { ".inf" } else { "-.inf" }.into();
    }
    let exp = if f == 0.0 {
        0
    } else {
        f.abs().log10().floor() as i32
    };
    if (-4..16).contains(&exp) {
        let s = format!("{f}");
        if s.contains('.') {
            s
        } else {
            format!("{s}.0")
        }
    } else {
        // Rust's shortest round-trip digits, in Python's exponent spelling.
        let s = format!("{f:e}");
        let (mantissa, e) = s.split_once('e').unwrap_or((&s, "0"));
        let mantissa = if mantissa.contains('.') {
            mantissa.to_owned()
        } else {
            format!("{mantissa}.0")
        };
        let (sign, digits) = match e.strip_prefix('-') {
            Some(d) => ('-', d),
            None => ('+', e),
        };
        format!("{mantissa}e{sign}{digits:0>2}")
    }
}

/// A string as PyYAML writes it: plain when it reads back as the same string,
/// else single-quoted; double-quoted, with escapes, when it holds characters
/// that neither style keeps: control characters (tabs too: folding a long
/// line drops a tab that starts the next one) and line separators.
fn string(s: &str) -> String {
    if s.chars()
        .any(|c| c.is_control() || !printable(c) || matches!(c, '\u{2028}' | '\u{2029}'))
    {
        return double_quoted(s);
    }
    if plain_ok(s) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
}

/// YAML's double-quoted style; every character the reader would refuse or
/// fold is escaped (a JSON string is not enough: it leaves DEL and C1
/// control characters raw, which no YAML reader accepts).
fn double_quoted(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\u{85}' => out.push_str("\\N"),
            '\u{2028}' => out.push_str("\\L"),
            '\u{2029}' => out.push_str("\\P"),
            c if printable(c) && !c.is_control() => out.push(c),
            c if u32::from(c) < 0x100 => out.push_str(&format!("\\x{:02X}", u32::from(c))),
            c if u32::from(c) < 0x10000 => out.push_str(&format!("\\u{:04X}", u32::from(c))),
            c => out.push_str(&format!("\\U{:08X}", u32::from(c))),
        }
    }
    out.push('"');
    out
}

fn plain_ok(s: &str) -> bool {
    if s.is_empty() || !matches!(resolve_plain(s), Value::String(_)) {
        return false;
    }
    if s.starts_with([' ', '\t']) || s.ends_with([' ', '\t', ':']) {
        return false;
    }
    let first = s.chars().next().unwrap_or(' ');
    let second = s.chars().nth(1);
    let follows_space = |c: Option<char>| c.is_none_or(|c| c == ' ' || c == '\t');
    if "#,[]{}&*!|>'\"%@`".contains(first) {
        return false;
    }
    if "-?:".contains(first) && follows_space(second) {
        return false;
    }
    if s.starts_with("---") || s.starts_with("...") {
        return false;
    }
    !(s.contains(": ") || s.contains(" #") || s.contains(":\t") || s.contains("\t#"))
}
