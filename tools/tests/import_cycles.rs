//! No import circles (issue 39): every `.rs` under `src/` (the library), `tools/src/` and
//! `python/src/` is read into a file-level module graph, with an edge A -> B when code in A
//! names an item that B defines, through a `use` or a path (`crate::`, `super::`, `self::`, a
//! child module, an alias brought in by `use`, `flashattn::` and `flashattn_tools::` across the
//! crates). Re-exports are followed to the module that defines the item, so that a facade
//! (`pub use host::try_host_forward` in `cuda/mod.rs`) cannot hide a circle; a `pub use` line
//! itself is no edge, since every path through it is charged to the definer. A small hand
//! parser (comments, strings and char literals skipped; braces tracked for inline modules and
//! for which items sit at module level); no new dependency. Each circle is named by its files,
//! with the path that makes each step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::{Path, PathBuf};

// ---- tokens -------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    Path,
    Punct(char),
}

/// Rust source to identifiers, `::` and single punctuation; comments, literals, lifetimes and
/// numbers are dropped (they cannot name a module).
fn tokens(src: &str) -> Vec<Tok> {
    let c: Vec<char> = src.chars().collect();
    let (mut i, mut out) = (0, Vec::new());
    let at = |i: usize| c.get(i).copied().unwrap_or('\0');
    while i < c.len() {
        let ch = c[i];
        if ch.is_whitespace() {
            i += 1;
        } else if ch == '/' && at(i + 1) == '/' {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if ch == '/' && at(i + 1) == '*' {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && at(i + 1) == '*' {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && at(i + 1) == '/' {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if (ch == 'r' || ch == 'b') && raw_string_start(&c, i).is_some() {
            let (body, hashes) = raw_string_start(&c, i).unwrap();
            i = body;
            // Ends at a quote followed by the same number of hashes.
            while i < c.len() {
                if c[i] == '"' && (1..=hashes).all(|k| at(i + k) == '#') {
                    i += 1 + hashes;
                    break;
                }
                i += 1;
            }
        } else if ch == '"' || (ch == 'b' && at(i + 1) == '"') {
            i += if ch == 'b' { 2 } else { 1 };
            while i < c.len() && c[i] != '"' {
                i += if c[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ch == '\'' || (ch == 'b' && at(i + 1) == '\'') {
            // A char literal ('a', '\n', '\u{1F}') or a lifetime ('a, 'static).
            let s = if ch == 'b' { i + 1 } else { i };
            if at(s + 1) == '\\' {
                i = s + 2;
                while i < c.len() && c[i] != '\'' {
                    i += 1;
                }
                i += 1;
            } else if at(s + 2) == '\'' {
                i = s + 3;
            } else {
                i = s + 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
        } else if ch.is_alphabetic() || ch == '_' {
            if ch == 'r' && at(i + 1) == '#' {
                i += 2;
            }
            let s = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            out.push(Tok::Ident(c[s..i].iter().collect()));
        } else if ch.is_ascii_digit() {
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == '.') {
                // `1..n` is a range, not part of the number.
                if c[i] == '.' && at(i + 1) == '.' {
                    break;
                }
                i += 1;
            }
        } else if ch == ':' && at(i + 1) == ':' {
            out.push(Tok::Path);
            i += 2;
        } else {
            out.push(Tok::Punct(ch));
            i += 1;
        }
    }
    out
}

/// At `r"`, `r#"`, `br"`, `br#"`: (index of the body, number of hashes).
fn raw_string_start(c: &[char], i: usize) -> Option<(usize, usize)> {
    let mut j = i;
    if c.get(j) == Some(&'b') {
        j += 1;
    }
    if c.get(j) != Some(&'r') {
        return None;
    }
    // Not the end of an identifier such as `for` or `bar`.
    if i > 0 && (c[i - 1].is_alphanumeric() || c[i - 1] == '_') {
        return None;
    }
    j += 1;
    let mut hashes = 0;
    while c.get(j) == Some(&'#') {
        hashes += 1;
        j += 1;
    }
    (c.get(j) == Some(&'"')).then_some((j + 1, hashes))
}

// ---- modules ------------------------------------------------------------------------------

/// A module: crate name and path inside the crate.
type ModId = (String, Vec<String>);

/// One `use` leaf: where it was written, its path as written, and the name it binds (`None`
/// for a glob).
#[derive(Debug, Clone)]
struct UseLeaf {
    segs: Vec<String>,
    bind: Option<String>,
    public: bool,
    module_level: bool,
}

#[derive(Debug, Default)]
struct Module {
    file: String,
    children: BTreeSet<String>,
    items: BTreeSet<String>,
    uses: Vec<UseLeaf>,
    /// Paths written in code (not in `use`), as segments.
    paths: Vec<Vec<String>>,
    /// `mod x;` declarations: (name, names of the inline modules around it).
    file_children: Vec<String>,
}

struct Graph {
    modules: BTreeMap<ModId, Module>,
    /// file -> file -> an example path that makes the edge.
    edges: BTreeMap<String, BTreeMap<String, String>>,
}

const ITEM_KEYWORDS: [&str; 8] = [
    "fn", "struct", "enum", "trait", "type", "const", "static", "union",
];

/// Parses a use tree starting at `toks[i]` (after `use`); returns the leaves and the index
/// after the closing `;` or `}`.
fn use_tree(
    toks: &[Tok],
    mut i: usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, Option<String>)>,
) -> usize {
    let mut segs = prefix.to_vec();
    if toks.get(i) == Some(&Tok::Path) {
        i += 1; // `use ::std::...`: an extern crate.
    }
    loop {
        match toks.get(i) {
            Some(Tok::Ident(name)) => {
                segs.push(name.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                let mut bind = segs.last().cloned();
                if toks.get(i) == Some(&Tok::Ident("as".into())) {
                    bind = match toks.get(i + 1) {
                        Some(Tok::Ident(a)) if a != "_" => Some(a.clone()),
                        _ => None,
                    };
                    i += 2;
                }
                // `use a::b::{self}` binds `b`.
                if segs.last().map(String::as_str) == Some("self") {
                    segs.pop();
                    if bind.as_deref() == Some("self") {
                        bind = segs.last().cloned();
                    }
                }
                out.push((segs, bind));
                return i;
            }
            Some(Tok::Punct('*')) => {
                out.push((segs, None));
                return i + 1;
            }
            Some(Tok::Punct('{')) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Punct('}')) => return i + 1,
                        Some(Tok::Punct(',')) => i += 1,
                        None => return i,
                        _ => i = use_tree(toks, i, &segs, out),
                    }
                }
            }
            _ => return i + 1,
        }
    }
}

/// Reads one file of module `id` into the graph (inline modules become modules of their own,
/// in the same file).
fn read_file(g: &mut Graph, id: &ModId, file: &str, src: &str) {
    let toks = tokens(src);
    // (module, the brace depth of its body)
    let mut stack: Vec<(ModId, usize)> = vec![(id.clone(), 0)];
    let mut depth = 0usize;
    let mut i = 0;
    g.modules.entry(id.clone()).or_default().file = file.to_string();
    while i < toks.len() {
        let (cur, body) = stack.last().cloned().unwrap();
        let at_module_level = depth == body;
        match &toks[i] {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                if depth == body && stack.len() > 1 {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
            }
            Tok::Ident(kw) if kw == "mod" => {
                let Some(Tok::Ident(name)) = toks.get(i + 1) else {
                    i += 1;
                    continue;
                };
                let name = name.clone();
                g.modules
                    .get_mut(&cur)
                    .unwrap()
                    .children
                    .insert(name.clone());
                let mut child = cur.clone();
                child.1.push(name.clone());
                if toks.get(i + 2) == Some(&Tok::Punct('{')) {
                    let m = g.modules.entry(child.clone()).or_default();
                    m.file = file.to_string();
                    depth += 1;
                    stack.push((child, depth));
                    i += 3;
                } else {
                    g.modules.get_mut(&cur).unwrap().file_children.push(name);
                    i += 2;
                }
            }
            Tok::Ident(kw) if kw == "use" => {
                let public = i > 0
                    && (toks[i - 1] == Tok::Ident("pub".into())
                        || (toks[i - 1] == Tok::Punct(')')
                            && toks[..i]
                                .iter()
                                .rev()
                                .take(5)
                                .any(|t| *t == Tok::Ident("pub".into()))));
                let mut leaves = Vec::new();
                i = use_tree(&toks, i + 1, &[], &mut leaves);
                let m = g.modules.get_mut(&cur).unwrap();
                for (segs, bind) in leaves {
                    m.uses.push(UseLeaf {
                        segs,
                        bind,
                        public,
                        module_level: at_module_level,
                    });
                }
            }
            Tok::Ident(kw) if at_module_level && ITEM_KEYWORDS.contains(&kw.as_str()) => {
                // `const fn f`, `const unsafe fn f`: the name follows `fn`.
                let mut j = i + 1;
                while matches!(toks.get(j), Some(Tok::Ident(w)) if w == "fn" || w == "unsafe" || w == "async" || w == "extern")
                {
                    j += 1;
                }
                if let Some(Tok::Ident(name)) = toks.get(j) {
                    g.modules.get_mut(&cur).unwrap().items.insert(name.clone());
                }
                i = j + 1;
            }
            Tok::Ident(kw) if kw == "macro_rules" && toks.get(i + 1) == Some(&Tok::Punct('!')) => {
                if let Some(Tok::Ident(name)) = toks.get(i + 2) {
                    g.modules.get_mut(&cur).unwrap().items.insert(name.clone());
                }
                i += 3;
            }
            Tok::Ident(first) => {
                // The start of a path `a::b::c` (not the middle of one).
                let starts = i == 0 || toks[i - 1] != Tok::Path;
                let mut segs = vec![first.clone()];
                let mut j = i + 1;
                while toks.get(j) == Some(&Tok::Path) {
                    match toks.get(j + 1) {
                        Some(Tok::Ident(s)) => {
                            segs.push(s.clone());
                            j += 2;
                        }
                        _ => break,
                    }
                }
                if starts && segs.len() > 1 {
                    g.modules.get_mut(&cur).unwrap().paths.push(segs);
                }
                i = j.max(i + 1);
            }
            _ => i += 1,
        }
    }
}

/// The crates read: (crate name, root file relative to the repository).
fn crates() -> Vec<(&'static str, &'static str)> {
    vec![
        ("flashattn", "src/lib.rs"),
        ("flashattn_tools", "tools/src/lib.rs"),
        ("flashattn_bin", "tools/src/main.rs"),
        ("flashattn_py", "python/src/lib.rs"),
    ]
}

/// Builds the graph of the crates `roots` from `files` (path relative to the repository ->
/// source), following `mod x;` declarations from each root.
fn build(files: &BTreeMap<String, String>, roots: &[(&str, &str)]) -> Graph {
    let mut g = Graph {
        modules: BTreeMap::new(),
        edges: BTreeMap::new(),
    };
    for &(krate, root) in roots {
        let Some(src) = files.get(root) else { continue };
        let id: ModId = (krate.to_string(), vec![]);
        let mut queue = VecDeque::from([(id, root.to_string(), src.clone())]);
        while let Some((id, file, src)) = queue.pop_front() {
            read_file(&mut g, &id, &file, &src);
            // The directory of this file's child modules.
            let p = Path::new(&file);
            let stem = p.file_stem().unwrap().to_string_lossy().to_string();
            let parent = p.parent().unwrap_or(Path::new(""));
            let dir: PathBuf = if file == root || stem == "mod" {
                parent.to_path_buf()
            } else {
                parent.join(&stem)
            };
            // Modules declared with `mod x;` in this file (inline modules add a folder level).
            let declared: Vec<(ModId, String)> = g
                .modules
                .iter()
                .filter(|(m, md)| md.file == file && m.0 == id.0 && m.1.starts_with(&id.1))
                .flat_map(|(m, md)| {
                    let extra = m.1[id.1.len()..].to_vec();
                    md.file_children.iter().map(move |c| {
                        let mut child = m.clone();
                        child.1.push(c.clone());
                        let mut d = extra.join("/");
                        if !d.is_empty() {
                            d.push('/');
                        }
                        (child, format!("{d}{c}"))
                    })
                })
                .collect();
            for (child, rel) in declared {
                for cand in [dir.join(format!("{rel}.rs")), dir.join(&rel).join("mod.rs")] {
                    let cand = cand.to_string_lossy().to_string();
                    if let Some(src) = files.get(&cand) {
                        queue.push_back((child.clone(), cand, src.clone()));
                        break;
                    }
                }
            }
            // Each module is read once.
            for m in g.modules.values_mut().filter(|m| m.file == file) {
                m.file_children.clear();
            }
        }
    }
    let crate_names: BTreeSet<String> = roots.iter().map(|r| r.0.to_string()).collect();
    // Edges: every non-`pub` use and every path, resolved to its defining module.
    let ids: Vec<ModId> = g.modules.keys().cloned().collect();
    for id in ids {
        let m = &g.modules[&id];
        let from = m.file.clone();
        let mut named: Vec<(Vec<String>, bool)> = Vec::new();
        for u in &m.uses {
            if !u.public {
                named.push((u.segs.clone(), u.bind.is_none()));
            }
        }
        for p in &m.paths {
            named.push((p.clone(), false));
        }
        for (segs, glob) in named {
            let Some(start) = absolute(&g, &crate_names, &id, &segs) else {
                continue;
            };
            let target = resolve(&g, &start.0, &start.1, 0);
            let to = match target {
                Target::Item(m) => g.modules[&m].file.clone(),
                // A glob names every item of the module; a module alone names none.
                Target::Module(m) if glob => g.modules[&m].file.clone(),
                Target::Module(_) => continue,
            };
            if to != from {
                g.edges
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| segs.join("::"));
            }
        }
    }
    g
}

enum Target {
    Item(ModId),
    Module(ModId),
}

/// A path as written in module `at` to (module where resolution starts, remaining names);
/// `None` for paths outside the crates read (std, cudarc, a local variable's method...).
fn absolute(
    g: &Graph,
    crates: &BTreeSet<String>,
    at: &ModId,
    segs: &[String],
) -> Option<(ModId, Vec<String>)> {
    let first = segs.first()?.as_str();
    let rest = segs[1..].to_vec();
    match first {
        "crate" => Some(((at.0.clone(), vec![]), rest)),
        "self" => Some((at.clone(), rest)),
        "super" => {
            let mut m = at.clone();
            let mut r: &[String] = segs;
            while r.first().map(String::as_str) == Some("super") {
                m.1.pop();
                r = &r[1..];
            }
            Some((m, r.to_vec()))
        }
        // The binary's library and the library as other crates see them.
        "flashattn" if at.0 != "flashattn" => Some((("flashattn".into(), vec![]), rest)),
        "flashattn_tools" if crates.contains("flashattn_tools") => {
            Some((("flashattn_tools".into(), vec![]), rest))
        }
        _ => {
            // A child module, an item or a `use` binding of this module (or an enclosing
            // one, for a path inside a function of an inline module).
            let m = g.modules.get(at)?;
            if m.children.contains(first) || m.items.contains(first) {
                return Some((at.clone(), segs.to_vec()));
            }
            let u = m.uses.iter().find(|u| u.bind.as_deref() == Some(first))?;
            let mut full = u.segs.clone();
            full.extend(rest);
            // `use foo;` of an extern crate `foo` binds `foo` to itself.
            if full.first() == segs.first() {
                return None;
            }
            // The use's own path is relative to the module it is written in.
            absolute(g, crates, at, &full)
        }
    }
}

/// Follows `names` from module `m` to the module that defines the item they name.
fn resolve(g: &Graph, m: &ModId, names: &[String], depth: usize) -> Target {
    let Some(md) = g.modules.get(m) else {
        return Target::Module(m.clone());
    };
    let Some(n) = names.first() else {
        return Target::Module(m.clone());
    };
    if depth > 32 {
        return Target::Item(m.clone());
    }
    if md.children.contains(n) {
        let mut c = m.clone();
        c.1.push(n.clone());
        if g.modules.contains_key(&c) {
            return resolve(g, &c, &names[1..], depth + 1);
        }
    }
    if md.items.contains(n) {
        return Target::Item(m.clone());
    }
    // A name brought in by `use` at module level (any visibility: children see private ones).
    let crates: BTreeSet<String> = crate_names_of(g);
    for u in md.uses.iter().filter(|u| u.module_level) {
        if u.bind.as_deref() == Some(n.as_str()) {
            let mut full = u.segs.clone();
            full.extend(names[1..].iter().cloned());
            if let Some((start, rest)) = absolute(g, &crates, m, &full)
                && (start != *m || rest != names)
            {
                return resolve(g, &start, &rest, depth + 1);
            }
        }
    }
    for u in md
        .uses
        .iter()
        .filter(|u| u.module_level && u.bind.is_none())
    {
        if let Some((start, rest)) = absolute(g, &crates, m, &u.segs)
            && rest.is_empty()
            && start != *m
            && let Target::Item(t) = resolve(g, &start, names, depth + 1)
        {
            return Target::Item(t);
        }
    }
    // Not found (generated by a macro, say): charge the module reached.
    Target::Item(m.clone())
}

fn crate_names_of(g: &Graph) -> BTreeSet<String> {
    g.modules.keys().map(|m| m.0.clone()).collect()
}

// ---- cycles -------------------------------------------------------------------------------

/// The strongly connected components of more than one file, each as one circle through its
/// first file (shortest), with the path that makes each step: "a.rs -> b.rs (crate::b::f)".
fn cycles(g: &Graph) -> Vec<String> {
    let nodes: Vec<String> = g
        .edges
        .iter()
        .flat_map(|(a, bs)| std::iter::once(a.clone()).chain(bs.keys().cloned()))
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let reach = |from: &str| -> BTreeSet<String> {
        let mut seen = BTreeSet::from([from.to_string()]);
        let mut q = VecDeque::from([from.to_string()]);
        while let Some(n) = q.pop_front() {
            for m in g.edges.get(&n).into_iter().flat_map(|e| e.keys()) {
                if seen.insert(m.clone()) {
                    q.push_back(m.clone());
                }
            }
        }
        seen
    };
    let reach_of: BTreeMap<String, BTreeSet<String>> =
        nodes.iter().map(|n| (n.clone(), reach(n))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for n in &nodes {
        if done.contains(n) {
            continue;
        }
        let scc: BTreeSet<String> = reach_of[n]
            .iter()
            .filter(|m| reach_of[*m].contains(n))
            .cloned()
            .collect();
        done.extend(scc.iter().cloned());
        if scc.len() < 2 {
            continue;
        }
        // Shortest way back to n inside the component.
        let mut prev: BTreeMap<String, String> = BTreeMap::new();
        let mut q = VecDeque::from([n.clone()]);
        'bfs: while let Some(a) = q.pop_front() {
            for b in g.edges.get(&a).into_iter().flat_map(|e| e.keys()) {
                if !scc.contains(b) || prev.contains_key(b) {
                    continue;
                }
                prev.insert(b.clone(), a.clone());
                if b == n {
                    break 'bfs;
                }
                q.push_back(b.clone());
            }
        }
        let mut ring = vec![n.clone()];
        let mut at = prev[n].clone();
        while at != *n {
            ring.push(at.clone());
            at = prev[&at].clone();
        }
        ring.push(n.clone());
        ring.reverse();
        let steps: Vec<String> = ring
            .windows(2)
            .map(|w| format!("{} -> {} ({})", w[0], w[1], g.edges[&w[0]][&w[1]]))
            .collect();
        let members: Vec<&str> = scc.iter().map(String::as_str).collect();
        out.push(format!(
            "circle of {} files [{}]: {}",
            scc.len(),
            members.join(", "),
            steps.join("; ")
        ));
    }
    out
}

// ---- the repository -----------------------------------------------------------------------

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` under the crates' source folders, keyed by its path from the repository root.
fn repo_files() -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(root, &p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                let rel = p.strip_prefix(root).unwrap().to_string_lossy().to_string();
                out.insert(rel, std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let root = repo();
    let mut files = BTreeMap::new();
    for d in ["src", "tools/src", "python/src"] {
        walk(&root, &root.join(d), &mut files);
    }
    files
}

/// The circles among files under `prefix`.
fn circles_under(prefix: &str) -> Vec<String> {
    let g = build(&repo_files(), &crates());
    assert!(
        g.modules.len() > 20,
        "the module tree was not read: {} modules",
        g.modules.len()
    );
    cycles(&g)
        .into_iter()
        .filter(|c| {
            let files = &c[c.find('[').unwrap() + 1..c.find(']').unwrap()];
            files.split(", ").any(|f| f.starts_with(prefix))
        })
        .collect()
}

#[test]
fn tools_have_no_import_circles() {
    let found = circles_under("tools/src/");
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn python_binding_has_no_import_circles() {
    let found = circles_under("python/src/");
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn library_has_no_import_circles() {
    let found = circles_under("src/");
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

// ---- the check itself ---------------------------------------------------------------------

fn synthetic(inner_calls_a: bool) -> BTreeMap<String, String> {
    let call = if inner_calls_a { "crate::a::fa()" } else { "0" };
    BTreeMap::from([
        (
            "x/lib.rs".to_string(),
            "//! use crate::a; (a comment)\npub mod a;\npub mod b;\npub use b::helper;\n".to_string(),
        ),
        (
            "x/a.rs".to_string(),
            "use crate::helper;\npub fn fa() -> u32 { let s = \"crate::b::c\"; helper() }\n"
                .to_string(),
        ),
        (
            "x/b/mod.rs".to_string(),
            "mod inner;\npub use self::inner::helper;\n#[cfg(test)]\nmod tests {\n    use super::*;\n}\n"
                .to_string(),
        ),
        (
            "x/b/inner.rs".to_string(),
            format!("/// Helps.\npub fn helper() -> u32 {{ {call} }}\n"),
        ),
    ])
}

/// A circle through two re-exports (a.rs names `crate::helper`, which lib.rs re-exports from
/// b, which re-exports it from b/inner.rs; inner.rs calls back into a) is found and named.
#[test]
fn a_circle_hidden_by_re_exports_is_found() {
    let g = build(&synthetic(true), &[("x", "x/lib.rs")]);
    let found = cycles(&g);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].contains("x/a.rs -> x/b/inner.rs (crate::helper)")
            && found[0].contains("x/b/inner.rs -> x/a.rs (crate::a::fa)"),
        "{found:?}"
    );
}

/// The same tree without the call back has no circle (the facade b/mod.rs and the comment and
/// string that look like paths are no edges).
#[test]
fn a_tree_without_circles_passes() {
    let g = build(&synthetic(false), &[("x", "x/lib.rs")]);
    assert!(cycles(&g).is_empty(), "{:?}", cycles(&g));
    assert_eq!(
        g.edges.keys().collect::<Vec<_>>(),
        vec!["x/a.rs"],
        "{:?}",
        g.edges
    );
}
