//! The condition grammar of Dubbo's condition router (`ConditionStateRouter`), for ConditionRoute
//! `conditions`: `method=sayHello & arguments[0]=x => host=10.0.0.1`.
//!
//! Dubbo splits a condition at its first `=>` into a `when` part (which requests) and a `then`
//! part (which providers they may reach), then tokenises each part with
//! `([&!=,]*)\s*([^&!=,\s]+)`: a run of separator characters, then a word. A word after `&` (or
//! after nothing) is a key; after `=` a value it must match, after `!=` a value it must not,
//! after `,` one more value for the operator before. Without `=>` the whole condition is the
//! `then` part; an empty or `true` `when` matches every request; an empty or `false` `then`
//! leaves no provider (the request is refused).
//!
//! Dubbo's regex scan silently skips what it cannot match (a trailing `=`, a doubled `==`), and a
//! key without a value never matches; either way the rule does nothing the author meant. This
//! parser accepts every condition Dubbo reads the same way and refuses the rest, saying where.

use std::fmt;

/// Dubbo's value pattern (`UrlUtils.isMatchGlobPattern`): `*` alone matches anything; else only
/// the last `*` is a wildcard, between a prefix and a suffix the value starts and ends with
/// (they may overlap: `a*a` matches `a`); an empty value matches only an empty pattern.
pub fn glob(pattern: &str, value: &str) -> bool {
    if pattern == "*" {
        return true;
    }
    if pattern.is_empty() || value.is_empty() {
        return pattern.is_empty() && value.is_empty();
    }
    match pattern.rfind('*') {
        None => value == pattern,
        Some(at) => value.starts_with(&pattern[..at]) && value.ends_with(&pattern[at + 1..]),
    }
}

/// One parsed condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteCondition {
    /// What a request must match; empty: every request.
    pub when: Vec<MatchClause>,
    /// What a provider must match; `None`: no provider (the consumer is refused).
    pub then: Option<Vec<MatchClause>>,
}

/// `key=a,b` / `key!=c`: the key's value must be one of `matches` (if any) and none of
/// `mismatches`. Values may hold `*` wildcards, `1~100` ranges and `$param` references; Dubbo
/// interprets them when it routes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MatchClause {
    pub key: String,
    pub matches: Vec<String>,
    pub mismatches: Vec<String>,
}

/// Why a condition does not parse; `column` counts characters from 1 in the whole condition.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message} at column {column}")]
pub struct ConditionError {
    pub column: usize,
    pub message: String,
}

const SEPARATORS: [char; 4] = ['&', '!', '=', ','];
const ARROW: &str = "=>";

/// Parses one condition.
pub fn parse_condition(text: &str) -> Result<RouteCondition, ConditionError> {
    if text.trim().is_empty() {
        return Err(ConditionError {
            column: 1,
            message: "a condition must not be empty".into(),
        });
    }
    let (when, then, then_offset) = match text.find(ARROW) {
        Some(i) => (&text[..i], &text[i + ARROW.len()..], i + ARROW.len()),
        None => ("", text, 0),
    };
    if let Some(second) = then.find(ARROW) {
        return Err(error(
            text,
            then_offset + second,
            "`=>` may appear only once",
        ));
    }
    let when = if when.trim() == "true" {
        Vec::new()
    } else {
        parse_part(text, when, 0)?
    };
    let then = if then.trim() == "false" || then.trim().is_empty() {
        None
    } else {
        Some(parse_part(text, then, then_offset)?)
    };
    Ok(RouteCondition { when, then })
}

/// A token of one part with its byte offset in the whole condition.
struct Token<'a> {
    separator: &'a str,
    at: usize,
    word: &'a str,
    word_at: usize,
}

/// Splits a part into (separator, word) pairs; a separator run without a word after it is an
/// error (Dubbo would skip it).
fn tokens<'a>(whole: &str, part: &'a str, offset: usize) -> Result<Vec<Token<'a>>, ConditionError> {
    let mut tokens = Vec::new();
    let mut rest = part;
    loop {
        let trimmed = rest.trim_start();
        if trimmed.is_empty() {
            return Ok(tokens);
        }
        let at = offset + (part.len() - trimmed.len());
        let separator_len = trimmed
            .find(|c: char| !SEPARATORS.contains(&c))
            .unwrap_or(trimmed.len());
        let separator = &trimmed[..separator_len];
        let after = trimmed[separator_len..].trim_start();
        let word_len = after
            .find(|c: char| SEPARATORS.contains(&c) || c.is_whitespace())
            .unwrap_or(after.len());
        if word_len == 0 {
            return Err(error(
                whole,
                at,
                format!("`{separator}` is not followed by a key or value"),
            ));
        }
        tokens.push(Token {
            separator,
            at,
            word: &after[..word_len],
            word_at: offset + (part.len() - after.len()),
        });
        rest = &after[word_len..];
    }
}

/// Which list of the current clause a `,` adds to.
#[derive(Clone, Copy)]
enum Values {
    Matches,
    Mismatches,
}

fn parse_part(whole: &str, part: &str, offset: usize) -> Result<Vec<MatchClause>, ConditionError> {
    let mut clauses: Vec<MatchClause> = Vec::new();
    // Where each clause's key first appears, for an error about it.
    let mut key_at: Vec<usize> = Vec::new();
    // Index of the clause values go to, and which of its lists `,` extends.
    let mut current: Option<usize> = None;
    let mut last: Option<Values> = None;
    for token in tokens(whole, part, offset)? {
        match token.separator {
            // A word after whitespace alone starts a new key, as in Dubbo (`a=1 b=2` is `a=1 & b=2`).
            "" | "&" => {
                check_key(whole, token.word_at, token.word)?;
                let index = match clauses.iter().position(|c| c.key == token.word) {
                    Some(index) => index,
                    None => {
                        clauses.push(MatchClause {
                            key: token.word.to_owned(),
                            matches: Vec::new(),
                            mismatches: Vec::new(),
                        });
                        key_at.push(token.word_at);
                        clauses.len() - 1
                    }
                };
                current = Some(index);
                last = None;
            }
            "=" | "!=" | "," => {
                let (Some(index), Some(clause)) =
                    (current, current.and_then(|i| clauses.get_mut(i)))
                else {
                    return Err(error(
                        whole,
                        token.at,
                        format!("`{}` needs a key before it", token.separator),
                    ));
                };
                let values = match token.separator {
                    "=" => Values::Matches,
                    "!=" => Values::Mismatches,
                    _ => last.ok_or_else(|| {
                        error(whole, token.at, "`,` must follow a value of `=` or `!=`")
                    })?,
                };
                let list = match values {
                    Values::Matches => &mut clause.matches,
                    Values::Mismatches => &mut clause.mismatches,
                };
                if !list.iter().any(|v| v == token.word) {
                    list.push(token.word.to_owned());
                }
                current = Some(index);
                last = Some(values);
            }
            other => {
                return Err(error(
                    whole,
                    token.at,
                    format!("unexpected `{other}` (expected `&`, `=`, `!=` or `,`)"),
                ));
            }
        }
    }
    if let Some((clause, at)) = clauses
        .iter()
        .zip(key_at)
        .find(|(c, _)| c.matches.is_empty() && c.mismatches.is_empty())
    {
        return Err(error(
            whole,
            at,
            format!(
                "`{}` has no value (write `{}=value` or `{}!=value`)",
                clause.key, clause.key, clause.key
            ),
        ));
    }
    Ok(clauses)
}

/// Keys Dubbo gives a meaning by form: `arguments[N]` and `attachments[name]`; any other word
/// names a URL parameter. Dubbo drops `consumer.` / `provider.` before matching.
fn check_key(whole: &str, at: usize, key: &str) -> Result<(), ConditionError> {
    let bare = key
        .strip_prefix("consumer.")
        .or_else(|| key.strip_prefix("provider."))
        .unwrap_or(key);
    let head = bare.split('.').next().unwrap_or(bare);
    if let Some(rest) = head.strip_prefix("arguments") {
        let index = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
        if !index.is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit())) {
            return Err(error(
                whole,
                at,
                format!("`{key}`: an argument key is `arguments[N]` with N a number"),
            ));
        }
    }
    if let Some(rest) = head.strip_prefix("attachments") {
        let name = rest.strip_prefix('[').and_then(|r| r.strip_suffix(']'));
        if name.is_none_or(str::is_empty) {
            return Err(error(
                whole,
                at,
                format!("`{key}`: an attachment key is `attachments[name]`"),
            ));
        }
    }
    Ok(())
}

fn error(whole: &str, byte_offset: usize, message: impl Into<String>) -> ConditionError {
    let column = whole
        .get(..byte_offset)
        .map_or(byte_offset, |before| before.chars().count())
        + 1;
    ConditionError {
        column,
        message: message.into(),
    }
}

/// The canonical text of a condition: spaced so that no value can run into an `=>`, and parsing
/// it again gives the same condition.
impl fmt::Display for RouteCondition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_clauses(f, &self.when)?;
        if !self.when.is_empty() {
            f.write_str(" ")?;
        }
        f.write_str("=> ")?;
        match &self.then {
            Some(then) => write_clauses(f, then),
            None => f.write_str("false"),
        }
    }
}

fn write_clauses(f: &mut fmt::Formatter<'_>, clauses: &[MatchClause]) -> fmt::Result {
    for (i, clause) in clauses.iter().enumerate() {
        if i > 0 {
            f.write_str(" & ")?;
        }
        f.write_str(&clause.key)?;
        if !clause.matches.is_empty() {
            write!(f, " = {}", clause.matches.join(", "))?;
        }
        if !clause.mismatches.is_empty() {
            write!(f, " != {}", clause.mismatches.join(", "))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clause(key: &str, matches: &[&str], mismatches: &[&str]) -> MatchClause {
        MatchClause {
            key: key.into(),
            matches: matches.iter().map(|s| s.to_string()).collect(),
            mismatches: mismatches.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn parsed(text: &str) -> RouteCondition {
        parse_condition(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn the_issue_example_parses_into_when_and_then() {
        assert_eq!(
            parsed("method=sayHello & arguments[0]=x => host=10.0.0.1"),
            RouteCondition {
                when: vec![
                    clause("method", &["sayHello"], &[]),
                    clause("arguments[0]", &["x"], &[])
                ],
                then: Some(vec![clause("host", &["10.0.0.1"], &[])]),
            }
        );
    }

    #[test]
    fn operators_alternatives_and_wildcards() {
        assert_eq!(
            parsed("method = sayHello,sayHi & host != 10.0.0.*, 10.1.* => region=hangzhou"),
            RouteCondition {
                when: vec![
                    clause("method", &["sayHello", "sayHi"], &[]),
                    clause("host", &[], &["10.0.0.*", "10.1.*"]),
                ],
                then: Some(vec![clause("region", &["hangzhou"], &[])]),
            }
        );
        // One key, both operators; `,` extends the operator just before it.
        assert_eq!(
            parsed("=> address=*:20880,*:20881!=10.0.0.1:20880"),
            RouteCondition {
                when: vec![],
                then: Some(vec![clause(
                    "address",
                    &["*:20880", "*:20881"],
                    &["10.0.0.1:20880"]
                )]),
            }
        );
        // Repeating a key adds to the same clause, as Dubbo's map does.
        assert_eq!(
            parsed("host=a & host=b & host!=c => x=1").when,
            vec![clause("host", &["a", "b"], &["c"])]
        );
        // Ranges, references and attachment keys are values and keys like any other.
        assert_eq!(
            parsed("attachments[user]=1~100 => host=$host").when,
            vec![clause("attachments[user]", &["1~100"], &[])]
        );
    }

    #[test]
    fn whitespace_is_free_even_across_lines() {
        let spaced = parsed("  method =  sayHello\n &\targuments[0] = x\n=>\n host = 10.0.0.1 ");
        assert_eq!(
            spaced,
            parsed("method=sayHello&arguments[0]=x=>host=10.0.0.1")
        );
        // A key after whitespace alone starts a new clause, as in Dubbo.
        assert_eq!(
            parsed("a=1 b=2 => c=3").when,
            vec![clause("a", &["1"], &[]), clause("b", &["2"], &[])]
        );
    }

    #[test]
    fn a_condition_may_have_only_one_side() {
        // No `=>`: the whole condition says which providers, for every request (Dubbo).
        assert_eq!(
            parsed("host=10.0.0.1"),
            RouteCondition {
                when: vec![],
                then: Some(vec![clause("host", &["10.0.0.1"], &[])])
            }
        );
        assert_eq!(parsed("=> host=10.0.0.1"), parsed("host=10.0.0.1"));
        assert_eq!(parsed("true => host=10.0.0.1"), parsed("host=10.0.0.1"));
        // Nothing (or `false`) after `=>`: matching requests reach no provider.
        for blocked in ["method=sayHello =>", "method=sayHello => false"] {
            assert_eq!(
                parsed(blocked),
                RouteCondition {
                    when: vec![clause("method", &["sayHello"], &[])],
                    then: None
                }
            );
        }
        assert_eq!(
            parsed("=>"),
            RouteCondition {
                when: vec![],
                then: None
            }
        );
    }

    #[test]
    fn invalid_conditions_say_what_and_where() {
        for (text, message, column) in [
            ("", "must not be empty", 1),
            ("   ", "must not be empty", 1),
            ("a=1 => b=2 => c=3", "`=>` may appear only once", 12),
            (
                "method= => host=a",
                "`=` is not followed by a key or value",
                7,
            ),
            ("method=a & => host=a", "`&` is not followed", 10),
            ("method==a => host=b", "unexpected `==`", 7),
            ("method=a && host=b => x=1", "unexpected `&&`", 10),
            ("method=a,,b => x=1", "unexpected `,,`", 9),
            ("method!a => x=1", "unexpected `!`", 7),
            ("=a => x=1", "`=` needs a key before it", 1),
            (",a => x=1", "`,` needs a key before it", 1),
            ("method,a => x=1", "`,` must follow a value", 7),
            ("method => host=a", "`method` has no value", 1),
            ("method=a & host => x=1", "`host` has no value", 12),
            ("arguments[a]=1 => x=1", "arguments[N]", 1),
            ("arguments=1 => x=1", "arguments[N]", 1),
            ("attachments[]=1 => x=1", "attachments[name]", 1),
            ("m=1 => consumer.arguments[x]=1", "arguments[N]", 8),
            ("é=1 => é=", "`=` is not followed", 9),
        ] {
            let err = parse_condition(text).unwrap_err();
            assert!(err.message.contains(message), "{text:?}: {err}");
            assert_eq!(err.column, column, "{text:?}: {err}");
        }
    }

    #[test]
    fn display_is_canonical_and_parses_back() {
        for text in [
            "method=sayHello & arguments[0]=x => host=10.0.0.1",
            "host=a,b!=c",
            "method=a =>",
            "x= > => y=1",
            "a=1 b=2 => c=3",
            "=>",
        ] {
            let condition = parsed(text);
            let canonical = condition.to_string();
            assert_eq!(parsed(&canonical), condition, "{text:?} -> {canonical:?}");
        }
        assert_eq!(
            parsed("method=sayHello&host!=a,b=>region=hz").to_string(),
            "method = sayHello & host != a, b => region = hz"
        );
        assert_eq!(parsed("m=a =>").to_string(), "m = a => false");
    }
}
