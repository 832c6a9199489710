//! Python's view of configuration values: `str()`, `repr()` and
//! truthiness, for the places where accelerate's behaviour depends on them.
//!
//! `accelerate launch` exports values with `str()` (`True`, `1.0`, `None`)
//! and tests flags for truthiness; `accelerate env` prints each configuration item with an f-string, so a
//! top-level value appears as Python's `str()` (a string bare, `True`,
//! `2`) while anything inside a list or dictionary appears as its `repr()`
//! (`['a', "it's"]`, `{'k': None}`). Users paste this text into bug reports
//! next to accelerate's, so accel spells every value the way Python does.

use serde_json::{Map, Number, Value};

/// Python truthiness: `None`, `False`, `0`, `""`, `[]`, `{}` are false.
pub fn truthy(v: &Value) -> bool {
    match v {
        Value::Null | Value::Bool(false) => false,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::Bool(true) => true,
    }
}

/// Python's `str(value)`: strings bare, everything else as [`repr`].
pub fn str_of(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => repr(other),
    }
}

/// Python's `repr(value)` for what a configuration file can hold.
/// Dictionaries print in their map's order: serde_json's `preserve_order`
/// (enabled for the workspace) keeps the file's order, as Python's dict does.
pub fn repr(v: &Value) -> String {
    match v {
        Value::Null => "None".into(),
        Value::Bool(true) => "True".into(),
        Value::Bool(false) => "False".into(),
        Value::Number(n) => number(n),
        Value::String(s) => string(s),
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(repr).collect();
            format!("[{}]", inner.join(", "))
        }
        Value::Object(map) => dict(map),
    }
}

fn dict(map: &Map<String, Value>) -> String {
    let inner: Vec<String> = map
        .iter()
        .map(|(k, v)| format!("{}: {}", string(k), repr(v)))
        .collect();
    format!("{{{}}}", inner.join(", "))
}

fn number(n: &Number) -> String {
    if let Some(i) = n.as_i64() {
        i.to_string()
    } else if let Some(u) = n.as_u64() {
        u.to_string()
    } else {
        n.as_f64().map_or_else(|| n.to_string(), float)
    }
}

/// Python's `repr(float)`: the shortest digits that read back as the same
/// number, positional when the decimal exponent is in -4..16 (always with a
/// fractional part, `100.0`), else scientific with a signed two-digit
/// exponent (`1e-05`, `1.5e+16`).
pub fn float(f: f64) -> String {
    if f.is_nan() {
        return "nan".into();
    }
    if f.is_infinite() {
        return if f > 0.0 { "inf" } else { "-inf" }.into();
    }
    // Rust's `{:e}` gives the same shortest round-trip digits as Python.
    let sci = format!("{:e}", f.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let sign = if f.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp < 0 {
            let zeros = "0".repeat((-exp - 1) as usize);
            format!("0.{zeros}{digits}")
        } else {
            let point = exp as usize + 1;
            if digits.len() > point {
                format!("{}.{}", &digits[..point], &digits[point..])
            } else {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            }
        };
        format!("{sign}{body}")
    } else {
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{mantissa}e{esign}{:02}", exp.abs())
    }
}

/// Python's `repr(str)`: single quotes unless the text holds a single quote
/// and no double quote; backslash escapes for the quote, backslashes and
/// characters Python does not consider printable.
pub fn string(s: &str) -> String {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    let mut out = String::with_capacity(s.len() + 2);
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !printable(c) => {
                let n = c as u32;
                let esc = if n < 0x100 {
                    format!("\\x{n:02x}")
                } else if n < 0x1_0000 {
                    format!("\\u{n:04x}")
                } else {
                    format!("\\U{n:08x}")
                };
                out.push_str(&esc);
            }
            c => out.push(c),
        }
    }
    out.push(quote);
    out
}

/// Python's `str.isprintable` for one character, without Unicode tables:
/// control characters, separators other than the space, private-use
/// characters and the common format characters are not printable.
/// (Unassigned code points, which Python also escapes, are kept as is.)
fn printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let n = c as u32;
    let format_chars = [
        0xAD..=0xAD,
        0x600..=0x605,
        0x61C..=0x61C,
        0x6DD..=0x6DD,
        0x70F..=0x70F,
        0x180E..=0x180E,
        0x200B..=0x200F,
        0x202A..=0x202E,
        0x2060..=0x2064,
        0x2066..=0x206F,
        0xFEFF..=0xFEFF,
        0xFFF9..=0xFFFB,
        0xD800..=0xDFFF,
        0xE000..=0xF8FF,
        0xF_0000..=0x10_FFFF,
    ];
    !format_chars.iter().any(|r| r.contains(&n))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn floats_as_python_repr() {
        let cases = [
            (1e-5, "1e-05"),
            (1.5e-7, "1.5e-07"),
            (0.0001, "0.0001"),
            (0.1, "0.1"),
            (1.0, "1.0"),
            (100.0, "100.0"),
            (123.456, "123.456"),
            (1e15, "1000000000000000.0"),
            (1e16, "1e+16"),
            (1.5e16, "1.5e+16"),
            (1.2345e300, "1.2345e+300"),
            (-2.5, "-2.5"),
            (-0.0, "-0.0"),
            (0.0, "0.0"),
            (f64::INFINITY, "inf"),
            (f64::NAN, "nan"),
            (1.0 / 3.0, "0.3333333333333333"),
        ];
        for (f, want) in cases {
            assert_eq!(float(f), want, "{f:?}");
        }
    }

    #[test]
    fn strings_as_python_repr() {
        assert_eq!(string("abc"), "'abc'");
        assert_eq!(string("it's"), "\"it's\"");
        assert_eq!(string("both ' and \""), "'both \\' and \"'");
        assert_eq!(string("say \"hi\""), "'say \"hi\"'");
        assert_eq!(string("a\\b\n\t\r"), "'a\\\\b\\n\\t\\r'");
        assert_eq!(string("\x01\x7f\u{a0}"), "'\\x01\\x7f\\xa0'");
        assert_eq!(string("\u{200b}\u{2028}"), "'\\u200b\\u2028'");
        assert_eq!(string("é中🙂"), "'é中🙂'");
    }

    #[test]
    fn containers_and_top_level() {
        let v = json!({"b": [1, "x", true, null, 2.5], "a": {"k": {}}, "c": []});
        assert_eq!(
            repr(&v),
            "{'b': [1, 'x', True, None, 2.5], 'a': {'k': {}}, 'c': []}"
        );
        assert_eq!(str_of(&json!("no")), "no");
        assert_eq!(str_of(&json!(false)), "False");
        assert_eq!(str_of(&json!(29500)), "29500");
        assert_eq!(str_of(&json!(["a", "it's"])), "['a', \"it's\"]");
        assert_eq!(str_of(&json!(u64::MAX)), u64::MAX.to_string());
    }
}
