//! Asking one question: accelerate's `_ask_field` and `_ask_options`, read
//! line by line.
//!
//! `_ask_field` writes the question without a newline, reads one line,
//! returns the default for an empty line (unconverted, when there is one),
//! else the converted answer; an answer that does not convert prints the
//! question's error message (when it has one) and asks again. Python's
//! `input()` raises at end of input, so EOF stops the questionnaire here too,
//! naming the question, instead of asking forever.
//!
//! `_ask_options` shows accelerate's arrow-key menu, which cannot work on a
//! pipe; the menu here lists the options with the 0-based numbers
//! accelerate's menu uses (its number keys select the row with that index)
//! and takes the index or the option's text, an empty line keeping the
//! default.

use std::io::{BufRead, Write};

use super::QuestionnaireError;

/// accelerate's error message for its yes/no questions.
const YES_NO_ERROR: &str = "Please enter yes or no.";

/// The questions' input and output.
pub(super) struct Prompter<'a> {
    input: &'a mut dyn BufRead,
    output: &'a mut dyn Write,
}

impl<'a> Prompter<'a> {
    /// Asks on `output`, reads answers from `input`.
    pub(super) fn new(input: &'a mut dyn BufRead, output: &'a mut dyn Write) -> Self {
        Self { input, output }
    }

    /// Writes `text` as is and flushes it, so a question is visible before
    /// the answer is read.
    pub(super) fn say(&mut self, text: &str) -> Result<(), QuestionnaireError> {
        self.output
            .write_all(text.as_bytes())
            .and_then(|()| self.output.flush())
            .map_err(QuestionnaireError::Write)
    }

    /// One answer line without its line ending; EOF is an error naming `question`.
    fn line(&mut self, question: &str) -> Result<String, QuestionnaireError> {
        let mut line = String::new();
        let read = self
            .input
            .read_line(&mut line)
            .map_err(QuestionnaireError::Read)?;
        if read == 0 {
            // End the question's line, so the error is not printed after it.
            self.say("\n")?;
            return Err(QuestionnaireError::NoAnswer(question.trim().to_owned()));
        }
        if line.ends_with('\n') {
            line.pop();
            if line.ends_with('\r') {
                line.pop();
            }
        }
        Ok(line)
    }

    /// accelerate's `_ask_field`: `convert` returns `None` for an answer it
    /// cannot take.
    pub(super) fn field<T: Clone>(
        &mut self,
        question: &str,
        default: Option<T>,
        error: Option<&str>,
        convert: impl Fn(&str) -> Option<T>,
    ) -> Result<T, QuestionnaireError> {
        loop {
            self.say(question)?;
            let answer = self.line(question)?;
            if answer.is_empty() {
                if let Some(d) = &default {
                    return Ok(d.clone());
                }
            }
            match convert(&answer) {
                Some(v) => return Ok(v),
                None => {
                    if let Some(e) = error {
                        self.say(&format!("{e}\n"))?;
                    }
                }
            }
        }
    }

    /// A free-text answer (accelerate's `_ask_field` without conversion, or
    /// with `str`): any line is taken, an empty one gives `default` if any.
    pub(super) fn text(
        &mut self,
        question: &str,
        default: Option<&str>,
    ) -> Result<String, QuestionnaireError> {
        self.field(question, default.map(str::to_owned), None, |s| {
            Some(s.to_owned())
        })
    }

    /// An integer, as Python's `int()` reads it.
    pub(super) fn int(
        &mut self,
        question: &str,
        default: Option<i64>,
        error: Option<&str>,
    ) -> Result<i64, QuestionnaireError> {
        self.field(question, default, error, py_int)
    }

    /// A float, as Python's `float()` reads it (accelerate's float questions
    /// all have a default and no error message).
    pub(super) fn float(
        &mut self,
        question: &str,
        default: f64,
    ) -> Result<f64, QuestionnaireError> {
        self.field(question, Some(default), None, py_float)
    }

    /// A yes/no question with accelerate's "Please enter yes or no." message.
    pub(super) fn yes_no(
        &mut self,
        question: &str,
        default: bool,
    ) -> Result<bool, QuestionnaireError> {
        self.field(question, Some(default), Some(YES_NO_ERROR), yes_no)
    }

    /// A yes/no question that accelerate re-asks without a message (the FP8 ones).
    pub(super) fn yes_no_quiet(
        &mut self,
        question: &str,
        default: bool,
    ) -> Result<bool, QuestionnaireError> {
        self.field(question, Some(default), None, yes_no)
    }

    /// accelerate's `_ask_options`: the index of the chosen option.
    pub(super) fn choose<S: AsRef<str>>(
        &mut self,
        question: &str,
        choices: &[S],
        default: usize,
    ) -> Result<usize, QuestionnaireError> {
        let mut menu = format!(
            "{question}\nPlease input a choice index (starting from 0) or the choice itself, and press enter (an empty line keeps the one marked ➔)\n"
        );
        let width = choices.len().saturating_sub(1).to_string().len();
        for (i, c) in choices.iter().enumerate() {
            let mark = if i == default { "➔" } else { " " };
            menu.push_str(&format!(" {mark} {i:>width$}: {}\n", c.as_ref()));
        }
        self.say(&menu)?;
        loop {
            let answer = self.line(question)?;
            if let Some(i) = menu_choice(answer.trim(), choices, default) {
                self.say(&format!("{}\n", choices[i].as_ref()))?;
                return Ok(i);
            }
            self.say(&format!(
                "Please enter a number from 0 to {}, or one of the choices as listed.\n",
                choices.len().saturating_sub(1)
            ))?;
        }
    }
}

/// The option a menu answer selects: empty = `default`, else an index, else
/// the option's text (exactly, then ignoring ASCII case).
fn menu_choice<S: AsRef<str>>(answer: &str, choices: &[S], default: usize) -> Option<usize> {
    if answer.is_empty() {
        return Some(default);
    }
    if let Ok(i) = answer.parse::<usize>() {
        if i < choices.len() {
            return Some(i);
        }
    }
    choices
        .iter()
        .position(|c| c.as_ref() == answer)
        .or_else(|| {
            choices
                .iter()
                .position(|c| c.as_ref().eq_ignore_ascii_case(answer))
        })
}

/// accelerate's `_convert_yes_no_to_bool`: exactly `yes` or `no`, any case.
pub(super) fn yes_no(answer: &str) -> Option<bool> {
    match answer.to_lowercase().as_str() {
        "yes" => Some(true),
        "no" => Some(false),
        _ => None,
    }
}

/// Python's `int(str)` for what fits in an `i64`: surrounding whitespace,
/// a sign, digits with single underscores between them.
pub(super) fn py_int(answer: &str) -> Option<i64> {
    let t = answer.trim();
    let (negative, digits) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    if !digits.bytes().all(|b| b.is_ascii_digit() || b == b'_') || !underscores_ok(digits) {
        return None;
    }
    let clean: String = digits.chars().filter(|c| *c != '_').collect();
    let magnitude: i64 = clean.parse().ok()?;
    Some(if negative { -magnitude } else { magnitude })
}

/// Python's `float(str)` for finite values (a NaN or infinity has no
/// JSON form to hand to the writer, so it is refused and asked again).
pub(super) fn py_float(answer: &str) -> Option<f64> {
    let t = answer.trim();
    if !underscores_ok(t) {
        return None;
    }
    let clean: String = t.chars().filter(|c| *c != '_').collect();
    clean.parse::<f64>().ok().filter(|f| f.is_finite())
}

/// Python's numeric literals allow `_` only between two digits.
fn underscores_ok(s: &str) -> bool {
    let b = s.as_bytes();
    b.iter().enumerate().all(|(i, c)| {
        *c != b'_'
            || (i > 0 && b[i - 1].is_ascii_digit() && b.get(i + 1).is_some_and(u8::is_ascii_digit))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask<T>(
        answers: &str,
        f: impl FnOnce(&mut Prompter<'_>) -> Result<T, QuestionnaireError>,
    ) -> (Result<T, QuestionnaireError>, String) {
        let mut input = answers.as_bytes();
        let mut output = Vec::new();
        let r = f(&mut Prompter::new(&mut input, &mut output));
        (r, String::from_utf8(output).expect("utf-8"))
    }

    #[test]
    fn python_numbers() {
        assert_eq!(py_int(" 42 "), Some(42));
        assert_eq!(py_int("-3"), Some(-3));
        assert_eq!(py_int("+007"), Some(7));
        assert_eq!(py_int("1_000"), Some(1000));
        for bad in [
            "",
            "1.0",
            "1__0",
            "_1",
            "1_",
            "0x10",
            "1e3",
            "- 1",
            "99999999999999999999",
        ] {
            assert_eq!(py_int(bad), None, "{bad:?}");
        }
        assert_eq!(py_float("0.5"), Some(0.5));
        assert_eq!(py_float(" 2 "), Some(2.0));
        assert_eq!(py_float("1e-3"), Some(0.001));
        assert_eq!(py_float("1_0.5"), Some(10.5));
        assert_eq!(py_float(".5"), Some(0.5));
        for bad in ["", "x", "1_.5", "nan", "inf", "1,5"] {
            assert_eq!(py_float(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn yes_no_is_accelerates() {
        assert_eq!(yes_no("YES"), Some(true));
        assert_eq!(yes_no("No"), Some(false));
        assert_eq!(yes_no("y"), None);
        assert_eq!(yes_no(" yes"), None);
    }

    #[test]
    fn fields_default_reask_and_stop_at_eof() {
        let (r, out) = ask("\n", |p| p.yes_no("Q? [yes/NO]: ", false));
        assert!(!r.expect("default"));
        assert_eq!(out, "Q? [yes/NO]: ");
        let (r, out) = ask("maybe\r\nYes\n", |p| p.yes_no("Q? ", false));
        assert!(r.expect("second answer"));
        assert_eq!(out, "Q? Please enter yes or no.\nQ? ");
        // No default: an empty line is a valid text answer, and not an int.
        let (r, _) = ask("\n", |p| p.text("IP? ", None));
        assert_eq!(r.expect("empty text"), "");
        let (r, out) = ask("\nabc\n29500", |p| p.int("Port? ", None, None));
        assert_eq!(r.expect("int"), 29500);
        assert_eq!(out, "Port? Port? Port? ");
        let (r, _) = ask("x\n", |p| {
            p.int("How many? [1]: ", Some(1), Some("Please enter an integer."))
        });
        let err = r.expect_err("EOF");
        assert_eq!(err.to_string(), "no answer for: How many? [1]:");
    }

    #[test]
    fn menus_take_index_text_or_default() {
        let choices = ["no", "fp16", "bf16", "fp8"];
        let (r, out) = ask("\n", |p| p.choose("Mixed?", &choices, 0));
        assert_eq!(r.expect("default"), 0);
        assert!(out.starts_with("Mixed?\n"), "{out}");
        assert!(
            out.contains(" ➔ 0: no\n") && out.contains("   3: fp8\n"),
            "{out}"
        );
        let (r, _) = ask("2\n", |p| p.choose("Mixed?", &choices, 0));
        assert_eq!(r.expect("index"), 2);
        let (r, _) = ask("BF16\n", |p| p.choose("Mixed?", &choices, 0));
        assert_eq!(r.expect("text"), 2);
        let (r, out) = ask("7\nfp9\n 3 \n", |p| p.choose("Mixed?", &choices, 0));
        assert_eq!(r.expect("after re-asking"), 3);
        assert_eq!(out.matches("Please enter a number from 0 to 3").count(), 2);
        // An index wins over a numeric option text, as accelerate's number keys do.
        assert_eq!(menu_choice("1", &["1", "2"], 1), Some(1));
        assert_eq!(menu_choice("2", &["1", "2"], 1), Some(1));
        let (r, _) = ask("", |p| p.choose("Rank?", &["0", "1"], 0));
        assert_eq!(r.expect_err("EOF").to_string(), "no answer for: Rank?");
    }
}
