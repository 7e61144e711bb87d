//! A header `regex` (RE2, matched against the whole value, as Flagger and Istio read it) as
//! Dubbo condition values: a comma-separated list of globs, any of which may match, where a
//! glob is `lit`, `lit*`, `*lit` or `p*s` (Dubbo's `UrlUtils.isMatchGlobPattern`: the value
//! starts with what is before the one wildcard and ends with what is after it, and the two may
//! overlap). A regex is translated only when the globs match exactly the values the regex does;
//! otherwise the reason is returned.
//!
//! The regex is read by the regex crate's own parser (`regex-syntax`): the syntax tree says what
//! was written (so character classes, flags and repetitions are refused by name), and the HIR
//! says what it matches (alternatives, literals with their escapes resolved, anchors), so no
//! hand parsing decides which values a regex takes.

use regex_syntax::ast::{self, Ast};
use regex_syntax::hir::{self, Class, Dot, Hir, HirKind, Look};

/// The longest regex read (the Canary schema's limit).
const MAX_LEN: usize = 1024;
/// How deep groups, alternations and repetitions may nest.
const NEST_LIMIT: u32 = 16;
/// The most globs one regex may become (after expanding `a|b`, which the HIR holds as `[ab]`).
const MAX_GLOBS: usize = 64;

/// What can be said, after a refusal.
const SUPPORTED: &str = "supported: a literal or alternatives of literals, each optionally with \
     a leading or a trailing `.*` (`insider|beta-.*` becomes `insider,beta-*`), or `p.*s` when \
     no non-empty end of p begins s; `^`, `$` and groups around the whole or an alternation are \
     allowed";

/// Characters of the condition syntax a value cannot hold: separators, globs, ranges (`1~9`);
/// a leading `$` (a parameter reference) is checked apart.
pub(super) fn condition_syntax(c: char) -> bool {
    // `>`: after the `=` of `h=v` it would read as the `=>` between `when` and `then`.
    c.is_whitespace() || matches!(c, '&' | '!' | '=' | ',' | '*' | '~' | '>')
}

/// `regex` as the Dubbo globs matching exactly the values its full match takes, or why not.
pub(super) fn globs(regex: &str) -> Result<Vec<String>, String> {
    translate(regex)
        .map_err(|why| format!("regex {regex:?} cannot be said to Dubbo SDKs: {why}; {SUPPORTED}"))
}

fn translate(regex: &str) -> Result<Vec<String>, String> {
    if regex.len() > MAX_LEN {
        return Err(format!("it is over {MAX_LEN} characters"));
    }
    let ast = ast::parse::ParserBuilder::new()
        .nest_limit(NEST_LIMIT)
        .build()
        .parse(regex)
        .map_err(|e| unparsed(e.kind(), e.span()))?;
    written(regex, &ast)?;
    let hir = hir::translate::TranslatorBuilder::new()
        .utf8(true)
        .build()
        .translate(regex, &ast)
        .map_err(|e| unparsed(e.kind(), e.span()))?;
    let mut out: Vec<String> = Vec::new();
    for alternative in expand(&hir)? {
        let glob = glob(&alternative)?;
        if !out.contains(&glob) {
            out.push(glob);
        }
    }
    if out.is_empty() {
        return Err("it matches no value".to_owned());
    }
    Ok(out)
}

/// The parser's reason (not its multi-line rendering of the pattern).
fn unparsed(kind: &dyn std::fmt::Display, span: &ast::Span) -> String {
    format!(
        "it does not parse: {kind} (at offset {})",
        span.start.offset
    )
}

/// Refuses what was written that no glob can say, by name: classes, flags that change what a
/// character matches, repetitions other than `.*`, a lone `.`, assertions other than `^`/`$`.
fn written(regex: &str, ast: &Ast) -> Result<(), String> {
    let text = |span: &ast::Span| {
        regex
            .get(span.start.offset..span.end.offset)
            .unwrap_or_default()
            .to_owned()
    };
    match ast {
        Ast::Empty(_) | Ast::Literal(_) => Ok(()),
        Ast::Flags(set) => flags(&set.flags, &text(&set.span)),
        Ast::Dot(span) => Err(format!(
            "`.` at offset {} matches one character of any kind, which has no glob (only `.*` \
             has: the glob's wildcard)",
            span.start.offset
        )),
        Ast::Assertion(assertion) => match assertion.kind {
            ast::AssertionKind::StartLine
            | ast::AssertionKind::EndLine
            | ast::AssertionKind::StartText
            | ast::AssertionKind::EndText => Ok(()),
            _ => Err(format!(
                "the assertion `{}` has no glob (only `^` and `$`, which a full match implies)",
                text(&assertion.span)
            )),
        },
        Ast::ClassUnicode(_) | Ast::ClassPerl(_) | Ast::ClassBracketed(_) => Err(format!(
            "the character class `{}` has no glob (a glob's only pattern is its one `*`)",
            text(ast.span())
        )),
        Ast::Repetition(rep) => {
            let dot = matches!(*rep.ast, Ast::Dot(_));
            if dot && rep.op.kind == ast::RepetitionKind::ZeroOrMore && rep.greedy {
                Ok(())
            } else {
                Err(format!(
                    "the repetition `{}` has no glob (only `.*`, any value, is the glob's `*`; \
                     `.+`, `?`, `{{n,m}}` and repeated literals or groups are not)",
                    text(&rep.span)
                ))
            }
        }
        Ast::Group(group) => {
            if let ast::GroupKind::NonCapturing(set) = &group.kind {
                flags(set, &text(&group.span))?;
            }
            written(regex, &group.ast)
        }
        Ast::Alternation(alt) => alt.asts.iter().try_for_each(|a| written(regex, a)),
        Ast::Concat(concat) => concat.asts.iter().try_for_each(|a| written(regex, a)),
    }
}

/// Flags that keep the meaning of literals, `.*`, `^` and `$` on a header value: `s` and `x`
/// either way, the others only turned off (their default), `u` only on.
fn flags(set: &ast::Flags, text: &str) -> Result<(), String> {
    let mut negated = false;
    for item in &set.items {
        match item.kind {
            ast::FlagsItemKind::Negation => negated = true,
            ast::FlagsItemKind::Flag(flag) => {
                let fine = match flag {
                    ast::Flag::DotMatchesNewLine | ast::Flag::IgnoreWhitespace => true,
                    ast::Flag::Unicode => !negated,
                    ast::Flag::CaseInsensitive
                    | ast::Flag::MultiLine
                    | ast::Flag::SwapGreed
                    | ast::Flag::CRLF => negated,
                };
                if !fine {
                    return Err(if flag == ast::Flag::CaseInsensitive {
                        format!(
                            "case-insensitive matching (`{text}`) has no glob (Dubbo compares \
                             values case-sensitively)"
                        )
                    } else {
                        format!("the flags `{text}` are not supported (only `s` and `x`)")
                    });
                }
            }
        }
    }
    Ok(())
}

/// One piece of an alternative, in order.
#[derive(Debug, Clone, PartialEq)]
enum Piece {
    Literal(Vec<u8>),
    /// `.*`: any value (a header value holds no newline, so `.` and `(?s).` agree).
    Any,
    Start,
    End,
}

/// The HIR as a list of alternatives, each a sequence of pieces: concatenations multiplied out,
/// alternations (and the classes the HIR makes of `a|b`) listed, groups dropped.
fn expand(hir: &Hir) -> Result<Vec<Vec<Piece>>, String> {
    let too_many =
        || format!("it makes more than {MAX_GLOBS} globs once its alternatives are listed");
    match hir.kind() {
        HirKind::Empty => Ok(vec![vec![]]),
        HirKind::Literal(hir::Literal(bytes)) => Ok(vec![vec![Piece::Literal(bytes.to_vec())]]),
        HirKind::Class(Class::Unicode(class)) => {
            // Only `a|b|...` gets here: written classes were refused.
            let mut out = Vec::new();
            for range in class.ranges() {
                for c in range.start()..=range.end() {
                    if out.len() == MAX_GLOBS {
                        return Err(too_many());
                    }
                    out.push(vec![Piece::Literal(c.to_string().into_bytes())]);
                }
            }
            Ok(out)
        }
        HirKind::Class(Class::Bytes(_)) => Err("it matches bytes, not text".to_owned()),
        HirKind::Look(Look::Start) => Ok(vec![vec![Piece::Start]]),
        HirKind::Look(Look::End) => Ok(vec![vec![Piece::End]]),
        HirKind::Look(look) => Err(format!("the assertion {look:?} has no glob")),
        HirKind::Repetition(rep) => {
            let any =
                *rep.sub == Hir::dot(Dot::AnyCharExceptLF) || *rep.sub == Hir::dot(Dot::AnyChar);
            if any && rep.min == 0 && rep.max.is_none() {
                Ok(vec![vec![Piece::Any]])
            } else {
                Err("a repetition other than `.*` has no glob".to_owned())
            }
        }
        HirKind::Capture(capture) => expand(&capture.sub),
        HirKind::Concat(subs) => {
            let mut out = vec![vec![]];
            for sub in subs {
                let tails = expand(sub)?;
                if out.len().saturating_mul(tails.len()) > MAX_GLOBS {
                    return Err(too_many());
                }
                out = out
                    .iter()
                    .flat_map(|head| {
                        tails.iter().map(move |tail| {
                            let mut both: Vec<Piece> = head.clone();
                            both.extend(tail.iter().cloned());
                            both
                        })
                    })
                    .collect();
            }
            Ok(out)
        }
        HirKind::Alternation(subs) => {
            let mut out = Vec::new();
            for sub in subs {
                out.extend(expand(sub)?);
                if out.len() > MAX_GLOBS {
                    return Err(too_many());
                }
            }
            Ok(out)
        }
    }
}

/// One alternative as a glob matching exactly its values.
fn glob(pieces: &[Piece]) -> Result<String, String> {
    // Anchors at the ends say nothing in a full match; elsewhere they are refused (`a^b` matches
    // nothing, `.*^a` is `a`: not worth the reading).
    let first = pieces
        .iter()
        .position(|p| *p != Piece::Start)
        .unwrap_or(pieces.len());
    let last = pieces
        .iter()
        .rposition(|p| *p != Piece::End)
        .map_or(first, |i| i + 1);
    let inner = pieces.get(first..last.max(first)).unwrap_or_default();
    let mut shape: Vec<Piece> = Vec::with_capacity(inner.len());
    for piece in inner {
        match (shape.last_mut(), piece) {
            (_, Piece::Start | Piece::End) => {
                return Err("`^` or `$` inside the value (only at its ends) has no glob".to_owned());
            }
            (Some(Piece::Literal(text)), Piece::Literal(more)) => text.extend_from_slice(more),
            (Some(Piece::Any), Piece::Any) => {}
            _ => shape.push(piece.clone()),
        }
    }
    let text = |bytes: &[u8]| -> Result<String, String> {
        let text = String::from_utf8(bytes.to_vec())
            .map_err(|_| "a literal is not valid UTF-8".to_owned())?;
        if text.contains(condition_syntax) {
            return Err(format!(
                "the literal {text:?} holds condition syntax (whitespace or any of & ! = , * ~ >)"
            ));
        }
        Ok(text)
    };
    let leading = |text: String| {
        if text.starts_with('$') {
            Err(format!(
                "the literal {text:?} starts with `$` (a parameter reference in a condition)"
            ))
        } else {
            Ok(text)
        }
    };
    match shape.as_slice() {
        [] => Err("an empty alternative (the empty value) cannot be a condition value".to_owned()),
        [Piece::Any] => Err(
            "`.*` alone matches every call, where an A/B match selects a cohort; leave the \
             header out instead"
                .to_owned(),
        ),
        [Piece::Literal(l)] => leading(text(l)?),
        [Piece::Literal(l), Piece::Any] => Ok(format!("{}*", leading(text(l)?)?)),
        [Piece::Any, Piece::Literal(l)] => Ok(format!("*{}", text(l)?)),
        [Piece::Literal(p), Piece::Any, Piece::Literal(s)] => {
            let (p, s) = (leading(text(p)?)?, text(s)?);
            // The glob takes a value that starts with p and ends with s even when they share
            // characters (`ab*bc` takes `abc`); the regex wants p, then s after it.
            let overlap = (1..=p.len().min(s.len())).find(|&k| {
                p.as_bytes()
                    .ends_with(s.as_bytes().get(..k).unwrap_or_default())
            });
            match overlap {
                Some(k) => Err(format!(
                    "as the glob `{p}*{s}` it would also match `{p}{}`, where the end of {p:?} \
                     begins {s:?} (a Dubbo glob's prefix and suffix may overlap), which the \
                     regex does not",
                    String::from_utf8_lossy(s.as_bytes().get(k..).unwrap_or_default())
                )),
                None => Ok(format!("{p}*{s}")),
            }
        }
        _ if shape.iter().filter(|p| **p == Piece::Any).count() > 1 => Err(
            "an alternative with more than one `.*` (a match anywhere in the value, like \
             `.*Firefox.*`) has no glob: a Dubbo glob has one wildcard"
                .to_owned(),
        ),
        _ => Err("this alternative has no glob".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dubbo's reading of a condition value: any of its comma-separated globs.
    fn dubbo_matches(value_list: &str, value: &str) -> bool {
        value_list
            .split(',')
            .any(|pattern| dubbo_cp_domain::rules::condition::glob(pattern, value))
    }

    fn said(regex: &str) -> String {
        globs(regex)
            .unwrap_or_else(|e| panic!("{regex}: {e}"))
            .join(",")
    }

    #[test]
    fn each_supported_shape_becomes_its_globs() {
        for (regex, expected) in [
            ("insider", "insider"),
            ("^insider$", "insider"),
            (r"\Ainsider\z", "insider"),
            ("insider|beta|(a|b)", "insider,beta,a,b"),
            ("(insider|beta)", "insider,beta"),
            ("^(?:insider|beta)$", "insider,beta"),
            ("^insider$|^beta$", "insider,beta"),
            ("(?P<who>insider)", "insider"),
            ("beta-.*", "beta-*"),
            ("(?s)beta-.*", "beta-*"),
            (".*@example\\.com", "*@example.com"),
            ("insider|beta-.*", "insider,beta-*"),
            ("insider|beta-.*|.*-qa", "insider,beta-*,*-qa"),
            // The HIR lifts the common `.*` out: `.*(?:a|b)`; listed again.
            (".*-qa|.*-dev", "*-qa,*-dev"),
            ("^v1\\..*|^v2\\..*", "v1.*,v2.*"),
            ("ab.*cd", "ab*cd"),
            ("app-.*_canary", "app-*_canary"),
            ("a.*.*", "a*"),
            ("(a|b)-x", "a-x,b-x"),
            ("insider|insider", "insider"),
            ("(?x) insider | beta ", "insider,beta"),
            ("x\\$y", "x$y"),
            (".*\\$y", "*$y"),
            ("caf\u{e9}", "caf\u{e9}"),
        ] {
            assert_eq!(said(regex), expected, "{regex}");
        }
    }

    /// Whatever is translated matches exactly the values the full match does: accepted shapes,
    /// and shapes refused because their globs would not (were they accepted, this would fail).
    #[test]
    fn the_globs_match_the_values_the_regex_does() {
        let regexes = [
            ("insider", true),
            ("insider|beta|(a|b)", true),
            ("beta-.*", true),
            (".*-qa", true),
            ("insider|beta-.*|.*-qa", true),
            (".*-qa|.*-dev", true),
            ("^(?:ab|b.*)$", true),
            ("ab.*cd", true),
            ("a.*b", true),
            ("abc.*d", true),
            ("(a|b).*(c|d)", true),
            ("(a|b)-(c|d)", true),
            ("a.*", true),
            (".*a", true),
            // Overlapping prefix and suffix.
            ("ab.*bc", false),
            ("ab.*ba", false),
            ("a.*a", false),
            ("abc.*bc", false),
            ("(a|b).*(a|b)", false),
            // Two wildcards, an empty alternative, everything.
            (".*b.*", false),
            ("a|", false),
            (".*", false),
        ];
        // Overlap cases among these: a value equal to a prefix or a suffix, or to both sharing
        // characters; the empty value.
        let tokens = [
            "", "a", "b", "c", "d", "-", "ab", "ba", "bc", "cd", "abc", "insider", "beta", "beta-",
            "7", "-qa", "-dev", "qa",
        ];
        let mut values = Vec::new();
        for x in tokens {
            for y in tokens {
                for z in tokens {
                    values.push(format!("{x}{y}{z}"));
                }
            }
        }
        values.sort();
        values.dedup();
        let mut compared = 0;
        for (regex, accepted) in regexes {
            let full =
                regex::Regex::new(&format!("^(?:{regex})$")).unwrap_or_else(|e| panic!("{e}"));
            let Ok(globs) = globs(regex).map(|g| g.join(",")) else {
                assert!(!accepted, "{regex} refused");
                continue;
            };
            for value in &values {
                assert_eq!(
                    dubbo_matches(&globs, value),
                    full.is_match(value),
                    "{regex} as {globs} on {value:?}"
                );
                compared += 1;
            }
        }
        assert!(compared > 50_000, "{compared}");
    }
}
