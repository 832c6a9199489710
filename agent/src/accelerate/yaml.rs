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

use serde_json::{Map, Number, Value};
use yaml_rust2::parser::{Event, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// A YAML text that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct YamlError(String);

/// Reads the first document of `text` as PyYAML's `safe_load` does. An empty
/// text is `null`.
pub fn load(text: &str) -> Result<Value, YamlError> {
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

/// Builds values from parser events; anchors are kept for aliases.
#[derive(Default)]
struct Builder {
    stack: Vec<(Value, Option<String>, usize)>,
    root: Option<Value>,
    anchors: Vec<(usize, Value)>,
}

impl Builder {
    fn push(&mut self, event: Event, mark: Marker) -> Result<(), YamlError> {
        match event {
            Event::Scalar(text, style, anchor, tag) => {
                let tag = tag.map(|t| t.suffix);
                let v = scalar(&text, style, tag.as_deref())
                    .map_err(|m| YamlError(format!("line {}: {m}", mark.line())))?;
                self.value(v, anchor, mark)
            }
            Event::Alias(id) => {
                let v = self
                    .anchors
                    .iter()
                    .rev()
                    .find(|(a, _)| *a == id)
                    .map(|(_, v)| v.clone())
                    .ok_or_else(|| YamlError(format!("line {}: unknown alias", mark.line())))?;
                self.value(v, 0, mark)
            }
            Event::SequenceStart(anchor, _) => {
                self.stack.push((Value::Array(Vec::new()), None, anchor));
                Ok(())
            }
            Event::MappingStart(anchor, _) => {
                self.stack.push((Value::Object(Map::new()), None, anchor));
                Ok(())
            }
            Event::SequenceEnd | Event::MappingEnd => match self.stack.pop() {
                Some((v, _, anchor)) => self.value(v, anchor, mark),
                None => Err(YamlError("unbalanced document".into())),
            },
            _ => Ok(()),
        }
    }

    fn value(&mut self, v: Value, anchor: usize, mark: Marker) -> Result<(), YamlError> {
        if anchor != 0 {
            self.anchors.push((anchor, v.clone()));
        }
        let Some((parent, key, _)) = self.stack.last_mut() else {
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
                .ok_or(format!("'{text}' is not a boolean"))
        }
        Some("int") => return int11(text).ok_or(format!("'{text}' is not an integer")),
        Some("float") => {
            return float11(text)
                .or_else(|| int11(text).and_then(|v| v.as_f64()).map(float_value))
                .ok_or(format!("'{text}' is not a number"))
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
            v = v * 60 + n;
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
        let (sign, rest) = e.split_at(e.len().min(1));
        if !matches!(sign, "+" | "-")
            || rest.is_empty()
            || !rest.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse::<f64>().ok().map(float_value)
}

fn float_value(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

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
/// else single-quoted (double-quoted when it holds control characters).
fn string(s: &str) -> String {
    if s.chars().any(|c| c.is_control() && c != '\t') {
        return serde_json::to_string(s).unwrap_or_default();
    }
    if plain_ok(s) {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', "''"))
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn yaml_1_1_scalars() {
        let v = load(
            "a: NO\nb: 'NO'\nc: no\nd: off\ne: 1e8\nf: 1.0e+8\ng: 0755\nh: 12:30\ni: ~\nj: 0x1F\n\
             k: 6,7\nl: 0\nm: \"yes\"\nn: !!str 5\no: 1_000\np: .5\nq:\n  - x\n  - 2\n",
        )
        .expect("parses");
        assert_eq!(
            v,
            json!({"a": false, "b": "NO", "c": false, "d": false, "e": "1e8", "f": 100000000.0,
                   "g": 493, "h": 750, "i": null, "j": 31, "k": "6,7", "l": 0, "m": "yes",
                   "n": "5", "o": 1000, "p": 0.5, "q": ["x", 2]})
        );
    }

    #[test]
    fn json_is_yaml() {
        let v = load("{\n  \"debug\": false,\n  \"num_processes\": 4\n}\n").expect("parses");
        assert_eq!(v, json!({"debug": false, "num_processes": 4}));
    }

    #[test]
    fn empty_and_bad_documents() {
        assert_eq!(load("").expect("empty"), Value::Null);
        assert!(load("a: [1, 2\n").is_err());
        assert!(load("a: *nothing\n").is_err());
    }

    #[test]
    fn dump_matches_pyyaml() {
        // Expected text printed by PyYAML 6.0's yaml.safe_dump for the same dict.
        let v = json!({"a":"no","b":"1e8","c":1e16,"d":1e8,"e":[],"g":"x: y","h":"-x","i":"- x",
            "j":"a #b","k":"0,1","l":"~","m":"","n":["a","b"],"o":{"z":1,"a":null},"p":0.1,
            "q":"12:30","r":"NO","s":"on","t":"0x1f","u":"1.0"});
        assert_eq!(
            dump(&v),
            "a: 'no'\nb: 1e8\nc: 1.0e+16\nd: 100000000.0\ne: []\ng: 'x: y'\nh: -x\ni: '- x'\n\
             j: 'a #b'\nk: 0,1\nl: '~'\nm: ''\nn:\n- a\n- b\no:\n  a: null\n  z: 1\np: 0.1\n\
             q: '12:30'\nr: 'NO'\ns: 'on'\nt: '0x1f'\nu: '1.0'\n"
        );
    }

    #[test]
    fn long_strings_fold_like_pyyaml() {
        let words: Vec<String> = (0..30).map(|i| format!("word{i}")).collect();
        let w = words.join(" ");
        let v = json!({"a": w, "b": {"c": w}, "l": [w], "q": format!("no {w}")});
        // Printed by PyYAML 6.0's yaml.safe_dump for the same dict.
        let expected = "a: word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 word10 word11 word12\n  word13 word14 word15 word16 word17 word18 word19 word20 word21 word22 word23 word24\n  word25 word26 word27 word28 word29\nb:\n  c: word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 word10 word11 word12\n    word13 word14 word15 word16 word17 word18 word19 word20 word21 word22 word23 word24\n    word25 word26 word27 word28 word29\nl:\n- word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 word10 word11 word12\n  word13 word14 word15 word16 word17 word18 word19 word20 word21 word22 word23 word24\n  word25 word26 word27 word28 word29\nq: no word0 word1 word2 word3 word4 word5 word6 word7 word8 word9 word10 word11 word12\n  word13 word14 word15 word16 word17 word18 word19 word20 word21 word22 word23 word24\n  word25 word26 word27 word28 word29\n";
        assert_eq!(dump(&v), expected);
        assert_eq!(load(&dump(&v)).expect("reads back"), v);
    }

    #[test]
    fn round_trip() {
        let v = json!({"distributed_type": "NO", "mixed_precision": "no", "gpu_ids": "all",
            "tpu_env": [], "fsdp_config": {"fsdp_version": 2, "fsdp_offload_params": false}});
        assert_eq!(load(&dump(&v)).expect("reads back"), v);
    }
}
