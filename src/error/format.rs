//! The traceback text of an error chain, shaped like Python's: the root cause first,
//! each link's frames outermost first ("most recent call last"), links joined by
//! "The above exception was the direct cause of the following exception:".

use std::fmt::Write;

use super::{Error, Frame};

/// The separator Python prints between a cause and the error it caused.
pub const CAUSE_SEPARATOR: &str =
    "\nThe above exception was the direct cause of the following exception:\n\n";

/// The full traceback of `error` and its causes.
pub fn traceback(error: &Error) -> String {
    let mut out = String::new();
    write_chain(&mut out, error, "");
    out
}

/// A chain longer than this prints [`CHAIN_ENDS`] links at each end: a failure passed
/// down a pipeline of thousands of invocations is one link per invocation, and
/// megabytes of near-identical links would bury the two that matter (the root cause,
/// printed first, and the error waited on, printed last).
pub const CHAIN_PRINTED: usize = 2 * CHAIN_ENDS;
/// The links printed at each end of a chain longer than [`CHAIN_PRINTED`].
pub const CHAIN_ENDS: usize = 32;

/// The related errors printed (the first ones), as Python's `max_group_width`.
pub const RELATED_PRINTED: usize = 15;

fn write_chain(out: &mut String, error: &Error, indent: &str) {
    let links: Vec<&Error> = error.chain().collect();
    let n = links.len();
    let skipped = if n > CHAIN_PRINTED {
        CHAIN_ENDS..n - CHAIN_ENDS
    } else {
        0..0
    };
    for (i, link) in links.iter().rev().enumerate() {
        if skipped.contains(&i) && i != skipped.start {
            continue;
        }
        if i > 0 {
            for line in CAUSE_SEPARATOR.lines() {
                push_line(out, indent, line);
            }
        }
        if i == skipped.start && !skipped.is_empty() {
            push_line(
                out,
                indent,
                &format!(
                    "[... {} more links of this chain of {n} left out (ndx_error_cause walks them all) ...]",
                    skipped.len()
                ),
            );
            continue;
        }
        write_link(out, link, indent);
    }
}

fn write_link(out: &mut String, error: &Error, indent: &str) {
    let frames = error.frames();
    if !frames.is_empty() {
        push_line(out, indent, "Traceback (most recent call last):");
        for frame in frames.iter().rev() {
            push_line(out, indent, &frame_line(frame));
        }
    }
    if let (Some(op), Some(seq)) = (error.op(), error.sequence()) {
        let sample = error
            .sample()
            .map_or_else(String::new, |s| format!(", batch sample {s}"));
        push_line(
            out,
            indent,
            &format!("  in invocation #{seq} of operator '{op}'{sample}"),
        );
    }
    push_line(
        out,
        indent,
        &format!("{}: {}", error.kind().name(), error.message()),
    );
    let related = error.related();
    for (i, rel) in related.iter().take(RELATED_PRINTED).enumerate() {
        push_line(
            out,
            indent,
            &format!(
                "+---------------- {} of {} ----------------",
                i + 1,
                related.len()
            ),
        );
        let nested = format!("{indent}| ");
        write_chain(out, rel, &nested);
    }
    if related.len() > RELATED_PRINTED {
        // As Python prints an exception group wider than `max_group_width`.
        push_line(out, indent, "+---------------- ... ----------------");
        let more = related.len() - RELATED_PRINTED;
        let s = if more == 1 { "" } else { "s" };
        push_line(
            out,
            indent,
            &format!("| and {more} more exception{s} (ndx_error_related reads them all)"),
        );
    }
    if !related.is_empty() {
        push_line(out, indent, "+------------------------------------");
    }
}

/// One frame as Python prints it: `  File "app.c", line 41, in main` (without the
/// line when it is unknown: 0).
pub fn frame_line(frame: &Frame) -> String {
    let function = frame.function().unwrap_or("<unknown>");
    match frame.file() {
        Some(file) => {
            let mut s = format!("  File \"{file}\"");
            if frame.line() > 0 {
                let _ = write!(s, ", line {}", frame.line());
            }
            if frame.line() > 0 && frame.column() > 0 {
                let _ = write!(s, ", column {}", frame.column());
            }
            let _ = write!(s, ", in {function}");
            s
        }
        None if frame.ip() != 0 => format!("  At 0x{:x}, in {function}", frame.ip()),
        None => format!("  In {function}"),
    }
}

fn push_line(out: &mut String, indent: &str, line: &str) {
    out.push_str(indent);
    out.push_str(line);
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn an_unknown_line_is_left_out_not_printed_as_line_0() {
        use crate::error::{Frame, FrameOrigin};
        let at = |line| {
            frame_line(&Frame::new(
                Some("f"),
                Some("a.py"),
                line,
                3,
                0,
                FrameOrigin::Host,
            ))
        };
        assert_eq!(at(0), "  File \"a.py\", in f");
        assert_eq!(at(12), "  File \"a.py\", line 12, column 3, in f");
    }

    #[test]
    fn root_cause_prints_first_with_python_separator() {
        let e = Error::new(ErrorKind::Runtime, "outer failed").with_cause(Error::value("root bad"));
        let text = traceback(&e);
        let root = text.find("ValueError: root bad").expect("root present");
        let sep = text
            .find("direct cause of the following exception")
            .expect("sep");
        let outer = text.find("RuntimeError: outer failed").expect("outer");
        assert!(root < sep && sep < outer, "{text}");
        assert!(
            !text.contains("Traceback"),
            "no frames, no traceback header: {text}"
        );
    }

    /// A chain of `n` links "link 0" (the root cause) to "link n-1".
    fn chain_of(n: usize) -> Error {
        (1..n).fold(Error::value("link 0"), |cause, k| {
            Error::new(ErrorKind::Runtime, format!("link {k}")).with_cause(cause)
        })
    }

    fn printed_links(text: &str) -> Vec<usize> {
        text.lines()
            .filter_map(|l| l.split_once(": link ").map(|(_, k)| k.parse().unwrap()))
            .collect()
    }

    #[test]
    fn a_long_chain_prints_its_ends_and_says_how_many_links_it_left_out() {
        // As `ndx_error_format`'s documentation says.
        assert_eq!((CHAIN_PRINTED, CHAIN_ENDS, RELATED_PRINTED), (64, 32, 15));
        let text = traceback(&chain_of(CHAIN_PRINTED));
        assert_eq!(printed_links(&text), (0..CHAIN_PRINTED).collect::<Vec<_>>());
        assert!(!text.contains("left out"), "{text}");

        let n = 1000;
        let text = traceback(&chain_of(n));
        let mut expected: Vec<usize> = (0..CHAIN_ENDS).collect();
        expected.extend(n - CHAIN_ENDS..n);
        assert_eq!(printed_links(&text), expected);
        let note = format!(
            "[... {} more links of this chain of {n} left out (ndx_error_cause walks them all) ...]",
            n - CHAIN_PRINTED
        );
        let at = text.find(&note).expect("the note");
        // Between two separators, after the last root-side link.
        let before = &text[..at];
        assert!(before.ends_with(CAUSE_SEPARATOR), "{before}");
        assert!(before.contains(&format!("RuntimeError: link {}\n", CHAIN_ENDS - 1)));
        assert!(text[at..].starts_with(&format!("{note}\n{CAUSE_SEPARATOR}")));
        assert_eq!(text.matches("direct cause").count(), CHAIN_PRINTED);
    }

    #[test]
    fn a_wide_group_prints_its_first_fifteen_and_counts_the_rest() {
        let group = |n: usize| {
            Error::new(ErrorKind::Runtime, "group")
                .with_related((0..n).map(|k| Error::value(format!("member {k}"))))
        };
        let text = traceback(&group(RELATED_PRINTED));
        assert!(
            text.contains("member 14") && !text.contains("more exception"),
            "{text}"
        );
        let text = traceback(&group(1000));
        assert!(
            text.contains(
                "+---------------- 15 of 1000 ----------------\n| ValueError: member 14\n"
            ),
            "{text}"
        );
        assert!(!text.contains("member 15"), "{text}");
        assert!(
            text.ends_with(
                "+---------------- ... ----------------\n\
                 | and 985 more exceptions (ndx_error_related reads them all)\n\
                 +------------------------------------\n"
            ),
            "{text}"
        );
        let text = traceback(&group(RELATED_PRINTED + 1));
        assert!(
            text.contains("| and 1 more exception (ndx_error_related"),
            "{text}"
        );
    }

    #[test]
    fn related_errors_are_nested_with_a_bar() {
        let e = Error::new(ErrorKind::Check, "2 checks failed")
            .with_related([Error::value("first"), Error::value("second")]);
        let text = traceback(&e);
        assert!(text.contains("+---------------- 1 of 2"), "{text}");
        assert!(text.contains("| ValueError: first"), "{text}");
        assert!(text.contains("| ValueError: second"), "{text}");
    }
}
