//! Fixes at build time the fingerprints of the code that measures the lab's cells (see
//! `runner::cache::CellKey::code`): a cell measured by other code is never reused.
//!
//! Each experiment's fingerprint hashes (64-bit FNV-1a) the sources its cells run: the
//! `burn-sdpa` and `sdpa-model` crates, the lab's `measures/`, `context.rs` and `memory.rs`, the
//! experiment's own `mod.rs` and `measure.rs` (its plan and measure), and the workspace's
//! `Cargo.lock` (the versions of Burn and every other dependency). Its analysis, claims and
//! rendering are left out on purpose: changing a claim's wording or a plot must not re-measure
//! anything (`--render-only` re-renders from the saved cells).

use std::fs;
use std::path::{Path, PathBuf};

fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Every file under `path` (or `path` itself), sorted, so that the hash does not depend on the
/// order a folder lists its entries in.
fn files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_dir() {
        let mut entries: Vec<PathBuf> = fs::read_dir(path)
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        entries.sort();
        for e in entries {
            files(&e, out);
        }
    } else if path.is_file() {
        out.push(path.to_path_buf());
    }
}

/// The hash of the names (relative to `root`) and contents of every file under `paths`.
fn fingerprint(root: &Path, paths: &[PathBuf]) -> u64 {
    let mut all = Vec::new();
    for p in paths {
        files(p, &mut all);
    }
    all.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, f| {
        let name = f
            .strip_prefix(root)
            .unwrap_or(f)
            .to_string_lossy()
            .replace('\\', "/");
        let h = fnv(h, name.as_bytes());
        let h = fnv(h, &[0]);
        let h = fnv(h, &fs::read(f).unwrap_or_default());
        fnv(h, &[0])
    })
}

fn main() {
    let lab = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("manifest dir"));
    let crates = lab.parent().expect("crates/").to_path_buf();
    let root = crates.parent().expect("workspace root").to_path_buf();
    let common = vec![
        crates.join("burn-sdpa/src"),
        crates.join("sdpa-model/src"),
        lab.join("src/measures"),
        lab.join("src/context.rs"),
        lab.join("src/memory.rs"),
        root.join("Cargo.lock"),
    ];
    for p in &common {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    let experiments = lab.join("src/experiments");
    println!("cargo:rerun-if-changed={}", experiments.display());
    let mut dirs: Vec<PathBuf> = fs::read_dir(&experiments)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect()
        })
        .unwrap_or_default();
    dirs.sort();
    let mut table = format!(
        "/// The fingerprint of the code every experiment's cells run.\n\
         pub const COMMON: &str = \"{:016x}\";\n\
         /// (experiment folder, fingerprint of the code that measures its cells), fixed at build time.\n\
         pub const FINGERPRINTS: &[(&str, &str)] = &[\n",
        fingerprint(&root, &common)
    );
    for dir in dirs {
        let name = dir
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut paths = common.clone();
        paths.push(dir.join("mod.rs"));
        paths.push(dir.join("measure.rs"));
        table.push_str(&format!(
            "    ({name:?}, \"{:016x}\"),\n",
            fingerprint(&root, &paths)
        ));
    }
    table.push_str("];\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("fingerprints.rs");
    fs::write(out, table).expect("write fingerprints.rs");
}
