//! The documentation points at things that exist: in every Markdown file of
//! the repository (README.md, CONTRIBUTING.md, docs/, the packages'
//! READMEs), each relative link `[text](target)` names a file or directory
//! that exists (and, for a link into a Markdown file with `#anchor`, a
//! heading of that file), and each path written in the text that starts
//! with one of the repository's top-level directories (`src/pgconn.rs`,
//! `tests/faults/history.rs`, `docs/SCALING.md:42`) exists, from the
//! repository's root or from the file's own directory.
//!
//! No network, no build: it reads the files, and takes a few milliseconds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Directories at the repository's root whose paths the text names.
const TOP: &[&str] = &[
    "src",
    "crates",
    "tests",
    "docs",
    "deploy",
    "scripts",
    "clients",
    "migrations",
    "proto",
    "examples",
    "fuzz",
    ".sqlx",
    ".ci",
    ".cargo",
];

/// Paths the text names that are made by a command, not committed: each
/// with why it is fine that it does not exist in a checkout.
const MADE_BY_COMMANDS: &[(&str, &str)] = &[
    (
        "fuzz/artifacts",
        "cargo fuzz writes the inputs that crashed here",
    ),
    (
        "clients/go/leaseq/v1",
        "clients/go/generate.sh writes the generated Go package here",
    ),
    (
        "clients/node/.installed",
        "clients/setup.sh node-installed makes this project (the npm tarball installed)",
    ),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every Markdown file of the repository, relative to its root, but for
/// what tools install (node_modules, virtualenvs) and build (target).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let path = e.path();
            let name = e.file_name();
            let name = name.to_string_lossy();
            if path.is_dir() {
                let skip = name.starts_with('.') && name != ".ci"
                    || ["target", "node_modules", "dist", "proto"].contains(&name.as_ref())
                        && dir != root
                    || name == "target"
                    || name.ends_with("venv")
                    || name == "__pycache__";
                if !skip {
                    walk(root, &path, out);
                }
            } else if name.ends_with(".md") {
                out.push(path.strip_prefix(root).unwrap().to_path_buf());
            }
        }
    }
    let root = repo();
    let mut out = Vec::new();
    walk(&root, &root, &mut out);
    out.sort();
    out
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, punctuation
/// but `-` and `_` dropped; a repeated one gets `-1`, `-2`, ...
fn anchors(text: &str) -> HashSet<String> {
    let mut seen = HashSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let title = line.trim_start_matches('#');
        if !title.starts_with(' ') {
            continue;
        }
        let slug: String = title
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut candidate = slug.clone();
        let mut n = 1;
        while seen.contains(&candidate) {
            candidate = format!("{slug}-{n}");
            n += 1;
        }
        seen.insert(candidate);
    }
    seen
}

/// The targets of the inline links `[text](target)` of one line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let end = rest.find([')', ' ']).unwrap_or(rest.len());
        out.push(&rest[..end]);
        rest = &rest[end..];
    }
    out
}

/// The paths under [`TOP`] a line names: a run of path characters that
/// starts a word, with what ends a sentence (`.`, `,`, `:`, `;`) and a
/// `:line` suffix taken off.
fn named_paths(line: &str) -> Vec<String> {
    let is_path_char = |c: char| c.is_ascii_alphanumeric() || "_./-@+".contains(c);
    let chars: Vec<char> = line.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !is_path_char(chars[i - 1]) && chars[i - 1] != '$';
        if starts_word && is_path_char(chars[i]) {
            let mut j = i;
            while j < chars.len() && is_path_char(chars[j]) {
                j += 1;
            }
            let word: String = chars[i..j].iter().collect();
            // A placeholder or a glob follows: not one path.
            let next = chars.get(j).copied().unwrap_or(' ');
            let templated = matches!(next, '*' | '{' | '<' | '$');
            let top = word.split('/').next().unwrap_or("");
            if word.contains('/') && TOP.contains(&top) && !templated {
                let mut path = word.trim_end_matches(['.', ',', ';', ':']).to_owned();
                if let Some((p, line_no)) = path.rsplit_once(':')
                    && line_no.chars().all(|c| c.is_ascii_digit())
                {
                    path = p.to_owned();
                }
                out.push(path);
            }
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

fn made_by_a_command(path: &str) -> bool {
    MADE_BY_COMMANDS
        .iter()
        .any(|(p, _)| path == *p || path.starts_with(&format!("{p}/")))
}

#[test]
fn every_link_and_path_in_the_docs_exists() {
    let root = repo();
    let files = markdown_files();
    for must in ["README.md", "CONTRIBUTING.md", "docs/BENCHMARKS.md"] {
        assert!(
            files.iter().any(|f| f == Path::new(must)),
            "{must} is missing: {files:?}"
        );
    }
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let dir = file.parent().unwrap_or(Path::new(""));
        let mut fenced = false;
        for (n, line) in text.lines().enumerate() {
            let at = format!("{}:{}", file.display(), n + 1);
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            // Links (outside code blocks, where `](` is code).
            for target in if fenced {
                Vec::new()
            } else {
                link_targets(line)
            } {
                let external = target.contains("://")
                    || target.starts_with("mailto:")
                    || target.starts_with('#') && target.len() == 1;
                if external || target.is_empty() {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target, None),
                };
                let resolved = if path.is_empty() {
                    root.join(file)
                } else {
                    root.join(dir).join(path)
                };
                if !resolved.exists() {
                    broken.push(format!("{at}: link to {target}: no such file"));
                    continue;
                }
                if let Some(anchor) = anchor
                    && resolved.extension().is_some_and(|e| e == "md")
                {
                    let heads = anchors(&std::fs::read_to_string(&resolved).unwrap());
                    if !heads.contains(anchor) {
                        broken.push(format!("{at}: link to {target}: no heading #{anchor}"));
                    }
                }
            }
            // Paths named in the text (code blocks included: commands name
            // scripts and files too).
            for path in named_paths(line) {
                checked += 1;
                let exists = root.join(&path).exists() || root.join(dir).join(&path).exists();
                if !exists && !made_by_a_command(&path) {
                    broken.push(format!("{at}: names {path}, which does not exist"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken of {checked} links and paths:\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(
        checked > 300,
        "only {checked} links and paths found: the scan is broken"
    );
}

#[test]
fn the_scanner_finds_links_paths_and_anchors() {
    assert_eq!(
        link_targets("see [a](docs/A.md#x) and [b](../b.md), `[c](d)`"),
        vec!["docs/A.md#x", "../b.md", "d"]
    );
    assert_eq!(
        named_paths("in `src/pgconn.rs`, docs/DEPLOYMENT.md:42 and tests/{a,b}.rs, $HOME/docs/x"),
        vec!["src/pgconn.rs", "docs/DEPLOYMENT.md"]
    );
    assert_eq!(
        named_paths("migrations/*.sql; see clients/go/README.md."),
        vec!["clients/go/README.md"]
    );
    let a = anchors(
        "# leaseq\n## The two commands\n```\n# not a heading\n```\n## `--addr` & TLS\n## Two\n## Two\n",
    );
    for want in ["leaseq", "the-two-commands", "--addr--tls", "two", "two-1"] {
        assert!(a.contains(want), "{want}: {a:?}");
    }
    assert!(!a.contains("not-a-heading"));
}
