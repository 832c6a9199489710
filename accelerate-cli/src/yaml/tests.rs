//! The YAML dialect against what PyYAML reads and writes.

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

/// The "billion laughs" shape: each line's list holds nine of the previous.
fn alias_bomb(levels: usize) -> String {
    let mut text = String::from(
        "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n",
    );
    for i in 1..levels {
        let (prev, cur) = ((b'a' + i as u8 - 1) as char, (b'a' + i as u8) as char);
        let refs = vec![format!("*{prev}"); 9].join(",");
        text.push_str(&format!("{cur}: &{cur} [{refs}]\n"));
    }
    text
}

#[test]
fn anchors_and_aliases_are_refused_before_anything_expands() {
    let started = std::time::Instant::now();
    let e = load(&alias_bomb(9)).expect_err("refused").to_string();
    assert!(started.elapsed() < std::time::Duration::from_secs(1));
    assert!(
        e.starts_with("line 1: YAML anchors (&name) and aliases (*name) are not accepted"),
        "{e}"
    );
    for text in [
        "a: &x 1\n",
        "a: &x [1]\n",
        "a: &x {b: 1}\n",
        "? &k a\n: 1\n",
    ] {
        let e = load(text).expect_err(text).to_string();
        assert!(
            e.contains("anchors (&name) and aliases (*name)"),
            "{text:?}: {e}"
        );
    }
    // `&` and `*` inside values are just text.
    assert_eq!(
        load("a: 'x &y *z'\nb: x&y*z\n").expect("plain text"),
        json!({"a": "x &y *z", "b": "x&y*z"})
    );
}

#[test]
fn nesting_is_bounded() {
    let nested = |depth: usize| format!("{}1{}", "[".repeat(depth), "]".repeat(depth));
    let mut expected = json!(1);
    for _ in 0..MAX_DEPTH {
        expected = json!([expected]);
    }
    assert_eq!(load(&nested(MAX_DEPTH)).expect("at the limit"), expected);
    let e = load(&nested(MAX_DEPTH + 1))
        .expect_err("too deep")
        .to_string();
    assert!(e.contains("nested more than 32 deep"), "{e}");
    // A megabyte of brackets is refused without exhausting the stack.
    assert!(load(&nested(512 * 1024)).is_err());
    let block: String = (0..100)
        .map(|i| format!("{}k{i}:\n", "  ".repeat(i)))
        .collect();
    assert!(load(&block)
        .expect_err("too deep")
        .to_string()
        .contains("nested more than"));
}

#[test]
fn scalar_errors_quote_an_excerpt() {
    let e = load(&format!("a: !!int {}\n", "x".repeat(100_000)))
        .expect_err("not an int")
        .to_string();
    assert!(e.len() < 400 && e.contains("(100000 bytes)"), "{e}");
}

/// Found by fuzzing (accel_config): yaml-rust2 takes a NUL for the end of
/// the text, so everything after one was silently dropped (`c` below).
/// PyYAML refuses the file; so do we, for every character it refuses.
#[test]
fn special_characters_are_refused_like_pyyaml() {
    for text in [
        "a: 1\nb:\0\0 +0\nc: 3\n",
        "a: 1\u{7}\nc: 3\n",
        "a: '\u{1b}[2J'\n",
        "a: \u{fffe}\n",
    ] {
        let e = load(text).expect_err(text).to_string();
        assert!(e.contains("unacceptable character #x"), "{text:?}: {e}");
    }
    let e = load("a: 1\nb: 2\0\n").expect_err("NUL").to_string();
    assert!(
        e.starts_with("line 2: unacceptable character #x0000"),
        "{e}"
    );
    // What PyYAML accepts: tabs, line breaks and printable Unicode.
    assert_eq!(
        load("a: 'x\ty'\r\nb: \u{e9}\u{1f600}\n").expect("printable"),
        json!({"a": "x\ty", "b": "\u{e9}\u{1f600}"})
    );
}

/// Found by fuzzing (accel_config): an exponent starting with a multi-byte
/// character split a string inside it (a panic).
#[test]
fn a_float_with_a_non_ascii_exponent_is_a_string() {
    assert_eq!(
        load("f: 1.0e\u{57d}\n").expect("loads"),
        json!({"f": "1.0e\u{57d}"})
    );
}

/// Found by fuzzing (accel_config): `config update` wrote a long string
/// with tabs single-quoted and folded it at a space before the tabs, which a
/// reader then drops: the file changed meaning. PyYAML double-quotes such
/// strings; so do we, escaping what no reader keeps raw.
#[test]
fn strings_with_tabs_and_control_characters_read_back() {
    let long = format!("{} y{{ \t\t\tus", "x".repeat(70));
    for s in [
        long.as_str(),
        "a\tb",
        "\u{7f}",
        "\u{9b}x",
        "a\u{85}b",
        "\u{2028}",
        "\u{fffe}",
        "line\nbreak\r",
        "\t\"\\",
    ] {
        let v = json!({"k": s});
        let text = dump(&v);
        assert!(
            text.starts_with("k: \""),
            "{s:?} is written double-quoted: {text:?}"
        );
        assert_eq!(load(&text).expect("reads back"), v, "{text:?}");
    }
    assert_eq!(
        dump(&json!({"k": "a\tb"})),
        "k: \"a\\tb\"\n",
        "as PyYAML writes it"
    );
}

/// Seen while triaging a fuzz crash: a base-60 integer whose first part is
/// near i128::MAX overflowed (a panic in debug builds, a wrapped number in
/// release ones). It reads as a string, as a decimal too long for i128 does.
#[test]
fn a_base_60_integer_beyond_i128_is_a_string() {
    let huge = "99999999999999999999999999999999999999:00";
    assert_eq!(
        load(&format!("a: {huge}\nb: 1:00:00\n")).expect("reads"),
        json!({"a": huge, "b": 3600})
    );
}
