//! The crate root's names, listed: a name added to (or dropped from) `burn_sdpa`'s root is a
//! decision made here, not a side effect of a `pub use` line.

/// Every name `crates/burn-sdpa/src/lib.rs` makes public at the root: its `pub mod` modules and
/// the items of its `pub use` lines, sorted.
fn root_names() -> Vec<String> {
    let lib = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crates/burn-sdpa/src/lib.rs"
    ))
    .expect("burn-sdpa's lib.rs");
    let mut names = Vec::new();
    // Statements at the top level of the file (not indented: the inline `cpu_kernel` module's
    // own `pub use` lines are its names, not the root's).
    let mut statement = String::new();
    for line in lib.lines() {
        if statement.is_empty() && !(line.starts_with("pub use ") || line.starts_with("pub mod ")) {
            continue;
        }
        statement.push_str(line);
        statement.push(' ');
        if !(line.trim_end().ends_with(';') || line.trim_end().ends_with('{')) {
            continue;
        }
        let s = std::mem::take(&mut statement);
        if let Some(module) = s.strip_prefix("pub mod ") {
            let name = module.trim_end_matches([' ', ';', '{']).trim();
            names.push(format!("mod {name}"));
        } else if let Some(path) = s.strip_prefix("pub use ") {
            let path = path.trim().trim_end_matches(';');
            let items = match (path.find('{'), path.rfind('}')) {
                (Some(open), Some(close)) => path[open + 1..close].to_string(),
                _ => path.rsplit("::").next().unwrap_or(path).to_string(),
            };
            names.extend(
                items
                    .split(',')
                    .map(str::trim)
                    .filter(|n| !n.is_empty())
                    .map(String::from),
            );
        }
    }
    names.sort();
    names
}

#[test]
fn the_crate_root_holds_what_a_user_calls() {
    let expected = [
        // The module, its config, input and output.
        "ScaledDotProductAttention",
        "ScaledDotProductAttentionConfig",
        "AttentionInput",
        "AttentionOutput",
        "Segments",
        "RowStats",
        "AttentionOptions",
        "CausalAlignment",
        "Precision",
        "ScalePolicy",
        "Softmax",
        "Window",
        // The multi-head layer, its parts and its cache.
        "MultiHeadSdpa",
        "MultiHeadSdpaConfig",
        "MultiHeadSdpaInput",
        "MultiHeadSdpaOutput",
        "KvCache",
        "RopeConfig",
        "QkNorm",
        "HeadNorm",
        // The error type.
        "AttentionError",
        // Choosing and showing a path.
        "Implementation",
        "AttentionPath",
        "BackendFamily",
        "has_tensor_cores",
        // Everything else, in modules.
        "mod cpu_kernel",
        "mod diagnostics",
        "mod lse",
        "mod mask",
        "mod nn",
        "mod rows",
        "mod util",
    ];
    let mut expected: Vec<String> = expected.iter().map(|s| s.to_string()).collect();
    expected.sort();
    assert_eq!(
        root_names(),
        expected,
        "burn_sdpa's root changed: decide it in tests/library/root_names.rs"
    );
}

#[test]
fn no_two_public_types_share_a_name() {
    // The drop-in layers keep burn-nn's names (`nn::attention::MultiHeadAttention`, `MhaInput`,
    // `MhaCache`, ...); the root's multi-head layer has names of its own.
    for name in [
        "MultiHeadAttention",
        "MultiHeadAttentionConfig",
        "MhaInput",
        "MhaOutput",
        "MhaCache",
    ] {
        assert!(
            !root_names().iter().any(|n| n == name),
            "{name} at the crate root would shadow the drop-in layer of the same name"
        );
    }
}
