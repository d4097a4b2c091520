//! The tokens of a Rust source file that the import graph needs: identifiers, `::`,
//! punctuation and string literals (for `#[path]`), with comments dropped; and the `use`
//! trees read from them.

#[derive(Clone, Debug, PartialEq)]
pub(super) enum Tok {
    Ident(String),
    Str(String),
    PathSep,
    Punct(char),
}

/// Tokens of `text` with their line numbers; comments dropped, literals kept as `Str`.
pub(super) fn lex(text: &str) -> Vec<(Tok, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let at = |j: usize| chars.get(j).copied().unwrap_or('\0');
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == '/' {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
            }
        } else if c == '"' {
            let start = line;
            let (s, next) = quoted(&chars, i + 1, &mut line);
            out.push((Tok::Str(s), start));
            i = next;
        } else if c == '\'' {
            if at(i + 1) == '\\' {
                // An escaped char literal: to the closing quote.
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == '\'' {
                i += 3;
            } else {
                // A lifetime or label: the quote and its name.
                i += 1;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
            }
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while at(i).is_alphanumeric() || at(i) == '_' {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let raw_prefix = matches!(word.as_str(), "r" | "br" | "cr");
            if raw_prefix
                && (at(i) == '"' || (at(i) == '#' && (at(i + 1) == '"' || at(i + 1) == '#')))
            {
                let begin = line;
                let mut hashes = 0;
                while at(i) == '#' {
                    hashes += 1;
                    i += 1;
                }
                i += 1; // the opening quote
                let body = i;
                loop {
                    if i >= chars.len() {
                        break;
                    }
                    if chars[i] == '"' && (1..=hashes).all(|h| at(i + h) == '#') {
                        break;
                    }
                    if chars[i] == '\n' {
                        line += 1;
                    }
                    i += 1;
                }
                out.push((
                    Tok::Str(chars[body..i.min(chars.len())].iter().collect()),
                    begin,
                ));
                i += 1 + hashes;
            } else if word == "r" && at(i) == '#' && (at(i + 1).is_alphabetic() || at(i + 1) == '_')
            {
                // A raw identifier, r#name.
                let start = i + 1;
                i = start;
                while at(i).is_alphanumeric() || at(i) == '_' {
                    i += 1;
                }
                out.push((Tok::Ident(chars[start..i].iter().collect()), line));
            } else if matches!(word.as_str(), "b" | "c") && at(i) == '"' {
                let start = line;
                let (s, next) = quoted(&chars, i + 1, &mut line);
                out.push((Tok::Str(s), start));
                i = next;
            } else if word == "b" && at(i) == '\'' {
                i += 1;
                if at(i) == '\\' {
                    i += 1;
                }
                i += 1;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else {
                out.push((Tok::Ident(word), line));
            }
        } else if c == ':' && at(i + 1) == ':' {
            out.push((Tok::PathSep, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

/// A `"…"` literal's body from `i` (after the quote); returns it and the index past it.
fn quoted(chars: &[char], mut i: usize, line: &mut usize) -> (String, usize) {
    let start = i;
    while i < chars.len() && chars[i] != '"' {
        if chars[i] == '\\' {
            i += 1;
        }
        if chars.get(i) == Some(&'\n') {
            *line += 1;
        }
        i += 1;
    }
    let end = i.min(chars.len());
    (chars[start..end].iter().collect(), i + 1)
}

/// Parses one use tree from `toks[*k]` up to its `;`, `,` or `}` (left unconsumed),
/// pushing each leaf's segments and `as` name.
pub(super) fn use_tree(
    toks: &[(Tok, usize)],
    k: &mut usize,
    prefix: Vec<String>,
    leaves: &mut Vec<(Vec<String>, Option<String>)>,
) {
    let mut segments = prefix;
    let mut alias = None;
    while let Some((tok, _)) = toks.get(*k) {
        match tok {
            Tok::Ident(w) if w == "as" => {
                if let Some((Tok::Ident(name), _)) = toks.get(*k + 1) {
                    alias = Some(name.clone());
                }
                *k += 2;
            }
            Tok::Ident(w) => {
                segments.push(w.clone());
                *k += 1;
            }
            Tok::PathSep | Tok::Punct('$') => *k += 1,
            Tok::Punct('*') => {
                *k += 1;
            }
            Tok::Punct('{') => {
                *k += 1;
                loop {
                    if toks.get(*k).map(|t| &t.0) == Some(&Tok::Punct('}')) {
                        *k += 1;
                        break;
                    }
                    use_tree(toks, k, segments.clone(), leaves);
                    match toks.get(*k).map(|t| &t.0) {
                        Some(Tok::Punct(',')) => *k += 1,
                        Some(Tok::Punct('}')) => {
                            *k += 1;
                            break;
                        }
                        _ => break,
                    }
                }
                return;
            }
            _ => break,
        }
    }
    if segments.is_empty() {
        return;
    }
    leaves.push((segments, alias));
}
