//! Reading ferrocoll's environment variables: one way to look them up and
//! the parsers every knob shares, so that every bad value gets the same
//! kind of answer.
//!
//! Rules every variable follows (the README's table of accepted values
//! lists each one's range):
//!
//! - A variable that is unset, empty or only spaces keeps its default
//!   (launchers often export empty variables); values are trimmed.
//! - A value that cannot be used (not a number, out of range, not one of
//!   the listed words, a path that cannot be read) is an
//!   [`Error::Config`] naming the variable, its value, what it accepts and
//!   an example; never a panic, never a silent default.
//! - Numbers are whole decimal numbers (no sign, no exponent, no suffix)
//!   unless the variable says otherwise (`FERROCOLL_TIMEOUT` takes decimal
//!   seconds); words are case-insensitive.
//!
//! Parsers take a lookup (`&dyn Fn(&str) -> Option<String>`) rather than
//! reading the process environment, so tests can try any value without
//! changing the environment of a process whose other threads read it.

use std::time::Duration;

use crate::error::{Error, Result};

/// Where variables come from: the process environment or, in tests, a map.
pub(crate) type Vars<'a> = &'a dyn Fn(&str) -> Option<String>;

/// The process environment as a [`Vars`] (variables that are not valid
/// UTF-8 count as unset).
pub(crate) fn process(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The trimmed value of `name`; `None` when unset, empty or only spaces.
pub(crate) fn get(vars: Vars<'_>, name: &str) -> Option<String> {
    vars(name)
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
}

/// Longest value quoted whole in an error message.
const SHOWN: usize = 200;

/// The [`Error::Config`] for `var=value`, with the value shortened when it
/// is very long (a pasted file, say).
pub(crate) fn bad(var: &str, value: &str, reason: impl Into<String>) -> Error {
    let value = if value.len() > SHOWN {
        let mut end = SHOWN;
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        format!("{}... ({} bytes)", &value[..end], value.len())
    } else {
        value.to_string()
    };
    Error::Config {
        var: var.to_string(),
        value,
        reason: reason.into(),
    }
}

/// The message of an error for use as a reason (without the
/// `invalid argument: ` prefix).
pub(crate) fn reason(e: Error) -> String {
    match e {
        Error::InvalidArgument(reason) => reason,
        other => other.to_string(),
    }
}

/// Why `value` is not a whole number, in words.
pub(crate) fn not_whole(value: &str) -> &'static str {
    let v = value.trim();
    if v.starts_with('-') {
        "a negative number"
    } else if v.bytes().all(|b| b.is_ascii_digit()) {
        "too large"
    } else if v.parse::<f64>().is_ok() {
        "not a whole number"
    } else {
        "not a number"
    }
}

/// A whole number in `min..=max`. `what` says what the number counts
/// (`"bytes"`, `"microseconds"`); `hint` is appended to the reason (what
/// special values mean, the default).
pub(crate) fn whole(
    var: &str,
    value: &str,
    min: u64,
    max: u64,
    what: &str,
    hint: &str,
) -> Result<u64> {
    let range = || {
        format!(
            "give a whole number of {what} from {min} to {max}, e.g. {var}={}{hint}",
            example(min, max)
        )
    };
    match value.trim().parse::<u64>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        Ok(n) if n < min => Err(bad(var, value, format!("too small; {}", range()))),
        Ok(_) => Err(bad(var, value, format!("too large; {}", range()))),
        Err(_) => Err(bad(
            var,
            value,
            format!("{}; {}", not_whole(value), range()),
        )),
    }
}

/// A value of the range for error messages: the smallest one above zero.
fn example(min: u64, max: u64) -> u64 {
    min.max(1).min(max)
}

/// [`whole`] as a `usize` (the bounds must fit one).
pub(crate) fn whole_usize(
    var: &str,
    value: &str,
    min: usize,
    max: usize,
    what: &str,
    hint: &str,
) -> Result<usize> {
    whole(var, value, min as u64, max as u64, what, hint).map(|n| n as usize)
}

/// Decimal seconds in `min..=max`, as a [`Duration`] (`0.5`, `30`, `1e3`;
/// never NaN, infinite, negative or zero).
pub(crate) fn seconds(var: &str, value: &str, min: f64, max: f64, hint: &str) -> Result<Duration> {
    let range = || {
        format!(
            "give a number of seconds from {min} to {max} (at most {}), e.g. {var}=30 or \
             {var}=0.5{hint}",
            human_secs(max)
        )
    };
    let secs: f64 = match value.trim().parse() {
        Ok(s) => s,
        Err(_) => return Err(bad(var, value, format!("not a number; {}", range()))),
    };
    let why = if secs.is_nan() {
        "not a number"
    } else if secs.is_infinite() {
        "infinite"
    } else if secs < 0.0 {
        "negative"
    } else if secs < min {
        if secs == 0.0 {
            "zero"
        } else {
            "too small"
        }
    } else if secs > max {
        "too large"
    } else {
        return Duration::try_from_secs_f64(secs)
            .map_err(|e| bad(var, value, format!("{e}; {}", range())));
    };
    Err(bad(var, value, format!("{why}; {}", range())))
}

/// `max` seconds in the largest whole unit that fits (for messages).
fn human_secs(secs: f64) -> String {
    const DAY: f64 = 86_400.0;
    if secs >= DAY && (secs / DAY).fract() == 0.0 {
        format!("{} days", secs / DAY)
    } else if secs >= 3600.0 && (secs / 3600.0).fract() == 0.0 {
        format!("{} hours", secs / 3600.0)
    } else {
        format!("{secs} s")
    }
}

/// One of the listed words (case-insensitive); `choices` pairs each word
/// with its meaning for the message and the value it stands for.
pub(crate) fn choice<T: Copy>(var: &str, value: &str, choices: &[(&str, &str, T)]) -> Result<T> {
    let v = value.trim();
    if let Some((_, _, t)) = choices.iter().find(|(w, _, _)| w.eq_ignore_ascii_case(v)) {
        return Ok(*t);
    }
    let listed: Vec<String> = choices
        .iter()
        .filter(|(_, meaning, _)| !meaning.is_empty())
        .map(|(w, meaning, _)| format!("{w} ({meaning})"))
        .collect();
    Err(bad(var, value, format!("use {}", or_list(&listed))))
}

/// `a`, `a or b`, `a, b or c`.
pub(crate) fn or_list(items: &[String]) -> String {
    match items {
        [] => String::new(),
        [one] => one.clone(),
        [rest @ .., last] => format!("{} or {last}", rest.join(", ")),
    }
}

/// An on/off switch: `1`, `on`, `true`, `yes` or `0`, `off`, `false`, `no`.
pub(crate) fn switch(var: &str, value: &str) -> Result<bool> {
    choice(
        var,
        value,
        &[
            ("1", "on", true),
            ("on", "", true),
            ("true", "", true),
            ("yes", "", true),
            ("0", "off", false),
            ("off", "", false),
            ("false", "", false),
            ("no", "", false),
        ],
    )
}

/// A free-form text (a host identity, a secret): at most `max` bytes and no
/// control characters (a newline or NUL pasted by accident); `hint` says
/// what to set instead.
pub(crate) fn text(var: &str, value: &str, max: usize, what: &str, hint: &str) -> Result<String> {
    if value.len() > max {
        return Err(bad(
            var,
            value,
            format!(
                "{} bytes, more than the {max} a {what} may have; {hint}",
                value.len()
            ),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(bad(
            var,
            value,
            format!("a {what} cannot contain control characters (newlines, tabs, NUL); {hint}"),
        ));
    }
    Ok(value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(e: Error) -> String {
        match e {
            Error::Config { reason, .. } => reason,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn whole_numbers_say_what_is_wrong() {
        let w = |v| whole("X", v, 1, 16, "streams", "");
        assert_eq!(w(" 4 ").unwrap(), 4);
        assert!(reason(w("0").unwrap_err()).starts_with("too small"));
        assert!(reason(w("17").unwrap_err()).starts_with("too large"));
        assert!(reason(w("-1").unwrap_err()).starts_with("a negative number"));
        assert!(reason(w("99999999999999999999999").unwrap_err()).starts_with("too large"));
        assert!(reason(w("1.5").unwrap_err()).starts_with("not a whole number"));
        assert!(reason(w("1e3").unwrap_err()).starts_with("not a whole number"));
        assert!(reason(w("NaN").unwrap_err()).starts_with("not a whole number"));
        let r = reason(w("four").unwrap_err());
        assert!(r.starts_with("not a number"), "{r}");
        assert!(r.contains("from 1 to 16") && r.contains("X=1"), "{r}");
    }

    #[test]
    fn seconds_refuse_what_a_duration_cannot_hold() {
        let s = |v| seconds("T", v, 0.001, 1e6, "");
        assert_eq!(s("0.5").unwrap(), Duration::from_millis(500));
        assert_eq!(s("1e3").unwrap(), Duration::from_secs(1000));
        for (v, why) in [
            ("1e300", "too large"),
            ("inf", "infinite"),
            ("-inf", "infinite"),
            ("NaN", "not a number"),
            ("-1", "negative"),
            ("0", "zero"),
            ("1e-9", "too small"),
            ("soon", "not a number"),
        ] {
            let r = reason(s(v).unwrap_err());
            assert!(r.starts_with(why), "{v}: {r}");
        }
    }

    #[test]
    fn long_values_are_shortened_in_messages() {
        let long = "x".repeat(10_000);
        match bad("V", &long, "no") {
            Error::Config { value, .. } => assert!(value.ends_with("(10000 bytes)"), "{value}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn switches_and_choices() {
        assert!(switch("C", "ON").unwrap());
        assert!(!switch("C", "0").unwrap());
        let r = reason(switch("C", "maybe").unwrap_err());
        assert_eq!(r, "use 1 (on) or 0 (off)");
        assert_eq!(or_list(&["a".into(), "b".into(), "c".into()]), "a, b or c");
    }
}
