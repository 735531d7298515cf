//! The shape of the code, checked (issue 37): no import circle between the
//! top-level modules of `leaseq-server` or of `leaseq-client`.
//!
//! **The rule.** A crate's top-level modules (`src/X.rs` or `src/X/`) form
//! a directed graph with no circle: if any code of `a` names `crate::b::...`
//! (or `b` through a re-export of the crate root), then no code of `b` may
//! name `a`, directly or through other modules. So the modules stack in
//! layers, each using only those below it, and any one of them can be read,
//! tested and changed knowing only what is under it. What counts:
//! `crate::` paths (in `use` lines or inline) and `super::` paths that climb
//! to the crate root, outside comments and string literals. What does not:
//! `#[cfg(test)]` items and modules (a test may use anything), and the crate
//! root itself (`lib.rs`: the map and the re-exports).
//!
//! A circle is reported as the modules around it with the first line where
//! each one names the next. To break one, move what both sides need below
//! both (to `domain`, `channels`, `config`, ...), as issue 37 did for
//! `store` ↔ `placement`, `settle` ↔ `dispatch` and `session` ↔ `worker`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

/// One reference of a module to another: where it is.
#[derive(Clone, Debug)]
struct Site {
    file: String,
    line: usize,
}

/// Module → module it names → the first place it does.
type Graph = BTreeMap<String, BTreeMap<String, Site>>;

#[test]
fn the_servers_modules_have_no_import_circle() {
    assert_no_circle("crates/server/src");
}

#[test]
fn the_clients_modules_have_no_import_circle() {
    assert_no_circle("crates/client/src");
}

/// The check itself fails on a circle: two modules naming each other, and
/// one of three through a re-export of the root and a `super::` path.
#[test]
fn the_check_finds_a_planted_circle() {
    let clean = [
        ("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n"),
        (
            "a.rs",
            "use crate::Thing;\n// crate::b::nothing in a comment\n",
        ),
        ("b.rs", "pub struct Thing;\nconst S: &str = \"crate::a\";\n"),
        ("b/c.rs", "use super::Thing;\n"),
    ];
    let graph = graph_of(&files(&clean));
    assert!(circles(&graph).is_empty(), "{graph:?}");
    let mut planted = clean.to_vec();
    planted.push((
        "b/d.rs",
        "fn f() { super::super::a::g() }\n#[cfg(test)]\nmod t { use crate::c; }\n",
    ));
    let graph = graph_of(&files(&planted));
    let found = circles(&graph);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a → b (a.rs:1)"), "{}", found[0]);
    assert!(found[0].contains("b → a (b/d.rs:1)"), "{}", found[0]);
    // A module under #[cfg(test)] in the root is not a part of the graph.
    let tested = [
        ("lib.rs", "mod a;\n#[cfg(test)]\nmod sim;\n"),
        ("a.rs", "pub fn f() {}\n"),
        ("sim.rs", "use crate::a::f;\n"),
    ];
    assert!(!graph_of(&files(&tested)).contains_key("sim"));
}

fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(p, t)| (p.to_string(), t.to_string()))
        .collect()
}

fn assert_no_circle(src: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let mut sources = Vec::new();
    read_tree(&root, &root, &mut sources);
    assert!(sources.len() > 3, "no sources under {src}");
    let graph = graph_of(&sources);
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "import circles between the top-level modules of {src} (tests/house.rs says why \
         there must be none):\n{}",
        found.join("\n")
    );
}

fn read_tree(root: &Path, dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).expect("reading the sources") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            read_tree(root, &path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            out.push((rel, std::fs::read_to_string(&path).expect("a source file")));
        }
    }
}

/// The top-level module a file belongs to (None: the crate root).
fn module_of(path: &str) -> Option<String> {
    let first = path.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

fn graph_of(sources: &[(String, String)]) -> Graph {
    let root = sources
        .iter()
        .find(|(p, _)| p == "lib.rs")
        .map(|(_, t)| code(t))
        .unwrap_or_default();
    // The root's modules, but those only compiled for tests.
    let modules: BTreeSet<String> = sources.iter().filter_map(|(p, _)| module_of(p)).collect();
    let test_only: BTreeSet<String> = modules
        .iter()
        .filter(|m| !without_tests(&root).contains(&format!("mod {m};")))
        .cloned()
        .collect();
    let root = without_tests(&root);
    // Names the root re-exports from a module: `pub use x::{A, B as C}`.
    let mut reexports: HashMap<String, String> = HashMap::new();
    for stmt in root.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        if !modules.contains(module) {
            continue;
        }
        for name in names.split(|c: char| "{},".contains(c)) {
            let name = name.split(" as ").last().unwrap_or("").trim();
            let name = name.rsplit("::").next().unwrap_or("");
            if !name.is_empty() {
                reexports.insert(name.to_owned(), module.to_owned());
            }
        }
    }
    let mut graph = Graph::new();
    for (path, text) in sources {
        let Some(from) = module_of(path) else {
            continue;
        };
        if test_only.contains(&from) {
            continue;
        }
        let depth = path.matches('/').count() + usize::from(!path.ends_with("mod.rs"));
        let body = without_tests(&code(text));
        let edges = graph.entry(from.clone()).or_default();
        for (offset, name) in references(&body, depth) {
            let to = if modules.contains(&name) {
                name
            } else if let Some(m) = reexports.get(&name) {
                m.clone()
            } else {
                continue;
            };
            if to != from && !test_only.contains(&to) {
                let line = body[..offset].matches('\n').count() + 1;
                edges.entry(to).or_insert(Site {
                    file: path.clone(),
                    line,
                });
            }
        }
    }
    graph
}

/// The first segment after the crate root of every path in `body` that
/// starts there (`crate::x`, `crate::{x, y::z}`, `super::x` climbing to the
/// root from a file `depth` modules deep), with its offset.
fn references(body: &str, depth: usize) -> Vec<(usize, String)> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    let mut out = Vec::new();
    let bytes = body.as_bytes();
    let boundary = |i: usize| {
        i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':')
    };
    for (i, _) in body.match_indices("crate::") {
        if !boundary(i) {
            continue;
        }
        let rest = &body[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            // The top-level names of the group.
            let mut level = 0;
            let mut start = true;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' if level == 0 => break,
                    '}' => level -= 1,
                    ',' if level == 0 => start = true,
                    c if start && !c.is_whitespace() => {
                        start = false;
                        out.push((i, ident(&group[j..])));
                    }
                    _ => {}
                }
            }
        } else {
            out.push((i, ident(rest)));
        }
    }
    for (i, _) in body.match_indices("super::") {
        if !boundary(i) {
            continue;
        }
        let mut rest = &body[i..];
        let mut ups = 0;
        while let Some(r) = rest.strip_prefix("super::") {
            ups += 1;
            rest = r;
        }
        if ups >= depth {
            out.push((i, ident(rest)));
        }
    }
    out
}

/// `text` without comments, string and character literals (each replaced
/// by spaces, newlines kept, so offsets and lines stay).
fn code(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut level = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    level += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    level -= 1;
                    out.push_str("  ");
                    i += 2;
                    if level == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && starts_word(
                &chars,
                if i > 0 && chars[i - 1] == 'b' {
                    i - 1
                } else {
                    i
                },
            )
        {
            // A raw string: r"..." or r#"..."# (or br"...").
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            let close: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let body: String = chars[j + 1..].iter().collect();
            let end = body.find(&close).map_or(chars.len(), |e| {
                j + 1 + body[..e].chars().count() + close.chars().count()
            });
            for &c in &chars[i..end] {
                out.push(blank(c));
            }
            i = end;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (chars.get(i + 2) == Some(&'\'') || next == Some('\\')) {
            // A character literal ('x', '\n', '\u{..}'); not a lifetime.
            let mut j = i + 1;
            if next == Some('\\') {
                j += 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
            } else {
                j += 1;
            }
            for _ in i..=j.min(chars.len() - 1) {
                out.push(' ');
            }
            i = j + 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether `chars[i]` starts a word (no identifier character before it).
fn starts_word(chars: &[char], i: usize) -> bool {
    i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_')
}

/// `code` without the items under `#[cfg(test)]` (blanked, lines kept).
fn without_tests(code: &str) -> String {
    let mut out = code.to_owned();
    let mut from = 0;
    while let Some(at) = out[from..].find("#[cfg(test)]") {
        let start = from + at;
        // The item ends at its first `;` or at the brace closing its first `{`.
        let bytes = out.as_bytes();
        let mut i = start + "#[cfg(test)]".len();
        let mut level = 0usize;
        while i < bytes.len() {
            match bytes[i] {
                b';' if level == 0 => break,
                b'{' => level += 1,
                b'}' => {
                    if level <= 1 {
                        break;
                    }
                    level -= 1;
                }
                _ => {}
            }
            i += 1;
        }
        let end = (i + 1).min(out.len());
        let blanked: String = out[start..end]
            .chars()
            .map(|c| if c == '\n' { '\n' } else { ' ' })
            .collect();
        out.replace_range(start..end, &blanked);
        from = end;
    }
    out
}

/// Every circle of the graph, one per strongly connected component of more
/// than one module, as `a → b (file:line) → ... → a`.
fn circles(graph: &Graph) -> Vec<String> {
    // Tarjan's strongly connected components.
    struct State<'g> {
        graph: &'g Graph,
        index: HashMap<&'g str, usize>,
        low: HashMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<&'g str>>,
    }
    fn visit<'g>(s: &mut State<'g>, v: &'g str) {
        let n = s.index.len();
        s.index.insert(v, n);
        s.low.insert(v, n);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flat_map(|e| e.keys()) {
            let w = w.as_str();
            if !s.graph.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v, low);
            } else if s.on_stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v, low);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            loop {
                let w = s.stack.pop().unwrap();
                s.on_stack.remove(w);
                component.push(w);
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.found
        .iter()
        .map(|component| {
            // One circle through the component: from its first module,
            // breadth-first back to it.
            let inside: BTreeSet<&str> = component.iter().copied().collect();
            let start = *inside.iter().next().unwrap();
            let mut came_from: HashMap<&str, &str> = HashMap::new();
            let mut queue = std::collections::VecDeque::from([start]);
            let mut last = None;
            'search: while let Some(v) = queue.pop_front() {
                for w in graph[v].keys().map(String::as_str) {
                    if w == start {
                        last = Some(v);
                        break 'search;
                    }
                    if inside.contains(w) && !came_from.contains_key(w) {
                        came_from.insert(w, v);
                        queue.push_back(w);
                    }
                }
            }
            let mut back = Vec::new();
            let mut v = last.expect("a circle closes");
            while v != start {
                back.push(v);
                v = came_from[v];
            }
            back.reverse();
            let path: Vec<&str> = std::iter::once(start)
                .chain(back)
                .chain(std::iter::once(start))
                .collect();
            let steps: Vec<String> = path
                .windows(2)
                .map(|p| {
                    let site = &graph[p[0]][p[1]];
                    format!("{} → {} ({}:{})", p[0], p[1], site.file, site.line)
                })
                .collect();
            format!(
                "  {} (modules in the circle: {})",
                steps.join(", "),
                component.join(", ")
            )
        })
        .collect()
}
