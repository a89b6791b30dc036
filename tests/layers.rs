//! The crate's modules form layers that only look down (docs/ARCHITECTURE.md, "Layers"): this test
//! reads every library source file, finds each reference to another module (`crate::a::...` paths in
//! `use` lines and in code, grouped `use crate::{a, b::c}` included), and fails when a module refers
//! to one of a layer above it, when the top-level modules import each other in a circle, or when the
//! files of one folder do. Unit-test modules (`#[cfg(test)] mod tests` and `tests.rs` files) and
//! comments are left out: they are not part of the library's build. The `testing` module (test and
//! fuzz scaffolding, behind a feature) sits above everything and may look anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module of the crate and its layer, bottom (0) to top.
const LAYERS: &[(&str, u32, &str)] = &[
    ("error", 0, "base"),
    ("limits", 0, "base"),
    ("num", 0, "base"),
    ("clock", 0, "base"),
    ("time", 0, "base"),
    ("storage", 0, "base"),
    ("parallel", 0, "base"),
    ("item", 1, "item model"),
    ("log", 2, "log and record codec"),
    ("index", 3, "index"),
    ("read", 4, "read path"),
    ("engine", 5, "engine services"),
    ("store", 6, "public facade"),
    ("snapshot", 6, "public facade"),
    ("testing", 7, "test scaffolding (feature `testing`)"),
];

fn layer_of(module: &str) -> Option<(u32, &'static str)> {
    LAYERS
        .iter()
        .find(|(name, _, _)| *name == module)
        .map(|(_, layer, what)| (*layer, *what))
}

/// A library source file: its path under src/ and its module path (`log::record` for
/// src/log/record.rs and `index` for src/index/mod.rs).
struct SourceFile {
    path: PathBuf,
    module: Vec<String>,
    text: String,
}

fn source_files(dir: &Path, module: &[String], out: &mut Vec<SourceFile>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned();
        if path.is_dir() {
            if name == "bin" {
                continue;
            }
            let mut inner = module.to_vec();
            inner.push(name);
            source_files(&path, &inner, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem == "tests" || (module.is_empty() && stem == "lib") {
                continue;
            }
            let mut file_module = module.to_vec();
            if stem != "mod" {
                file_module.push(stem.to_owned());
            }
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
            out.push(SourceFile {
                path,
                module: file_module,
                text,
            });
        }
    }
}

/// The file's library code: comments dropped, and everything from a `#[cfg(test)]` that opens a
/// `mod` on to the end of that module (unit tests come last in this crate's files, so to the end of
/// the file).
fn library_code(text: &str) -> String {
    let mut code = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            let next = lines.peek().map(|l| l.trim_start()).unwrap_or_default();
            if next.starts_with("mod ") || next.starts_with("pub(crate) mod ") || next.starts_with("pub mod ") {
                // A unit-test module: `mod tests;` (its file is not library code either) or an
                // inline `mod tests { ... }`, skipped to its closing brace; what follows it is read.
                let mut depth = 0i64;
                for line in lines.by_ref() {
                    depth += line.matches('{').count() as i64 - line.matches('}').count() as i64;
                    if depth <= 0 && (line.contains('}') || line.trim_end().ends_with(';')) {
                        break;
                    }
                }
                continue;
            }
        }
        if trimmed.starts_with("//") {
            continue;
        }
        let without_comment = match line.find("//") {
            // A `//` inside a string (a URL, say) is rare here; cut only when no quote precedes it.
            Some(at) if !line.get(..at).unwrap_or_default().contains('"') => line.get(..at).unwrap_or_default(),
            _ => line,
        };
        code.push_str(without_comment);
        code.push('\n');
    }
    code
}

fn is_ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths (as segment lists, `crate::` left off) that `code` names: `crate::a::b::C` gives
/// `[a, b, C]`; `crate::{a::B, c}` gives `[a, B]` and `[c]`.
fn crate_paths(code: &str) -> Vec<Vec<String>> {
    paths_after(code, "crate::", &[])
}

/// The paths `code` names from the crate root: `crate::` paths, and `super::` paths resolved from
/// `module` (the module of the file `code` comes from).
fn module_paths(code: &str, module: &[String]) -> Vec<Vec<String>> {
    let mut paths = crate_paths(code);
    let parent = module.get(..module.len().saturating_sub(1)).unwrap_or_default();
    paths.extend(paths_after(code, "super::", parent));
    paths
}

/// The paths that follow each `marker` in `code` (not inside a longer name or path), each
/// prefixed with `prefix`.
fn paths_after(code: &str, marker: &str, prefix: &[String]) -> Vec<Vec<String>> {
    let mut paths = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(marker) {
        let before = rest.get(..at).and_then(|b| b.chars().last());
        rest = rest.get(at + marker.len()..).unwrap_or_default();
        if before.is_some_and(|c| is_ident_char(c) || c == ':') {
            continue; // `$crate::`, `my_crate::`, `super::super::`
        }
        parse_path(rest, prefix.to_vec(), &mut paths);
    }
    paths
}

/// Parses a path (or a brace group of paths) at the start of `text`, prefixed by `prefix`.
fn parse_path(text: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut segments = prefix;
    let mut at = 0;
    let bytes: Vec<char> = text.chars().collect();
    loop {
        while bytes.get(at).is_some_and(|c| c.is_whitespace()) {
            at += 1;
        }
        if bytes.get(at) == Some(&'{') {
            at += 1;
            loop {
                while bytes.get(at).is_some_and(|c| c.is_whitespace() || *c == ',') {
                    at += 1;
                }
                match bytes.get(at) {
                    None => return at,
                    Some('}') => return at + 1,
                    Some(_) => {
                        let rest: String = bytes.get(at..).unwrap_or_default().iter().collect();
                        let used = parse_path(&rest, segments.clone(), out);
                        at += used.max(1);
                    }
                }
            }
        }
        let start = at;
        while bytes.get(at).copied().is_some_and(is_ident_char) {
            at += 1;
        }
        if at == start {
            if !segments.is_empty() {
                out.push(segments);
            }
            return at;
        }
        segments.push(bytes.get(start..at).unwrap_or_default().iter().collect());
        if bytes.get(at) == Some(&':') && bytes.get(at + 1) == Some(&':') {
            at += 2;
        } else {
            out.push(segments);
            return at;
        }
    }
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn modules_import_only_their_own_layer_or_below_and_never_in_a_circle() {
    let mut files = Vec::new();
    source_files(&src_dir(), &[], &mut files);
    assert!(files.len() > 20, "found only {} source files under src/", files.len());

    let mut problems = Vec::new();
    // Top-level module -> the top-level modules it refers to.
    let mut top_graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    // Folder -> (file module -> sibling file modules it refers to).
    let mut folder_graphs: BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();

    for file in &files {
        let Some(top) = file.module.first() else { continue };
        let Some((layer, what)) = layer_of(top) else {
            problems.push(format!(
                "{}: module `{top}` has no layer: add it to LAYERS in tests/layers.rs and to docs/ARCHITECTURE.md",
                file.path.display()
            ));
            continue;
        };
        for path in module_paths(&library_code(&file.text), &file.module) {
            let Some(target) = path.first() else { continue };
            if target == top {
                // Inside one top-level module: the folder's files must not import each other in a circle.
                let Some(parent) = file.module.get(..file.module.len().saturating_sub(1)) else {
                    continue;
                };
                if file.module.len() < 2 {
                    continue;
                }
                let longest = (1..=path.len())
                    .rev()
                    .map(|n| path.get(..n).unwrap_or_default().to_vec())
                    .find(|candidate| modules.contains(candidate));
                if let Some(target_module) = longest {
                    if target_module.len() == file.module.len()
                        && target_module.get(..parent.len()) == Some(parent)
                        && target_module != file.module
                    {
                        folder_graphs
                            .entry(parent.to_vec())
                            .or_default()
                            .entry(file.module.join("::"))
                            .or_default()
                            .insert(target_module.join("::"));
                    }
                }
                continue;
            }
            top_graph.entry(top.clone()).or_default().insert(target.clone());
            match layer_of(target) {
                None => {}
                Some((target_layer, target_what)) if target_layer > layer && top != "testing" => problems.push(format!(
                    "{}: `{}` (layer {layer}, {what}) imports `crate::{}` (layer {target_layer}, {target_what}): an import upward",
                    file.path.display(),
                    file.module.join("::"),
                    path.join("::")
                )),
                Some(_) => {}
            }
        }
    }

    if let Some(cycle) = find_cycle(&top_graph) {
        problems.push(format!(
            "top-level modules import each other in a circle: {}",
            cycle.join(" -> ")
        ));
    }
    for (folder, graph) in &folder_graphs {
        if let Some(cycle) = find_cycle(graph) {
            problems.push(format!(
                "files of `{}` import each other in a circle: {}",
                folder.join("::"),
                cycle.join(" -> ")
            ));
        }
    }
    let problems: Vec<String> = problems.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    assert!(
        problems.is_empty(),
        "{} layering problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

/// A circle in `graph`, as the nodes along it (the first repeated at the end), if there is one.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, bool>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match state.get(node) {
            Some(true) => {
                let from = stack.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = stack.get(from..).unwrap_or_default().to_vec();
                cycle.push(node.to_owned());
                return Some(cycle);
            }
            Some(false) => return None,
            None => {}
        }
        state.insert(node.to_owned(), true);
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, state, stack) {
                return Some(cycle);
            }
        }
        stack.pop();
        state.insert(node.to_owned(), false);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut state, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_checker_sees_grouped_imports_inline_paths_and_circles() {
    let code = library_code(
        "use crate::{error::{Error, Result}, index::Index};\n// crate::store::Shared in a comment\nfn f() { crate::log::record::decode(x); }\n#[cfg(test)]\nmod tests {\n    use crate::engine::Shared;\n}\n#[cfg(test)]\nmod more_tests;\nuse crate::time::Clock;\n",
    );
    let mut tops: Vec<String> = crate_paths(&code)
        .into_iter()
        .filter_map(|p| p.first().cloned())
        .collect();
    tops.sort();
    tops.dedup();
    assert_eq!(tops, ["error", "index", "log", "time"]);
    let paths = crate_paths("use crate::{a::{B, c::D}, e};");
    assert_eq!(
        paths,
        vec![
            vec!["a".to_owned(), "B".to_owned()],
            vec!["a".to_owned(), "c".to_owned(), "D".to_owned()],
            vec!["e".to_owned()]
        ]
    );
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.entry("a".into()).or_default().insert("b".into());
    graph.entry("b".into()).or_default().insert("c".into());
    assert_eq!(find_cycle(&graph), None);
    graph.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
}
