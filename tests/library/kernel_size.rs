//! The CubeCL kernels stay in cubek-attention's shape (issue 67): no `#[cube]` function or
//! method of burn-sdpa over [`MAX_LINES`] lines, signature and closing brace included, so
//! that a kernel reads as its steps and each step is a function of its own.

use std::fs;
use std::path::{Path, PathBuf};

/// The longest a `#[cube]` function may be.
const MAX_LINES: usize = 80;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("the crate's sources are readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The line of the `}` that closes the item whose first line is `lines[start]` (the first
/// line after it at the item's indentation that is a lone `}`).
fn closing(lines: &[&str], start: usize) -> usize {
    let indent = lines[start].len() - lines[start].trim_start().len();
    let close = format!("{}}}", " ".repeat(indent));
    (start + 1..lines.len())
        .find(|&i| lines[i].trim_end() == close)
        .unwrap_or(lines.len() - 1)
}

fn is_fn(line: &str) -> bool {
    let l = line.trim_start();
    ["fn ", "pub fn ", "pub(crate) fn ", "pub(super) fn "]
        .iter()
        .any(|p| l.starts_with(p))
}

/// Every `#[cube]` function and every method of a `#[cube]` impl in `text`: (name, lines).
fn cube_functions(text: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        if !lines[i].trim_start().starts_with("#[cube") {
            i += 1;
            continue;
        }
        // The item the attribute belongs to (past further attributes).
        let item = (i + 1..lines.len())
            .find(|&j| !lines[j].trim_start().starts_with("#["))
            .unwrap_or(lines.len() - 1);
        let end = closing(&lines, item);
        if lines[item].trim_start().starts_with("impl") {
            for j in item + 1..end {
                if is_fn(lines[j]) {
                    out.push((name_of(lines[j]), closing(&lines, j) - j + 1));
                }
            }
        } else if is_fn(lines[item]) {
            out.push((name_of(lines[item]), end - item + 1));
        }
        i = end + 1;
    }
    out
}

fn name_of(line: &str) -> String {
    let after = line.split("fn ").nth(1).unwrap_or(line);
    after
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .next()
        .unwrap_or(after)
        .to_string()
}

#[test]
fn no_cube_function_is_over_80_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/burn-sdpa/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut seen = 0;
    let mut long = Vec::new();
    for file in &files {
        let text = fs::read_to_string(file).expect("a source file is readable");
        for (name, n) in cube_functions(&text) {
            seen += 1;
            if n > MAX_LINES {
                long.push(format!("{} {name}: {n} lines", file.display()));
            }
        }
    }
    // The kernels are there to be measured: the forward, the backward and the tensor-core ones.
    assert!(seen >= 20, "only {seen} #[cube] functions found");
    assert!(
        long.is_empty(),
        "over {MAX_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn the_count_sees_a_long_function_and_impl_methods() {
    let body = "    x();\n".repeat(90);
    let text = format!(
        "#[cube(launch)]\n#[allow(x)]\npub(crate) fn long() {{\n{body}}}\n\n#[cube]\nimpl A {{\n    \
         fn short(&self) {{\n        y();\n    }}\n}}\n"
    );
    let found = cube_functions(&text);
    assert_eq!(found, vec![("long".into(), 92), ("short".into(), 3)]);
}
