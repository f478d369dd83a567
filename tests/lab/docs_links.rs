//! The user's documents hold together: every relative link and `#anchor` of the README, the
//! CHANGELOG, the crate's README and the guide (`docs/guide/*.md`) resolves (anchors by GitHub's
//! rules), every Rust example in them is a doc test of `burn-sdpa` (so it compiles and runs), and
//! the README stays a page (at most 150 lines of at most 100 characters).
//!
//! No Markdown crate: a line scanner that skips fenced code and inline code spans is enough for
//! what these pages use (inline links, images, reference definitions, ATX headings).

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

/// The repository root (the root package's manifest folder).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The documents a user reads, relative to the root.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![
        PathBuf::from("README.md"),
        PathBuf::from("CHANGELOG.md"),
        PathBuf::from("crates/burn-sdpa/README.md"),
    ];
    let guide = root().join("docs/guide");
    let mut pages: Vec<PathBuf> = fs::read_dir(&guide)
        .unwrap_or_else(|e| panic!("{}: {e}", guide.display()))
        .map(|e| e.expect("guide entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            p.strip_prefix(root())
                .expect("under the root")
                .to_path_buf()
        })
        .collect();
    pages.sort();
    assert!(pages.len() >= 10, "the guide has its chapters: {pages:?}");
    docs.extend(pages);
    docs
}

fn read(path: &Path) -> String {
    fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines outside fenced code blocks, numbered from 1.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        } else if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// A line with its inline code spans removed (their text may hold brackets and bars).
fn without_code(line: &str) -> String {
    let mut out = String::new();
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
        } else if !in_code {
            out.push(c);
        }
    }
    out
}

/// The targets of the inline links and images of a line (`[text](target)`, `![alt](target)`)
/// and of a reference definition (`[label]: target`).
fn targets(line: &str) -> Vec<String> {
    let line = without_code(line);
    let mut out = Vec::new();
    if let Some(rest) = line.trim_start().strip_prefix('[')
        && let Some(end) = rest.find("]: ")
    {
        out.push(rest[end + 3..].trim().to_string());
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                out.push(after[..end].trim().to_string());
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's anchor of a heading's text: links and emphasis reduced to their text, lowercased,
/// every character but letters, digits, spaces, '-' and '_' dropped, spaces made '-'.
fn slug(heading: &str) -> String {
    let mut text = heading.replace('`', "");
    while let Some(open) = text.find("](") {
        let Some(close) = text[open..].find(')') else {
            break;
        };
        text.replace_range(open..open + close + 1, "");
    }
    text.to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown file: its ATX headings' slugs, duplicates numbered as GitHub does.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose(text) {
        let trimmed = line.trim_start();
        let level = trimmed.chars().take_while(|&c| c == '#').count();
        if level == 0 || level > 6 || !trimmed[level..].starts_with(' ') {
            continue;
        }
        let base = slug(trimmed[level..].trim());
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 { base } else { format!("{base}-{n}") });
        *n += 1;
    }
    out
}

#[test]
fn slugs_follow_githubs_rules() {
    assert_eq!(slug("The runner's promises"), "the-runners-promises");
    assert_eq!(
        slug("Attention paths, `Auto` and speed"),
        "attention-paths-auto-and-speed"
    );
    assert_eq!(slug("[0.1.0] - not yet released"), "010---not-yet-released");
    assert_eq!(
        slug("On wgpu (lavapipe, a proxy for a GPU)"),
        "on-wgpu-lavapipe-a-proxy-for-a-gpu"
    );
    assert_eq!(slug("row_stats and ±∞"), "row_stats-and-");
    let twice = anchors("# A\n\n## A\n\n```\n# not a heading\n```\n");
    assert_eq!(twice, ["a", "a-1"].map(String::from).into_iter().collect());
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc);
        let dir = doc.parent().unwrap_or(Path::new("")).to_path_buf();
        for (n, line) in prose(&text) {
            for target in targets(line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    dir.join(path)
                };
                let on_disk = root().join(&file);
                if !on_disk.exists() {
                    broken.push(format!(
                        "{}:{n}: {target}: no {}",
                        doc.display(),
                        file.display()
                    ));
                    continue;
                }
                if let Some(anchor) = anchor {
                    let known = if on_disk.is_file() && file.extension().is_some_and(|x| x == "md")
                    {
                        anchors(&read(&file))
                    } else {
                        BTreeSet::new()
                    };
                    if !known.contains(anchor) {
                        broken.push(format!(
                            "{}:{n}: {target}: no heading #{anchor} in {} (it has {known:?})",
                            doc.display(),
                            file.display()
                        ));
                    }
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the scanner still reading them?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

/// The doc tests of `burn-sdpa`: for each, its visible lines (rustdoc's hidden `# ` lines left
/// out), with trailing spaces trimmed.
fn doc_tests() -> Vec<Vec<String>> {
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) {
        for e in fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, files);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(&root().join("crates/burn-sdpa/src"), &mut files);
    let mut tests = Vec::new();
    for f in files {
        let text = fs::read_to_string(&f).expect("source");
        let mut block: Option<Vec<String>> = None;
        let mut other_fence = false; // inside a fence of another language (text, sh)
        for line in text.lines() {
            let t = line.trim_start();
            let Some(doc) = t.strip_prefix("//!").or_else(|| t.strip_prefix("///")) else {
                continue;
            };
            let doc = doc.strip_prefix(' ').unwrap_or(doc).trim_end();
            if let Some(info) = doc.strip_prefix("```") {
                if let Some(lines) = block.take() {
                    tests.push(lines);
                } else if other_fence {
                    other_fence = false;
                } else if info.is_empty() || info == "rust" {
                    block = Some(Vec::new());
                } else {
                    other_fence = true;
                }
                continue;
            }
            if let Some(lines) = block.as_mut()
                && !(doc == "#" || doc.starts_with("# "))
            {
                lines.push(doc.to_string());
            }
        }
    }
    tests
}

#[test]
fn every_rust_example_is_a_doc_test() {
    let tests = doc_tests();
    assert!(tests.len() > 20, "only {} doc tests found", tests.len());
    let mut missing = Vec::new();
    for doc in documents() {
        let text = read(&doc);
        let mut block: Option<(usize, Vec<String>)> = None;
        let mut other_fence = false;
        for (i, line) in text.lines().enumerate() {
            let t = line.trim_start();
            if let Some(info) = t.strip_prefix("```") {
                // A fence closes what is open, or opens a Rust block (checked) or another
                // language's (sh, toml: skipped).
                if other_fence {
                    other_fence = false;
                } else if let Some((start, lines)) = block.take() {
                    let found = !lines.is_empty()
                        && tests
                            .iter()
                            .any(|test| test.windows(lines.len()).any(|w| w == lines.as_slice()));
                    if !found {
                        missing.push(format!("{}:{start}", doc.display()));
                    }
                } else if info.trim() == "rust" {
                    block = Some((i + 1, Vec::new()));
                } else {
                    other_fence = true;
                }
                continue;
            }
            if let Some((_, lines)) = block.as_mut() {
                lines.push(line.trim_end().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "Rust examples that are no doc test of burn-sdpa (copy them into its docs):\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_is_a_page() {
    let text = read(Path::new("README.md"));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines.len() <= 150,
        "README.md has {} lines (at most 150)",
        lines.len()
    );
    let long: Vec<String> = lines
        .iter()
        .enumerate()
        .filter(|(_, l)| l.chars().count() > 100)
        .map(|(i, l)| format!("line {}: {} characters", i + 1, l.chars().count()))
        .collect();
    assert!(
        long.is_empty(),
        "README.md lines over 100 characters:\n{}",
        long.join("\n")
    );
}
