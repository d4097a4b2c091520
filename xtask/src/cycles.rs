//! `cargo xtask cycles`: no import cycles between the library's files.
//!
//! The graph has one node per source file of the module tree that `lib.rs` roots
//! (followed through `mod name;` declarations and `#[path]` attributes). File A has an
//! edge to file B when A names an item of B through a path that starts with `crate::`,
//! `super::` or `self::` (in a `use` tree or in code), or with a module such a `use`
//! imported. A `mod.rs` naming its own children by their bare names (`pub use
//! child::Item`, its facade) is not counted: to the rest of the crate a directory module
//! is one unit, and its files reach each other's items through `super::`. A path resolves to the deepest file module that is a prefix of it, so
//! `crate::record::reader::Reader` is an edge to `record/reader.rs` and
//! `crate::record::Recording` one to `record/mod.rs`. Comments, string and char
//! literals are stripped first; `mod name;` itself is not an edge. Test modules count:
//! a cycle through a test file is still a cycle.
//!
//! The strongly connected components (Tarjan) with more than one file are the cycles;
//! any of them fails the check, which prints each one with the lines that close it.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use crate::util;

/// Checks `userspace/src`; an error lists every cycle.
pub fn run() -> util::Result {
    let src = util::root().join("userspace/src");
    let files = load(&src)?;
    let graph = Graph::build(&files, "lib.rs")?;
    let cycles = graph.cycles();
    if cycles.is_empty() {
        eprintln!(
            "xtask: import cycles: none among {} files of userspace/src",
            graph.files.len()
        );
        return Ok(());
    }
    let mut text = format!(
        "{} import cycle(s) between files in userspace/src:\n",
        cycles.len()
    );
    for cycle in &cycles {
        text.push_str(&format!("  cycle: {}\n", cycle.join(" <-> ")));
        for edge in graph.edges_within(cycle) {
            text.push_str(&format!("    {edge}\n"));
        }
    }
    text.push_str(
        "move the shared items to a module both can import, so one side no longer names the other",
    );
    Err(text)
}

/// Every `.rs` file under `dir`, keyed by its path relative to `dir` (`/`-separated).
fn load(dir: &Path) -> util::Result<BTreeMap<String, String>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        let entries =
            std::fs::read_dir(&at).map_err(|err| format!("reading {}: {err}", at.display()))?;
        for entry in entries {
            let path = entry
                .map_err(|err| format!("reading {}: {err}", at.display()))?
                .path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|ext| ext == "rs") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|err| format!("reading {}: {err}", path.display()))?;
                let rel = path
                    .strip_prefix(dir)
                    .map_err(|err| format!("{}: {err}", path.display()))?;
                files.insert(rel.to_string_lossy().replace('\\', "/"), text);
            }
        }
    }
    Ok(files)
}

#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Ident(String),
    Str(String),
    PathSep,
    Punct(char),
}

/// Tokens of `text` with their line numbers; comments dropped, literals kept as `Str`.
fn lex(text: &str) -> Vec<(Tok, usize)> {
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

/// One reference from a file to another module's item.
#[derive(Clone, Debug)]
struct Edge {
    from: usize,
    to: usize,
    line: usize,
    path: String,
}

/// The file-level import graph.
struct Graph {
    /// File (relative path) per node.
    files: Vec<String>,
    /// Module path (`a::b`) → node.
    modules: HashMap<Vec<String>, usize>,
    edges: Vec<Edge>,
}

impl Graph {
    fn build(files: &BTreeMap<String, String>, root: &str) -> util::Result<Graph> {
        let mut graph = Graph {
            files: Vec::new(),
            modules: HashMap::new(),
            edges: Vec::new(),
        };
        let mut tokens = Vec::new();
        let mut paths = Vec::new();
        // The module tree: breadth first from the root through `mod name;`.
        let mut queue = vec![(root.to_string(), Vec::<String>::new())];
        while let Some((file, module)) = queue.pop() {
            let text = files
                .get(&file)
                .ok_or_else(|| format!("module {} has no file {file}", module.join("::")))?;
            let toks = lex(text);
            let dir = match file.rfind('/') {
                Some(slash) => file[..slash + 1].to_string(),
                None => String::new(),
            };
            let stem = file
                .rsplit('/')
                .next()
                .unwrap_or(&file)
                .trim_end_matches(".rs");
            let child_dir = if matches!(stem, "mod" | "lib" | "main") {
                dir.clone()
            } else {
                format!("{dir}{stem}/")
            };
            let mut pending_path: Option<String> = None;
            let mut depth = 0usize;
            for (k, (tok, _)) in toks.iter().enumerate() {
                match tok {
                    Tok::Punct('{') => depth += 1,
                    Tok::Punct('}') => depth = depth.saturating_sub(1),
                    Tok::Ident(w) if w == "path" => {
                        if let (Some((Tok::Punct('='), _)), Some((Tok::Str(p), _))) =
                            (toks.get(k + 1), toks.get(k + 2))
                        {
                            pending_path = Some(p.clone());
                        }
                    }
                    Tok::Ident(w) if w == "mod" && depth == 0 => {
                        if let (Some((Tok::Ident(name), _)), Some((Tok::Punct(';'), _))) =
                            (toks.get(k + 1), toks.get(k + 2))
                        {
                            let child = match pending_path.take() {
                                Some(p) => format!("{dir}{p}"),
                                None => {
                                    let flat = format!("{child_dir}{name}.rs");
                                    if files.contains_key(&flat) {
                                        flat
                                    } else {
                                        format!("{child_dir}{name}/mod.rs")
                                    }
                                }
                            };
                            let mut path = module.clone();
                            path.push(name.clone());
                            queue.push((child, path));
                        } else {
                            pending_path = None;
                        }
                    }
                    _ => {}
                }
            }
            graph.modules.insert(module.clone(), graph.files.len());
            graph.files.push(file);
            tokens.push(toks);
            paths.push(module);
        }
        for node in 0..graph.files.len() {
            let edges = graph.references(node, &paths[node], &tokens[node]);
            graph.edges.extend(edges);
        }
        Ok(graph)
    }

    /// The edges out of one file.
    fn references(&self, node: usize, module: &[String], toks: &[(Tok, usize)]) -> Vec<Edge> {
        let mut edges = Vec::new();
        // Names bound to whole modules by `use`, and inline modules open at each depth.
        let mut aliases: HashMap<String, Vec<String>> = HashMap::new();
        let mut inline: Vec<(String, usize)> = Vec::new();
        let mut depth = 0usize;
        let mut k = 0;
        while k < toks.len() {
            let here: Vec<String> = module
                .iter()
                .cloned()
                .chain(inline.iter().map(|(name, _)| name.clone()))
                .collect();
            match &toks[k].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => {
                    depth = depth.saturating_sub(1);
                    if inline.last().is_some_and(|(_, open)| *open > depth) {
                        inline.pop();
                    }
                }
                Tok::Ident(w) if w == "mod" => {
                    if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) =
                        (toks.get(k + 1), toks.get(k + 2))
                    {
                        depth += 1;
                        inline.push((name.clone(), depth));
                        k += 3;
                        continue;
                    }
                }
                Tok::Ident(w) if w == "use" => {
                    let line = toks[k].1;
                    let mut leaves = Vec::new();
                    k += 1;
                    use_tree(toks, &mut k, Vec::new(), &mut leaves);
                    for (segments, alias) in leaves {
                        let Some(full) = self.resolve(&here, &segments, &aliases) else {
                            continue;
                        };
                        if self.modules.contains_key(&full)
                            && let Some(name) = alias.or_else(|| full.last().cloned())
                        {
                            aliases.insert(name, full.clone());
                        }
                        self.edge(node, &full, line, &segments, &mut edges);
                    }
                    continue;
                }
                Tok::Ident(first) => {
                    let after_sep = k > 0 && toks[k - 1].0 == Tok::PathSep;
                    let dollar = k > 0 && toks[k - 1].0 == Tok::Punct('$');
                    if !after_sep && toks.get(k + 1).map(|t| &t.0) == Some(&Tok::PathSep) {
                        let line = toks[k].1;
                        let mut segments = vec![if dollar && first == "crate" {
                            "crate".to_string()
                        } else {
                            first.clone()
                        }];
                        let mut j = k + 1;
                        while toks.get(j).map(|t| &t.0) == Some(&Tok::PathSep) {
                            match toks.get(j + 1).map(|t| &t.0) {
                                Some(Tok::Ident(seg)) => {
                                    segments.push(seg.clone());
                                    j += 2;
                                }
                                _ => break,
                            }
                        }
                        if let Some(full) = self.resolve(&here, &segments, &aliases) {
                            self.edge(node, &full, line, &segments, &mut edges);
                        }
                        k = j;
                        continue;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        edges
    }

    /// The module path `segments` names from module `here`, or `None` for a path outside
    /// the crate (std, other crates, locals).
    fn resolve(
        &self,
        here: &[String],
        segments: &[String],
        aliases: &HashMap<String, Vec<String>>,
    ) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut rest = &segments[1..];
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => here.to_vec(),
            "super" => {
                let mut base = here.to_vec();
                base.pop()?;
                while rest.first().is_some_and(|s| s == "super") {
                    base.pop()?;
                    rest = &rest[1..];
                }
                base
            }
            // A bare child name is the parent's own facade (`pub use child::Item`,
            // `child::f()` in mod.rs): not counted. A module imported by a counted
            // `use` is followed.
            name => aliases.get(name)?.clone(),
        };
        base.extend(rest.iter().filter(|s| *s != "self").cloned());
        Some(base)
    }

    /// Records an edge from `node` to the deepest file module that prefixes `full`.
    fn edge(
        &self,
        node: usize,
        full: &[String],
        line: usize,
        segments: &[String],
        edges: &mut Vec<Edge>,
    ) {
        let target = (0..=full.len())
            .rev()
            .find_map(|n| self.modules.get(&full[..n]).copied());
        if let Some(to) = target
            && to != node
        {
            edges.push(Edge {
                from: node,
                to,
                line,
                path: segments.join("::"),
            });
        }
    }

    /// The strongly connected components of more than one file, each as sorted file
    /// names, in file order.
    fn cycles(&self) -> Vec<Vec<String>> {
        let n = self.files.len();
        let mut out: Vec<BTreeSet<usize>> = Vec::new();
        let mut adj = vec![BTreeSet::new(); n];
        for e in &self.edges {
            adj[e.from].insert(e.to);
        }
        // Tarjan's algorithm, iterative.
        let mut index = vec![usize::MAX; n];
        let mut low = vec![0; n];
        let mut on_stack = vec![false; n];
        let mut stack = Vec::new();
        let mut next = 0;
        for start in 0..n {
            if index[start] != usize::MAX {
                continue;
            }
            let mut work: Vec<(usize, Vec<usize>)> = Vec::new();
            index[start] = next;
            low[start] = next;
            next += 1;
            stack.push(start);
            on_stack[start] = true;
            work.push((start, adj[start].iter().copied().collect()));
            while let Some((v, pending)) = work.last_mut() {
                let v = *v;
                if let Some(w) = pending.pop() {
                    if index[w] == usize::MAX {
                        index[w] = next;
                        low[w] = next;
                        next += 1;
                        stack.push(w);
                        on_stack[w] = true;
                        work.push((w, adj[w].iter().copied().collect()));
                    } else if on_stack[w] {
                        low[v] = low[v].min(index[w]);
                    }
                    continue;
                }
                work.pop();
                if let Some((parent, _)) = work.last() {
                    low[*parent] = low[*parent].min(low[v]);
                }
                if low[v] == index[v] {
                    let mut component = BTreeSet::new();
                    while let Some(w) = stack.pop() {
                        on_stack[w] = false;
                        component.insert(w);
                        if w == v {
                            break;
                        }
                    }
                    if component.len() > 1 {
                        out.push(component);
                    }
                }
            }
        }
        let mut named: Vec<Vec<String>> = out
            .iter()
            .map(|c| {
                let mut names: Vec<String> = c.iter().map(|&i| self.files[i].clone()).collect();
                names.sort();
                names
            })
            .collect();
        named.sort();
        named
    }

    /// The edges between the files of one cycle, as `file:line names path` lines.
    fn edges_within(&self, cycle: &[String]) -> Vec<String> {
        let members: BTreeSet<&str> = cycle.iter().map(String::as_str).collect();
        let mut lines: Vec<String> = self
            .edges
            .iter()
            .filter(|e| {
                members.contains(self.files[e.from].as_str())
                    && members.contains(self.files[e.to].as_str())
            })
            .map(|e| {
                format!(
                    "{}:{} -> {} ({})",
                    self.files[e.from], e.line, self.files[e.to], e.path
                )
            })
            .collect();
        lines.dedup();
        lines
    }
}

/// Parses one use tree from `toks[*k]` up to its `;`, `,` or `}` (left unconsumed),
/// pushing each leaf's segments and `as` name.
fn use_tree(
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

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> BTreeMap<String, String> {
        files
            .iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    fn cycles(files: &[(&str, &str)]) -> Vec<Vec<String>> {
        Graph::build(&tree(files), "lib.rs")
            .expect("builds")
            .cycles()
    }

    #[test]
    fn a_cycle_through_use_and_super_is_found() {
        let found = cycles(&[
            ("lib.rs", "pub mod a;\npub mod b;\n"),
            (
                "a/mod.rs",
                "pub mod leaf;\nuse crate::b::Thing;\npub struct A;\n",
            ),
            ("a/leaf.rs", "pub fn f() -> super::A { super::A }\n"),
            (
                "b.rs",
                "pub struct Thing;\nfn g() { let _ = crate::a::leaf::f(); }\n",
            ),
        ]);
        assert_eq!(found, vec![vec!["a/leaf.rs", "a/mod.rs", "b.rs"]]);
    }

    #[test]
    fn a_tree_without_a_cycle_passes_and_comments_strings_do_not_count() {
        let found = cycles(&[
            ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\n"),
            (
                "a.rs",
                "use crate::{b::B, c};\n// crate::c::back would close nothing\npub fn a() { c::f(); }\n",
            ),
            (
                "b.rs",
                "pub struct B;\n/* use crate::a::a; */\nconst S: &str = \"crate::a::a\";\nconst R: &str = r#\"crate::a::a\"#;\nfn l<'x>(_: &'x u8) -> char { '\"' }\n",
            ),
            (
                "c.rs",
                "pub fn f() {}\n#[cfg(test)]\nmod tests { use super::*; }\n",
            ),
            // A facade: mod.rs re-exports its child by bare name, the child uses super.
            ("d/mod.rs", "mod x;\npub use x::X;\npub struct D;\n"),
            ("d/x.rs", "pub struct X(super::D);\n"),
        ]);
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn path_attributes_and_module_aliases_resolve() {
        // t_tests.rs is `t::tests`, so its `super::` is t.rs; `use crate::u;` then
        // `u::deep::f` names u/deep.rs.
        let found = cycles(&[
            ("lib.rs", "pub mod t;\npub mod u;\n"),
            (
                "t.rs",
                "use crate::u;\nfn f() { u::deep::g(); }\n#[path = \"t_tests.rs\"]\nmod tests;\n",
            ),
            ("t_tests.rs", "use super::*;\n"),
            ("u/mod.rs", "pub mod deep;\n"),
            ("u/deep.rs", "pub fn g() { let _ = crate::t::X; }\n"),
        ]);
        assert_eq!(found, vec![vec!["t.rs", "u/deep.rs"]]);
    }
}
