//! The file-level import graph of a module tree and its cycles (Tarjan's strongly
//! connected components).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::lex::{Tok, lex, use_tree};
use crate::util;

/// One reference from a file to another module's item.
#[derive(Clone, Debug)]
struct Edge {
    from: usize,
    to: usize,
    line: usize,
    path: String,
}

/// The file-level import graph.
pub(super) struct Graph {
    /// File (relative path) per node.
    pub(super) files: Vec<String>,
    /// Module path (`a::b`) → node.
    modules: HashMap<Vec<String>, usize>,
    edges: Vec<Edge>,
    /// A module's imports of its own children's items (`use child::Item` in a `mod.rs`,
    /// its facade): (module node, name) → the item's full path.
    facades: HashMap<(usize, String), Vec<String>>,
    /// The edges with each path followed through facades to the file that defines the
    /// item: `super::Item` from `a/x.rs` reaches `a/y.rs` when `a/mod.rs` has `pub use
    /// y::Item`. What the folder check counts.
    file_edges: Vec<Edge>,
}

impl Graph {
    pub(super) fn build(files: &BTreeMap<String, String>, root: &str) -> util::Result<Graph> {
        let mut graph = Graph {
            files: Vec::new(),
            modules: HashMap::new(),
            edges: Vec::new(),
            facades: HashMap::new(),
            file_edges: Vec::new(),
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
            graph.collect_facade(node, &paths[node], &tokens[node]);
        }
        for node in 0..graph.files.len() {
            let (edges, file_edges) = graph.references(node, &paths[node], &tokens[node]);
            graph.edges.extend(edges);
            graph.file_edges.extend(file_edges);
        }
        Ok(graph)
    }

    /// Records the top-level `use child::…` imports of `node` whose first segment is one of
    /// its child modules.
    fn collect_facade(&mut self, node: usize, module: &[String], toks: &[(Tok, usize)]) {
        let mut depth = 0usize;
        let mut k = 0;
        while k < toks.len() {
            match &toks[k].0 {
                Tok::Punct('{') => depth += 1,
                Tok::Punct('}') => depth = depth.saturating_sub(1),
                Tok::Ident(w) if w == "use" && depth == 0 => {
                    let mut leaves = Vec::new();
                    k += 1;
                    use_tree(toks, &mut k, Vec::new(), &mut leaves);
                    for (segments, alias) in leaves {
                        let segments: Vec<String> =
                            segments.into_iter().skip_while(|s| s == "self").collect();
                        let Some(first) = segments.first() else {
                            continue;
                        };
                        let mut child = module.to_vec();
                        child.push(first.clone());
                        if segments.len() < 2 || !self.modules.contains_key(&child) {
                            continue;
                        }
                        let Some(name) = alias.or_else(|| segments.last().cloned()) else {
                            continue;
                        };
                        if name == "*" || name == "self" {
                            continue;
                        }
                        let mut full = module.to_vec();
                        full.extend(segments);
                        self.facades.insert((node, name), full);
                    }
                    continue;
                }
                _ => {}
            }
            k += 1;
        }
    }

    /// The edges out of one file: to the modules its paths name, and to the files that
    /// define the items (through facades).
    fn references(
        &self,
        node: usize,
        module: &[String],
        toks: &[(Tok, usize)],
    ) -> (Vec<Edge>, Vec<Edge>) {
        let (mut edges, mut file_edges) = (Vec::new(), Vec::new());
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
                        self.refer(node, &full, line, &segments, (&mut edges, &mut file_edges));
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
                            self.refer(node, &full, line, &segments, (&mut edges, &mut file_edges));
                        }
                        k = j;
                        continue;
                    }
                }
                _ => {}
            }
            k += 1;
        }
        (edges, file_edges)
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

    /// Records what `node` names at `line` (`segments`, resolved to `full`): an edge to
    /// the deepest file module that prefixes it, and one to the file that defines the item.
    fn refer(&self, node: usize, full: &[String], line: usize, segments: &[String], out: Out) {
        let module = self.deepest(full).map(|(_, at)| at);
        push(out.0, node, module, line, segments);
        push(out.1, node, self.defining_file(full), line, segments);
    }

    /// The deepest file module that prefixes `path`: how many segments it spans, its node.
    fn deepest(&self, path: &[String]) -> Option<(usize, usize)> {
        (0..=path.len())
            .rev()
            .find_map(|n| self.modules.get(&path[..n]).map(|&at| (n, at)))
    }

    /// The file that defines what `full` names: the deepest file module prefixing it,
    /// followed through facades (a few hops at most).
    fn defining_file(&self, full: &[String]) -> Option<usize> {
        let mut path = full.to_vec();
        for _ in 0..8 {
            let (n, at) = self.deepest(&path)?;
            match path
                .get(n)
                .and_then(|name| self.facades.get(&(at, name.clone())))
            {
                Some(item) => {
                    let mut next = item.clone();
                    next.extend(path[n + 1..].iter().cloned());
                    path = next;
                }
                None => return Some(at),
            }
        }
        None
    }

    /// The strongly connected components of more than one file, each as sorted file
    /// names, in file order.
    pub(super) fn cycles(&self) -> Vec<Vec<String>> {
        self.components(self.edges.iter())
    }

    /// The cycles between files of one folder, with every path followed to the file that
    /// defines its item (see `file_edges`).
    pub(super) fn folder_cycles(&self) -> Vec<Vec<String>> {
        self.components(
            self.file_edges
                .iter()
                .filter(|e| folder(&self.files[e.from]) == folder(&self.files[e.to])),
        )
    }

    /// The edges of `file_edges` between the files of one folder cycle, as lines.
    pub(super) fn file_edges_within(&self, cycle: &[String]) -> Vec<String> {
        lines_within(self, &self.file_edges, cycle)
    }

    fn components<'a>(&self, edges: impl Iterator<Item = &'a Edge>) -> Vec<Vec<String>> {
        let n = self.files.len();
        let mut out: Vec<BTreeSet<usize>> = Vec::new();
        let mut adj = vec![BTreeSet::new(); n];
        for e in edges {
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
    pub(super) fn edges_within(&self, cycle: &[String]) -> Vec<String> {
        lines_within(self, &self.edges, cycle)
    }
}

/// The two edge lists a reference adds to: by module, and by defining file.
type Out<'a> = (&'a mut Vec<Edge>, &'a mut Vec<Edge>);

/// An edge from `from` to `to`, if that is another file.
fn push(edges: &mut Vec<Edge>, from: usize, to: Option<usize>, line: usize, segments: &[String]) {
    if let Some(to) = to
        && to != from
    {
        edges.push(Edge {
            from,
            to,
            line,
            path: segments.join("::"),
        });
    }
}

/// The folder of a file path (`a/b/` of `a/b/c.rs`, empty at the root).
fn folder(file: &str) -> &str {
    file.rfind('/').map_or("", |slash| &file[..=slash])
}

/// The edges of `edges` between the files of `cycle`, as `file:line -> file (path)` lines.
fn lines_within(graph: &Graph, edges: &[Edge], cycle: &[String]) -> Vec<String> {
    let members: BTreeSet<&str> = cycle.iter().map(String::as_str).collect();
    let mut lines: Vec<String> = edges
        .iter()
        .filter(|e| {
            members.contains(graph.files[e.from].as_str())
                && members.contains(graph.files[e.to].as_str())
        })
        .map(|e| {
            format!(
                "{}:{} -> {} ({})",
                graph.files[e.from], e.line, graph.files[e.to], e.path
            )
        })
        .collect();
    lines.dedup();
    lines
}
