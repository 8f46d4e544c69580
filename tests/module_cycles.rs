//! No circles between the modules of a crate (issue 21): for every crate in the workspace, each
//! `crate::a::b` and `super::x` path in its sources (tests and comments aside) is an arrow from the
//! module that names it to the module named, taken at the level where the two part (a module's own
//! children do not count); the arrows must form no cycle. Fails naming each cycle and its arrows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// The crates' source folders, from the workspace root.
const CRATES: &[&str] = &[
    "src",
    "proxy/src",
    "store/src",
    "engine/src",
    "engine/formats/src",
    "replay/src",
    "kernels/src",
    "common/src",
    "http/src",
    "numerics/src",
    "testkit/src",
];

/// Crates whose modules name no sibling (a root over leaves): no arrows is their true answer.
const FLAT: &[&str] = &["common/src", "http/src", "numerics/src", "testkit/src"];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`; `lib.rs` and `main.rs` the root.
fn module_of(root: &Path, file: &Path) -> Module {
    let rel = file.strip_prefix(root).unwrap().with_extension("");
    let mut parts: Module = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// What a byte of source is part of: code, a string or char literal, or a comment.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Code,
    Literal,
    Comment,
}

/// Each byte's kind: comments (nested `/* */` too), strings (raw and byte ones too) and char literals,
/// told apart from lifetimes, so that braces and `//` inside them are not taken for code.
fn kinds(text: &str) -> Vec<Kind> {
    let b = text.as_bytes();
    let ident = |i: usize| b[i].is_ascii_alphanumeric() || b[i] == b'_';
    let mut kinds = vec![Kind::Code; b.len()];
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let kind = if b[i..].starts_with(b"//") {
            i = b[i..].iter().position(|&c| c == b'\n').map_or(b.len(), |n| i + n);
            Kind::Comment
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            Kind::Comment
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            Kind::Literal
        } else if b[i] == b'r'
            && (i == 0 || !ident(i - 1) || (matches!(b[i - 1], b'b' | b'c') && (i == 1 || !ident(i - 2))))
            && b[i + 1..].iter().position(|&c| c != b'#').is_some_and(|n| b[i + 1 + n] == b'"')
        {
            // r"..", r#".."#, br"..": ends at a quote followed by as many hashes as it opened with.
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            let close: Vec<u8> = std::iter::once(b'"').chain(std::iter::repeat_n(b'#', hashes)).collect();
            let body = i + 2 + hashes;
            i = b[body..].windows(close.len()).position(|w| w == close).map_or(b.len(), |n| body + n + close.len());
            Kind::Literal
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\'', '\u{..}', 'é'), else a lifetime or a label.
            let len = text[i + 1..].chars().next().map_or(0, char::len_utf8);
            if b.get(i + 1) == Some(&b'\\') {
                i = b.get(i + 3..).and_then(|r| r.iter().position(|&c| c == b'\'')).map_or(b.len(), |n| i + 3 + n + 1);
                Kind::Literal
            } else if len > 0 && b.get(i + 1 + len) == Some(&b'\'') {
                i += len + 2;
                Kind::Literal
            } else {
                i += 1;
                Kind::Code
            }
        } else {
            i += 1;
            Kind::Code
        };
        kinds[start..i.min(b.len())].fill(kind);
    }
    kinds
}

/// Where the item (or statement) that starts at `from` ends: at its first `;` outside brackets, or
/// at the `}` that closes its first outermost brace (or at a bracket closing one opened before it).
fn item_end(b: &[u8], kinds: &[Kind], from: usize) -> usize {
    let mut depth = 0usize;
    for i in from..b.len() {
        if kinds[i] != Kind::Code {
            continue;
        }
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' if depth == 0 => return i,
            b')' | b']' => depth -= 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            b';' if depth == 0 => return i + 1,
            _ => {}
        }
    }
    b.len()
}

/// The source without its comments and without each `#[cfg(test)]` item (a `mod tests { .. }` or
/// any other gated item, found by brace matching), wherever in the file it stands.
fn code(text: &str) -> String {
    const GATE: &str = "#[cfg(test)]";
    let b = text.as_bytes();
    let kinds = kinds(text);
    let mut out = String::with_capacity(text.len());
    let mut from = 0;
    for (at, _) in text.match_indices(GATE) {
        if at < from || kinds[at] != Kind::Code {
            continue;
        }
        out.push_str(&text[from..at]);
        from = item_end(b, &kinds, at + GATE.len());
    }
    out.push_str(&text[from..]);
    // Comments become spaces (newlines kept), so no path runs across one.
    let kinds = self::kinds(&out);
    out.char_indices().map(|(i, c)| if kinds[i] == Kind::Comment && c != '\n' { ' ' } else { c }).collect()
}

/// Module paths named after `prefix` (`crate::` or `super::`): runs of `ident::ident...`.
fn paths_after<'a>(code: &'a str, prefix: &'a str) -> impl Iterator<Item = Module> + 'a {
    code.match_indices(prefix).filter_map(move |(at, _)| {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') || code[..at].ends_with("::") {
            return None;
        }
        let rest = &code[at + prefix.len()..];
        let mut parts = Vec::new();
        let mut rest = rest;
        loop {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
            let ident = &rest[..end];
            if ident.is_empty() || !ident.starts_with(|c: char| c.is_ascii_lowercase() || c == '_') {
                break;
            }
            parts.push(ident.to_string());
            match rest[end..].strip_prefix("::") {
                Some(next) => rest = next,
                None => break,
            }
        }
        (!parts.is_empty()).then_some(parts)
    })
}

/// The arrows between sibling modules of one crate.
fn arrows(root: &Path) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let modules: BTreeMap<Module, PathBuf> = files.iter().map(|f| (module_of(root, f), f.clone())).collect();
    let mut arrows: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, file) in &modules {
        let name = file.file_name().unwrap().to_string_lossy();
        if name == "tests.rs" || name == "testutil.rs" {
            continue;
        }
        let code = code(&std::fs::read_to_string(file).unwrap());
        // `super` is the parent module (of `a::b` in a/b.rs as in a/b/mod.rs), each further one its parent.
        let relative = paths_after(&code, "super::").filter_map(|path| {
            let ups = 1 + path.iter().take_while(|p| *p == "super").count();
            let base = module.len().checked_sub(ups)?;
            Some([module[..base].to_vec(), path[ups - 1..].to_vec()].concat())
        });
        let named = paths_after(&code, "crate::").chain(relative);
        for path in named {
            // The longest prefix that is a module of this crate.
            let Some(target) = (1..=path.len()).rev().map(|k| path[..k].to_vec()).find(|m| modules.contains_key(m)) else { continue };
            let common = module.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common >= module.len() || common >= target.len() {
                continue; // the module itself, an ancestor or a descendant
            }
            arrows.entry(module[..=common].to_vec()).or_default().insert(target[..=common].to_vec());
        }
    }
    arrows
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(arrows: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    struct State<'a> {
        arrows: &'a BTreeMap<Module, BTreeSet<Module>>,
        index: BTreeMap<Module, usize>,
        low: BTreeMap<Module, usize>,
        stack: Vec<Module>,
        found: Vec<Vec<Module>>,
    }
    fn visit(s: &mut State, v: &Module) {
        let n = s.index.len();
        s.index.insert(v.clone(), n);
        s.low.insert(v.clone(), n);
        s.stack.push(v.clone());
        for w in s.arrows.get(v).into_iter().flatten() {
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.low[v].min(s.low[w]);
                s.low.insert(v.clone(), low);
            } else if s.stack.contains(w) {
                let low = s.low[v].min(s.index[w]);
                s.low.insert(v.clone(), low);
            }
        }
        if s.low[v] == s.index[v] {
            let at = s.stack.iter().position(|m| m == v).unwrap();
            let component: Vec<Module> = s.stack.drain(at..).collect();
            if component.len() > 1 {
                s.found.push(component);
            }
        }
    }
    let mut s = State { arrows, index: BTreeMap::new(), low: BTreeMap::new(), stack: Vec::new(), found: Vec::new() };
    for v in arrows.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.found
}

#[test]
fn no_module_cycles_inside_any_crate() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = Vec::new();
    for krate in CRATES {
        let arrows = arrows(&workspace.join(krate));
        assert!(!arrows.is_empty() || FLAT.contains(krate), "{krate}: no arrows found at all; is the scan broken?");
        for cycle in cycles(&arrows) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            let inside: Vec<String> = cycle
                .iter()
                .flat_map(|a| arrows[a].iter().filter(|b| cycle.contains(b)).map(move |b| format!("{} -> {}", a.join("::"), b.join("::"))))
                .collect();
            report.push(format!("{krate}: {} ({})", names.join(", "), inside.join("; ")));
        }
    }
    assert!(report.is_empty(), "module cycles:\n{}", report.join("\n"));
}

#[test]
fn the_scan_finds_a_planted_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\n").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::Thing;\n// crate::c::Ignored in a comment\n").unwrap();
    std::fs::create_dir(src.join("b")).unwrap();
    std::fs::write(src.join("b/mod.rs"), "mod inner;\npub struct Thing;\n").unwrap();
    std::fs::write(src.join("b/inner.rs"), "use super::super::a::X;\nuse super::Thing;\n").unwrap();
    let arrows = arrows(src);
    let found = cycles(&arrows);
    assert_eq!(found.len(), 1, "{arrows:?}");
    let mut names: Vec<String> = found[0].iter().map(|m| m.join("::")).collect();
    names.sort();
    assert_eq!(names, ["a", "b"]);
}

#[test]
fn the_scan_reads_on_past_an_early_test_module() {
    let source = r##"
use crate::a::One;
#[cfg(test)]
mod tests {
    use crate::hidden::Two;
    const BRACES: &str = "}}} // {";
    const RAW: &str = r#"}" }"#;
    fn f<'a>(x: &'a str) -> char { let _ = x; /* } */ '}' }
}
#[cfg(test)]
fn gated() -> Vec<crate::gated::Three> { Vec::new() }
#[cfg(test)]
use crate::gated_use::Four;
// crate::commented::Five
pub fn after() -> crate::b::Six { let url = "http://x"; crate::c::seven(url) }
"##;
    let code = code(source);
    let paths: Vec<String> = paths_after(&code, "crate::").map(|p| p.join("::")).collect();
    assert_eq!(paths, ["a", "b", "c::seven"], "{code}");
}
