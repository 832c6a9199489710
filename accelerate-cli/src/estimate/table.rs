//! The text `estimate-memory` prints: accelerate's byte formatting and its
//! box-drawing table, reproduced character for character.
//!
//! Users and scripts compare `accel estimate-memory` with `accelerate
//! estimate-memory`, so the quirks are kept on purpose: sizes that are whole
//! numbers of bytes print as integers (`100 bytes`) while halved sizes print
//! as Python floats (`50.0 bytes`); rounding is Python's `round(x, 2)` (half to
//! even on the exact binary value); cells are centred with Python's
//! `str.center` (which puts the odd space on the left when the width is odd);
//! and a title longer than the columns widens the last column by twice the
//! difference between the title and the separator line, as accelerate's
//! `create_ascii_table` does.

/// A byte count as accelerate holds it: an integer, or a Python float after a
/// true division.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Bytes {
    /// A whole number of bytes (a Python `int`).
    Whole(u64),
    /// A fractional number of bytes (a Python `float`).
    Fraction(f64),
}

/// accelerate's units, smallest first; past the last one it says `PB`.
const UNITS: [&str; 5] = ["bytes", "KB", "MB", "GB", "TB"];

/// accelerate's `convert_bytes`: divide by 1024 until below 1024, then
/// `round(size, 2)` and the unit.
pub(super) fn convert_bytes(size: Bytes) -> String {
    let mut value = match size {
        Bytes::Whole(n) if n < 1024 => return format!("{n} {}", UNITS[0]),
        Bytes::Whole(n) => n as f64 / 1024.0,
        Bytes::Fraction(f) if f < 1024.0 => return format!("{} {}", py_round2(f), UNITS[0]),
        Bytes::Fraction(f) => f / 1024.0,
    };
    for unit in &UNITS[1..] {
        if value < 1024.0 {
            return format!("{} {unit}", py_round2(value));
        }
        value /= 1024.0;
    }
    format!("{} PB", py_round2(value))
}

/// `repr(round(x, 2))` for the values `convert_bytes` sees (non-negative and
/// far below 1e16, so Python never switches to exponent notation).
///
/// Rust's `{:.2}` rounds the exact binary value half to even, as Python's
/// `round` does; Python's `repr` then prints the shortest form, which for a
/// number with at most two decimals is that text without trailing zeros
/// (keeping one digit after the point).
fn py_round2(x: f64) -> String {
    let mut text = format!("{x:.2}");
    while text.ends_with('0') {
        text.pop();
    }
    if text.ends_with('.') {
        text.push('0');
    }
    text
}

/// Python's `str.center(width)` with spaces: unchanged when already wide
/// enough; otherwise the left margin is half the padding, plus one when both
/// the padding and the width are odd.
pub(super) fn center(text: &str, width: usize) -> String {
    let len = text.chars().count();
    if width <= len {
        return text.to_owned();
    }
    let margin = width - len;
    let left = margin / 2 + (margin & width & 1);
    let right = margin - left;
    format!("{}{text}{}", " ".repeat(left), " ".repeat(right))
}

/// accelerate's `create_ascii_table`: a title box over a grid of centred
/// cells. `rows` must not be empty and every row has one cell per header.
pub(super) fn ascii_table(headers: &[&str], rows: &[Vec<String>], title: &str) -> String {
    const BAR: &str = "─";
    let chars = |s: &str| s.chars().count();
    let mut widths: Vec<usize> = headers
        .iter()
        .enumerate()
        .map(|(i, h)| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| chars(c))
                .chain([chars(h)])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |left: &str, middle: &str, right: &str, widths: &[usize], extra: usize| {
        let cells: Vec<String> = widths.iter().map(|w| BAR.repeat(*w)).collect();
        format!("{left}{}{}{right}", cells.join(middle), BAR.repeat(extra))
    };
    // The separator as accelerate first draws it, before any widening.
    let separator_len = widths.iter().sum::<usize>() + widths.len().saturating_sub(1) + 2;
    let title_len = chars(title);
    let mut diff = 0;
    if title_len > widths.iter().sum::<usize>() {
        diff = title_len.abs_diff(separator_len);
        if let Some(last) = widths.last_mut() {
            *last += diff;
        }
    }
    let separator = line("├", "┼", "┤", &widths, diff);
    let mut table = String::new();
    table.push_str(&line("┌", BAR, "┐", &widths, diff));
    table.push('\n');
    let inner = chars(&separator).saturating_sub(2);
    table.push_str(&format!("│{}│\n", center(title, inner)));
    table.push_str(&line("├", "┬", "┤", &widths, diff));
    table.push('\n');
    if let Some(last) = widths.last_mut() {
        *last += diff;
    }
    let grid_row = |cells: &mut dyn Iterator<Item = &str>| {
        let centred: Vec<String> = cells
            .zip(&widths)
            .map(|(cell, w)| center(cell, *w))
            .collect();
        format!("│{}│\n", centred.join("│"))
    };
    table.push_str(&grid_row(&mut headers.iter().copied()));
    table.push_str(&separator);
    table.push('\n');
    for row in rows {
        table.push_str(&grid_row(&mut row.iter().map(String::as_str)));
    }
    table.push_str(&line("└", "┴", "┘", &widths, 0));
    table
}

/// accelerate's documented table for `bert-base-cased` (its docs, checked
/// against its formatter), for tests.
#[cfg(test)]
pub(super) const BERT_BASE_CASED: &str = "\
┌────────────────────────────────────────────────────┐
│     Memory Usage for loading `bert-base-cased`     │
├───────┬─────────────┬──────────┬───────────────────┤
│ dtype │Largest Layer│Total Size│Training using Adam│
├───────┼─────────────┼──────────┼───────────────────┤
│float32│   84.95 MB  │413.18 MB │      1.61 GB      │
│float16│   42.47 MB  │206.59 MB │     826.36 MB     │
│  int8 │   21.24 MB  │103.29 MB │        N/A        │
│  int4 │   10.62 MB  │ 51.65 MB │        N/A        │
└───────┴─────────────┴──────────┴───────────────────┘";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_formatted_as_accelerate_formats_them() {
        assert_eq!(convert_bytes(Bytes::Whole(0)), "0 bytes");
        assert_eq!(convert_bytes(Bytes::Whole(1023)), "1023 bytes");
        assert_eq!(convert_bytes(Bytes::Fraction(50.0)), "50.0 bytes");
        assert_eq!(convert_bytes(Bytes::Fraction(0.5)), "0.5 bytes");
        assert_eq!(convert_bytes(Bytes::Whole(1024)), "1.0 KB");
        // bert-base-cased: 108,310,272 parameters and two 512-element int64
        // buffers, which accelerate counts at 8 bytes.
        let total = 108_310_272 * 4 + 2 * 512 * 8;
        assert_eq!(convert_bytes(Bytes::Whole(total)), "413.18 MB");
        assert_eq!(convert_bytes(Bytes::Whole(4 * total)), "1.61 GB");
        assert_eq!(
            convert_bytes(Bytes::Fraction(total as f64 / 8.0)),
            "51.65 MB"
        );
        // Ties round half to even on the exact value, like Python's round().
        assert_eq!(convert_bytes(Bytes::Whole(1152)), "1.12 KB"); // 1.125
        assert_eq!(convert_bytes(Bytes::Whole(1408)), "1.38 KB"); // 1.375
                                                                  // Rounding up to 1024 keeps the smaller unit, as in accelerate.
        assert_eq!(convert_bytes(Bytes::Whole(1024 * 1024 - 1)), "1024.0 KB");
        assert_eq!(convert_bytes(Bytes::Whole(u64::MAX)), "16384.0 PB");
    }

    #[test]
    fn center_matches_python() {
        assert_eq!(center("int8", 7), "  int8 ");
        assert_eq!(center("ab", 5), "  ab ");
        assert_eq!(center("ab", 6), "  ab  ");
        assert_eq!(center("abc", 6), " abc  ");
        assert_eq!(center("toolong", 3), "toolong");
    }

    fn bert_rows() -> Vec<Vec<String>> {
        [
            ["float32", "84.95 MB", "413.18 MB", "1.61 GB"],
            ["float16", "42.47 MB", "206.59 MB", "826.36 MB"],
            ["int8", "21.24 MB", "103.29 MB", "N/A"],
            ["int4", "10.62 MB", "51.65 MB", "N/A"],
        ]
        .iter()
        .map(|r| r.iter().map(|c| (*c).to_owned()).collect())
        .collect()
    }

    const HEADERS: [&str; 4] = [
        "dtype",
        "Largest Layer",
        "Total Size",
        "Training using Adam",
    ];

    #[test]
    fn table_matches_accelerates_documented_output() {
        let expected = BERT_BASE_CASED;
        let title = "Memory Usage for loading `bert-base-cased`";
        assert_eq!(ascii_table(&HEADERS, &bert_rows(), title), expected);
    }

    #[test]
    fn a_long_title_widens_the_last_column_twice_over() {
        // Columns sum to 49, the separator is 54 wide: a 60-character title
        // gives diff = 6, and the last column grows by 12.
        let title = "x".repeat(60);
        let table = ascii_table(&HEADERS, &bert_rows(), &title);
        let lines: Vec<&str> = table.lines().collect();
        let width = |l: &str| l.chars().count();
        assert!(lines.iter().all(|l| width(l) == 54 + 12), "{table}");
        assert_eq!(lines[1], format!("│  {title}  │"));
        assert!(lines[3].ends_with(&format!("│{}│", center("Training using Adam", 31))));
    }

    #[test]
    fn a_title_just_over_the_columns_still_widens_by_the_separator_gap() {
        // 50 > 49 but shorter than the separator (54): diff = 4, so the box
        // grows by 8 even though the title would have fitted.
        let title = "y".repeat(50);
        let table = ascii_table(&HEADERS, &bert_rows(), &title);
        assert!(table.lines().all(|l| l.chars().count() == 62), "{table}");
    }
}
