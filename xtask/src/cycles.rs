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
//!
//! Inside a folder the facade is looked through: a path that names an item a `mod.rs`
//! imports from one of its children (`super::Item` where `mod.rs` has `pub use
//! child::Item`) is an edge to that child's file, and a cycle among the files of one
//! folder fails the check too. Doc links are comments and do not count.

mod graph;
mod lex;

use std::collections::BTreeMap;
use std::path::Path;

use crate::util;
use graph::Graph;

/// Checks `userspace/src`; an error lists every cycle.
pub fn run() -> util::Result {
    let src = util::root().join("userspace/src");
    let files = load(&src)?;
    let graph = Graph::build(&files, "lib.rs")?;
    let cycles = graph.cycles();
    let folder_cycles = graph.folder_cycles();
    if cycles.is_empty() && folder_cycles.is_empty() {
        eprintln!(
            "xtask: import cycles: none among {} files of userspace/src, none inside a folder",
            graph.files.len()
        );
        return Ok(());
    }
    if cycles.is_empty() {
        let mut text = format!(
            "{} file-level cycle(s) inside a folder of userspace/src (paths followed through \
             mod.rs re-exports to the file that defines the item):\n",
            folder_cycles.len()
        );
        for cycle in &folder_cycles {
            text.push_str(&format!("  cycle: {}\n", cycle.join(" <-> ")));
            for edge in graph.file_edges_within(cycle) {
                text.push_str(&format!("    {edge}\n"));
            }
        }
        text.push_str("move the shared items to a file both can import, so one side no longer names the other");
        return Err(text);
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
    fn a_cycle_through_a_facade_inside_a_folder_is_found() {
        let files = tree(&[
            ("lib.rs", "pub mod d;\n"),
            (
                "d/mod.rs",
                "mod x;\nmod y;\npub use x::X;\npub use y::{Y, helper as h};\n",
            ),
            ("d/x.rs", "pub struct X(pub super::Y);\n"),
            ("d/y.rs", "pub struct Y;\npub fn helper(x: &super::X) {}\n"),
        ]);
        let graph = Graph::build(&files, "lib.rs").expect("builds");
        assert!(
            graph.cycles().is_empty(),
            "the module-level check looks no deeper"
        );
        assert_eq!(graph.folder_cycles(), vec![vec!["d/x.rs", "d/y.rs"]]);
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
