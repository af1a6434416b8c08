//! JSON text written by a JavaScript engine's `JSON.stringify` (or a model), read with serde_json.
//!
//! JS strings are UTF-16 and may hold a lone surrogate (text cut inside an emoji with
//! `slice`, a stream split between the halves of a pair). `JSON.stringify` writes one as a
//! `\udXXX` escape, which serde_json refuses as malformed; the same string passed as a string
//! arrives with U+FFFD in its place. Read here, it gets U+FFFD as well, so a valid JS value
//! is never reported as malformed JSON.

use std::borrow::Cow;

/// `text` ready for `serde_json::from_str`: with lone surrogate escapes written as U+FFFD.
/// Well-formed text is returned as it is, after one scan of its bytes for backslashes.
pub(crate) fn well_formed(text: &str) -> Cow<'_, str> {
    without_lone_surrogates(text).map_or(Cow::Borrowed(text), Cow::Owned)
}

/// `text` with each `\uXXXX` escape of a lone surrogate replaced by `\ufffd`; `None` when
/// it has none. Backslashes in JSON text only begin escapes, so a scan from the start finds
/// every escape and never reads an escaped backslash as the start of one.
fn without_lone_surrogates(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let unit = |at: usize| -> Option<u16> {
        if bytes.get(at + 1) != Some(&b'u') {
            return None;
        }
        u16::from_str_radix(text.get(at + 2..at + 6)?, 16).ok()
    };
    let (mut fixed, mut copied, mut at) = (String::new(), 0, 0);
    while at < bytes.len() {
        if bytes[at] != b'\\' {
            at += 1;
            continue;
        }
        match unit(at) {
            Some(0xD800..=0xDBFF) if matches!(unit(at + 6).filter(|_| bytes.get(at + 6) == Some(&b'\\')), Some(0xDC00..=0xDFFF)) => at += 12,
            Some(0xD800..=0xDFFF) => {
                fixed.push_str(&text[copied..at]);
                fixed.push_str("\\ufffd");
                at += 6;
                copied = at;
            }
            // Any other escape: its second character is never the start of another.
            _ => at += 2,
        }
    }
    (copied > 0).then(|| fixed + &text[copied..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn from_js_json(text: &str) -> serde_json::Result<Value> {
        serde_json::from_str(&well_formed(text))
    }

    #[test]
    fn lone_surrogates_read_as_replacement_characters() {
        // What JSON.stringify writes for "Hi " + "🌍".slice(0, 1), and for the other half.
        assert_eq!(from_js_json(r#"{"text":"Hi \ud83c"}"#).unwrap(), json!({ "text": "Hi \u{fffd}" }));
        assert_eq!(from_js_json(r#"["\udf0d!", "\udf0d\ud83c"]"#).unwrap(), json!(["\u{fffd}!", "\u{fffd}\u{fffd}"]));
        // A key too.
        assert_eq!(from_js_json(r#"{"\ud800":1}"#).unwrap(), json!({ "\u{fffd}": 1 }));
    }

    #[test]
    fn pairs_and_other_escapes_are_read_as_they_are() {
        assert_eq!(from_js_json(r#""\ud83c\udf0d \u0041 \\ud800 \"""#).unwrap(), json!("🌍 A \\ud800 \""));
        // An escaped backslash before `ud800` is text, not an escape: nothing to replace, and
        // broken JSON stays an error.
        assert_eq!(without_lone_surrogates(r#""\\ud800""#), None);
        assert!(from_js_json(r#"{"a":"#).is_err());
    }
}
