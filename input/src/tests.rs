use super::*;

#[test]
fn durations() {
    assert_eq!(parse_duration("30"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration(" 0.5 "), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration(".25"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("2 min"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    // Python floats as torchrun's argparse and `accel launch` print them.
    assert_eq!(parse_duration("1e3"), Ok(Duration::from_secs(1000)));
    assert_eq!(parse_duration("1.5E+2"), Ok(Duration::from_secs(150)));
    assert_eq!(parse_duration("5e-1"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("1e-300"), Ok(Duration::ZERO));
}

#[test]
fn the_bound_is_ten_years_inclusive() {
    assert_eq!(
        parse_duration("315576000"),
        Ok(MAX_DURATION),
        "exactly ten years"
    );
    assert_eq!(parse_duration("87660h"), Ok(MAX_DURATION));
    for long in [
        "315576000.001",
        "87661h",
        "100000000000000000000",
        "10000000000000000000",
        "1e20",
        "1e999",
        "18446744073709551616",
        "99999999999999999999999999999999999999999999999ms",
    ] {
        let e = parse_duration(long).expect_err(long);
        assert!(matches!(e, DurationError::TooLong(_)), "{long}: {e:?}");
        assert!(
            e.to_string().contains("is too long; at most 10 years"),
            "{e}"
        );
    }
    assert_eq!(
        parse_duration("1e20").map_err(|e| e.to_string()),
        Err("'1e20' is too long; at most 10 years (315576000 s)".to_owned())
    );
}

#[test]
fn what_is_not_a_duration_says_why() {
    let cases = [
        ("-1", "is negative"),
        ("-0.5s", "is negative"),
        ("abc", "is not a duration"),
        ("", "is not a duration"),
        ("inf", "is not a duration"),
        ("NaN", "is not a duration"),
        ("..", "is not a duration"),
        ("1.2.3", "is not a duration"),
        ("3 fortnights", "unknown duration unit 'fortnights'"),
        ("1e", "unknown duration unit 'e'"),
        ("1e+", "unknown duration unit 'e+'"),
        ("5d", "unknown duration unit 'd'"),
    ];
    for (input, expected) in cases {
        let e = parse_duration(input).expect_err(input).to_string();
        assert!(e.contains(expected), "{input:?}: {e}");
    }
}

#[test]
fn errors_quote_an_excerpt() {
    let huge = "9".repeat(100_000);
    let e = parse_duration(&huge).expect_err("too long").to_string();
    assert!(e.len() < 400, "{} bytes: {e}", e.len());
    assert!(
        e.contains(&format!("{}… (100000 bytes)", "9".repeat(200))),
        "{e}"
    );
    let e = parse_duration(&format!("1{}", "x".repeat(5000)))
        .expect_err("unit")
        .to_string();
    assert!(e.len() < 600, "{e}");
    let e = parse_duration("\u{1b}[2J").expect_err("escape").to_string();
    assert!(e.contains("\\u{1b}[2J") && !e.contains('\u{1b}'), "{e}");
}

#[test]
fn excerpts() {
    assert_eq!(excerpt("short").to_string(), "short");
    assert_eq!(excerpt("a\nb\tc").to_string(), "a\\nb\\tc");
    let exact = "é".repeat(EXCERPT_CHARS);
    assert_eq!(
        excerpt(&exact).to_string(),
        exact,
        "200 characters stay whole"
    );
    let longer = "é".repeat(EXCERPT_CHARS + 1);
    assert_eq!(
        excerpt(&longer).to_string(),
        format!("{exact}… ({} bytes)", longer.len()),
        "cut on a character boundary"
    );
}

#[test]
fn clap_messages_are_clipped_word_by_word() {
    let value = "x".repeat(50_000);
    let msg = format!(
        "error: invalid value '{value}' for '--max-restarts <MAX_RESTARTS>': invalid digit\n\nFor more information, try '--help'.\n"
    );
    let clipped = clip_message(&msg);
    assert!(clipped.len() < 600, "{clipped}");
    assert!(clipped.contains("(50002 bytes)"), "{clipped}");
    assert!(
        clipped
            .contains("for '--max-restarts <MAX_RESTARTS>': invalid digit\n\nFor more information"),
        "the flag and the reason survive: {clipped}"
    );
    let spaced = format!("error: '{}'\n", "ab ".repeat(10_000));
    let clipped = clip_message(&spaced);
    assert!(
        clipped.len() < 1100 && clipped.ends_with("bytes)\n"),
        "{clipped}"
    );
    let ordinary = "error: unexpected argument '--nope' found\n";
    assert_eq!(clip_message(ordinary), ordinary);
    let excerpted = format!(
        "error: {}\n",
        parse_duration(&"9".repeat(3000)).expect_err("too long")
    );
    assert_eq!(
        clip_message(&excerpted),
        excerpted,
        "excerpts are not cut again"
    );
}

#[test]
fn the_clap_parser_names_the_flag() {
    use clap::Parser;
    #[derive(Debug, Parser)]
    struct Args {
        #[arg(long, value_parser = DurationParser)]
        wait: Duration,
    }
    let a = Args::try_parse_from(["x", "--wait", "2m"]).expect("valid");
    assert_eq!(a.wait, Duration::from_secs(120));
    let e = Args::try_parse_from(["x", "--wait", "1e20"]).expect_err("too long");
    assert_eq!(e.kind(), ErrorKind::ValueValidation);
    assert_eq!(e.exit_code(), 2);
    let text = e.render().to_string();
    assert!(
        text.contains("invalid value for --wait: '1e20' is too long; at most 10 years"),
        "{text}"
    );
    let huge = "1".repeat(100_000);
    let e = Args::try_parse_from(["x", "--wait", &huge]).expect_err("too long");
    assert!(e.render().to_string().len() < 600);
}

#[test]
fn durations_in_words_read_back() {
    for (d, words) in [
        (Duration::ZERO, "0s"),
        (Duration::from_millis(250), "250ms"),
        (Duration::from_secs(30), "30s"),
        (Duration::from_secs(600), "10m"),
        (Duration::from_secs(7200), "2h"),
        (Duration::from_secs(90), "90s"),
    ] {
        assert_eq!(duration_words(d), words);
        assert_eq!(parse_duration(words), Ok(d));
    }
}
