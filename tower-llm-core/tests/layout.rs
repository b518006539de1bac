//! The crate's files stay small and import each other in one direction
//! only: for each file of `src/`, the `crate::` and `super::` paths its
//! code uses (comments and its `tests` module aside) are mapped to the
//! files that define them, and no file may reach itself again through
//! them. A module's `mod.rs` naming its own children (`self::`) and
//! `lib.rs` are the crate's table of contents, not imports.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines of code (docs, comments, blank lines and tests aside)
/// one file may hold.
const MAX_CODE_LINES: usize = 600;

struct File {
    /// `call`, `layer::log`, `layer` (for `layer/mod.rs`), `lib`.
    module: String,
    /// The code: comment lines and the `tests` module removed.
    code: String,
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("src/ is readable") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn load(src: &Path) -> Vec<File> {
    let mut paths = Vec::new();
    files(src, &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|path| {
            let rel = path
                .strip_prefix(src)
                .expect("under src/")
                .with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if parts.last().is_some_and(|p| p == "mod") {
                parts.pop();
            }
            let text = fs::read_to_string(path).expect("a source file");
            let text = match text.find("#[cfg(test)]\nmod tests") {
                Some(at) => &text[..at],
                None => &text[..],
            };
            let code = text
                .lines()
                .filter(|l| !l.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            File {
                module: parts.join("::"),
                code,
            }
        })
        .collect()
}

fn ident(s: &str) -> (&str, &str) {
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    s.split_at(end)
}

/// The paths of one use tree (`a::{b, c::{d}}` gives `a::b` and `a::c::d`)
/// starting at `s`, and what follows it.
fn tree<'a>(s: &'a str, prefix: &[String], out: &mut Vec<Vec<String>>) -> &'a str {
    let s = s.trim_start();
    if let Some(mut rest) = s.strip_prefix('{') {
        loop {
            rest = rest.trim_start();
            if let Some(after) = rest.strip_prefix('}') {
                return after;
            }
            rest = tree(rest, prefix, out);
            rest = rest.trim_start();
            // ` as Name`
            if let Some(after) = rest.strip_prefix("as ") {
                rest = ident(after.trim_start()).1;
            }
            rest = rest.trim_start();
            rest = rest.strip_prefix(',').unwrap_or(rest);
            if rest.is_empty() {
                return rest;
            }
        }
    }
    let (name, rest) = ident(s);
    if name.is_empty() {
        return rest;
    }
    let mut path = prefix.to_vec();
    path.push(name.to_owned());
    match rest.strip_prefix("::") {
        Some(after) => tree(after, &path, out),
        None => {
            out.push(path);
            rest
        }
    }
}

/// The names of the items `code` defines at its top level (and the types
/// a macro such as `pin_project!` wraps), whatever their visibility.
fn definitions(code: &str) -> BTreeSet<String> {
    const KINDS: [&str; 10] = [
        "const fn ",
        "fn ",
        "struct ",
        "enum ",
        "trait ",
        "type ",
        "const ",
        "static ",
        "mod ",
        "macro_rules! ",
    ];
    let mut names = BTreeSet::new();
    for line in code.lines() {
        let indent = line.len() - line.trim_start().len();
        let mut l = line.trim_start();
        for vis in ["pub(crate) ", "pub(super) ", "pub "] {
            if let Some(rest) = l.strip_prefix(vis) {
                l = rest;
            }
        }
        let wrapped_type = indent == 4 && (l.starts_with("struct ") || l.starts_with("enum "));
        if indent != 0 && !wrapped_type {
            continue;
        }
        if let Some(rest) = KINDS.iter().find_map(|k| l.strip_prefix(k)) {
            names.insert(ident(rest).0.to_owned());
        }
    }
    names
}

/// Which files each file uses, by module name.
fn graph(files: &[File]) -> BTreeMap<String, BTreeSet<String>> {
    let modules: BTreeSet<&str> = files.iter().map(|f| f.module.as_str()).collect();
    let defs: BTreeMap<&str, BTreeSet<String>> = files
        .iter()
        .map(|f| (f.module.as_str(), definitions(&f.code)))
        .collect();
    let defined_in = |scope: &str, name: &str| -> Vec<String> {
        defs.iter()
            .filter(|(m, names)| {
                **m != "lib"
                    && (scope.is_empty() || **m == scope || m.starts_with(&format!("{scope}::")))
                    && names.contains(name)
            })
            .map(|(m, _)| (*m).to_owned())
            .collect()
    };
    let mut uses = BTreeMap::new();
    for file in files.iter().filter(|f| f.module != "lib") {
        let parent = match file.module.rsplit_once("::") {
            Some((parent, _)) => parent.to_owned(),
            None => String::new(),
        };
        let mut paths = Vec::new();
        for (at, base) in file
            .code
            .match_indices("crate::")
            .map(|(at, _)| (at, String::new()))
            .chain(
                file.code
                    .match_indices("super::")
                    .map(|(at, _)| (at, parent.clone())),
            )
        {
            let before = file.code[..at].chars().next_back();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            let start = at + file.code[at..].find("::").expect("a path") + 2;
            let mut found = Vec::new();
            tree(&file.code[start..], &[], &mut found);
            paths.extend(found.into_iter().map(|p| (base.clone(), p)));
        }
        let mut targets = BTreeSet::new();
        for (base, path) in paths {
            let mut scope = base;
            let mut rest = path.as_slice();
            while let Some((head, tail)) = rest.split_first() {
                let next = if scope.is_empty() {
                    head.clone()
                } else {
                    format!("{scope}::{head}")
                };
                if !modules.contains(next.as_str()) {
                    break;
                }
                scope = next;
                rest = tail;
            }
            match rest.first() {
                Some(name) => {
                    let found = defined_in(&scope, name);
                    if found.is_empty() {
                        // A method or variant path (`crate::a::f()`): the module.
                        targets.insert(scope);
                    } else {
                        targets.extend(found);
                    }
                }
                None => {
                    targets.insert(scope);
                }
            }
        }
        targets.remove(&file.module);
        targets.remove("");
        uses.insert(file.module.clone(), targets);
    }
    uses
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_two_files_import_each_other() {
    let uses = graph(&load(&src()));
    // Any cycle, not only pairs: a file must not reach itself.
    let mut cycles = Vec::new();
    for start in uses.keys() {
        let mut stack: Vec<(String, Vec<String>)> = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in uses.get(&at).into_iter().flatten() {
                if next == start {
                    cycles.push(trail.join(" -> ") + " -> " + start);
                } else if seen.insert(next.clone()) {
                    let mut trail = trail.clone();
                    trail.push(next.clone());
                    stack.push((next.clone(), trail));
                }
            }
        }
    }
    assert!(
        cycles.is_empty(),
        "files that import each other:\n{}",
        cycles.join("\n")
    );
    // The checker sees what it should: a few known edges.
    assert!(uses["chat"].contains("call"), "{uses:?}");
    assert!(uses["layer::owner"].contains("layer::log"), "{uses:?}");
    assert!(uses["error"].contains("record"), "{uses:?}");
}

#[test]
fn no_file_is_over_the_size_limit() {
    let over: Vec<String> = load(&src())
        .iter()
        .map(|f| {
            let lines = f.code.lines().filter(|l| !l.trim().is_empty()).count();
            (f, lines)
        })
        .filter(|(_, lines)| *lines > MAX_CODE_LINES)
        .map(|(f, lines)| format!("{}: {lines} lines of code", f.module))
        .collect();
    assert!(over.is_empty(), "{over:?}");
}

#[test]
fn the_checker_finds_a_circle() {
    let files = vec![
        File {
            module: "a".into(),
            code: "use crate::{B, c::C};".into(),
        },
        File {
            module: "b".into(),
            code: "pub struct B;\nfn f() { crate::a::g() }".into(),
        },
        File {
            module: "c".into(),
            code: "pub struct C;".into(),
        },
    ];
    let uses = graph(&files);
    assert_eq!(uses["a"], BTreeSet::from(["b".to_owned(), "c".to_owned()]));
    assert_eq!(uses["b"], BTreeSet::from(["a".to_owned()]));
}
