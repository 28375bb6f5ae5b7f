//! Checks on the crate's own source tree (run as unit tests): no import cycle between its
//! modules, no process exit outside the fault policy, the environment read in one place.
//!
//! A module's imports are the `crate::` and `super::` paths in its code (comments and doc
//! links excluded), resolved to the longest module path that exists; a child's use of an
//! ancestor (`super::` into its parent) does not count, as a module's items are its children's
//! context. The cycles are the strongly connected components (Tarjan) of that graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Every module of `src` (as `a::b`, the crate root as ``) with its code, comments removed.
fn modules(src: &Path) -> BTreeMap<String, String> {
    fn walk(dir: &Path, root: &Path, out: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(root).unwrap().with_extension("");
                let mut parts: Vec<String> = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                    parts.pop();
                }
                let code: String = std::fs::read_to_string(&path)
                    .unwrap()
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or(""))
                    .collect::<Vec<_>>()
                    .join("\n");
                out.insert(parts.join("::"), code);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(src, src, &mut out);
    out
}

/// The module paths a module's code names: `crate::a::b::Item` and `super::x`, with `use`
/// groups (`crate::a::{b, c::d}`) expanded.
fn imports(module: &str, code: &str, names: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = module.rsplit_once("::").map_or("", |(p, _)| p);
    let mut paths = Vec::new();
    let bytes = code.as_bytes();
    for (prefix, base) in [("crate::", String::new()), ("super::", parent.to_string())] {
        let mut at = 0;
        while let Some(i) = code[at..].find(prefix) {
            let start = at + i;
            at = start + prefix.len();
            if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
                continue;
            }
            // The path, braces included (balanced), up to the first other character.
            let mut end = at;
            let mut depth = 0;
            while end < bytes.len() {
                let c = bytes[end] as char;
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    c if c.is_alphanumeric() || c == '_' || c == ':' => {}
                    ',' | ' ' | '\n' if depth > 0 => {}
                    _ => break,
                }
                end += 1;
            }
            for p in expand(&code[at..end]) {
                let full = if base.is_empty() {
                    p
                } else {
                    format!("{base}::{p}")
                };
                paths.push(full);
            }
        }
    }
    paths
        .into_iter()
        .filter_map(|p| {
            let segs: Vec<&str> = p.split("::").filter(|s| !s.is_empty()).collect();
            (1..=segs.len())
                .rev()
                .map(|n| segs[..n].join("::"))
                .find(|m| names.contains(m))
        })
        .filter(|t| t != module && !module.starts_with(&format!("{t}::")))
        .collect()
}

/// `a::{b, c::{d, e}}` -> `a::b`, `a::c::d`, `a::c::e`.
fn expand(path: &str) -> Vec<String> {
    let path: String = path.chars().filter(|c| !c.is_whitespace()).collect();
    let Some(open) = path.find('{') else {
        return vec![path];
    };
    let (pre, inner) = (&path[..open], &path[open + 1..path.len().saturating_sub(1)]);
    let mut parts = Vec::new();
    let (mut depth, mut cur) = (0, String::new());
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if c == ',' && depth == 0 {
            parts.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(|p| expand(&format!("{pre}{p}")))
        .collect()
}

/// The strongly connected components of more than one module (Tarjan).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        for w in &s.edges[v] {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let l = s.low[v].min(s.low[w]);
                s.low.insert(v, l);
            } else if s.on.contains(w) {
                let l = s.low[v].min(s.index[w]);
                s.low.insert(v, l);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn no_import_cycle_between_modules() {
    let mods = modules(&src());
    let names: BTreeSet<String> = mods.keys().cloned().collect();
    let edges: BTreeMap<String, BTreeSet<String>> = mods
        .iter()
        .map(|(m, code)| (m.clone(), imports(m, code, &names)))
        .collect();
    // The checker sees an edge where there is one (it would not pass vacuously).
    assert!(edges["spmd"].contains("collective::engine"), "{edges:?}");
    assert!(edges["layout"].contains("mesh"), "{edges:?}");
    let found = cycles(&edges);
    assert!(found.is_empty(), "import cycles among modules: {found:?}");
    // And it finds one when there is one.
    let mut with_cycle = edges.clone();
    with_cycle
        .get_mut("mesh")
        .unwrap()
        .insert("layout".to_string());
    assert_eq!(cycles(&with_cycle), vec![vec!["layout", "mesh"]]);
}

#[test]
fn the_library_never_exits_the_process_and_reads_the_environment_in_one_place() {
    for (module, code) in modules(&src()) {
        if module == "architecture" {
            continue;
        }
        for banned in ["process::exit", "_exit("] {
            assert!(
                !code.contains(banned),
                "`{banned}` in module `{module}`: the library returns errors; a fatal fault \
                 ends the job through fault.rs's policy"
            );
        }
        // The launch environment (launchers' variables) is read where it is detected; the
        // library's own settings in config.rs.
        if code.contains("env::var") {
            assert!(
                ["config", "spmd::launch_env"].contains(&module.as_str()),
                "`env::var` in module `{module}`: settings go through Config (config.rs)"
            );
        }
    }
}
