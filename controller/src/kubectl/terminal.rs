//! Text for a terminal from values of API objects.
//!
//! Names, keys and messages come from objects that others write: a ResourceSlice,
//! a pod's status. Printed as they are, a newline in one forges a line of a table,
//! and an escape sequence moves the cursor, recolours or clears the screen. Every
//! value that reaches text output passes through [`escape`]; `-o json` is escaped by
//! the JSON encoder already.

use std::borrow::Cow;
use std::fmt::Write;

/// `value` with every character that could change what a terminal shows written as
/// an escape, the way Rust writes them (`\n`, `\u{1b}`): C0 and C1 controls, DEL,
/// the line and paragraph separators, and the bidirectional controls that reorder
/// what follows them. A backslash is doubled, so an escape in the output always
/// means the character. Other text is unchanged (and not copied).
pub(crate) fn escape(value: &str) -> Cow<'_, str> {
    if !value.chars().any(needs_escape) {
        return Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len().saturating_add(8));
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c == '\\'
        || c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' // line and paragraph separators
            | '\u{061c}' | '\u{200e}' | '\u{200f}' // bidi marks
            | '\u{202a}'..='\u{202e}' // bidi embeddings and overrides
            | '\u{2066}'..='\u{2069}' // bidi isolates
        )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_are_borrowed() {
        for v in [
            "dgx-h100-a",
            "pci0000:17",
            "0/8 nodes are available: 1 Insufficient",
        ] {
            assert!(matches!(escape(v), Cow::Borrowed(_)), "{v}");
        }
        assert_eq!(escape("grüße, 東京"), "grüße, 東京");
    }

    #[test]
    fn controls_are_written_as_escapes() {
        assert_eq!(escape("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(escape("\u{1b}[31mred\u{1b}[0m"), "\\u{1b}[31mred\\u{1b}[0m");
        assert_eq!(escape("\u{0}\u{7f}\u{9b}"), "\\u{0}\\u{7f}\\u{9b}");
        assert_eq!(
            escape("a\u{202e}b\u{2066}c\u{2028}"),
            "a\\u{202e}b\\u{2066}c\\u{2028}"
        );
        assert_eq!(escape("C:\\x\\n"), "C:\\\\x\\\\n");
        for v in ["x\n\u{1b}]0;title\u{7}", "\u{85}\u{2029}\u{200f}"] {
            let e = escape(v);
            assert!(!e.chars().any(needs_escape_but_backslash), "{e}");
        }
    }

    fn needs_escape_but_backslash(c: char) -> bool {
        c != '\\' && needs_escape(c)
    }
}
