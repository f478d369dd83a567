//! The golden runner accepts every valid case (issue 51, items 10–12 and 18): keys whose weight
//! underflows to 0 are still visible, a tolerance that cannot fail on one expected tensor is
//! said on the case's line (and fails only under `--strict`), lines name the case's file, numbers
//! print compactly, and a huge file is refused from its size.

use std::path::Path;

use serde_json::{Value, json};

use crate::{arg, code, sdpa, text};

/// A case of one query and `keys.len()` keys, head size 1, scale 1, computed here in f64: the
/// softmax over the keys `mask` leaves visible (true = hidden), the context, the weights and the
/// gradients of `sum(context · grad_out)`.
fn one_query_case(name: &str, q: f64, keys: &[f64], values: &[f64], mask: &[bool]) -> Value {
    let m = keys.len();
    let g = 1.0;
    let scores: Vec<f64> = keys.iter().map(|k| q * k).collect();
    let top = (0..m)
        .filter(|&j| !mask[j])
        .map(|j| scores[j])
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = (0..m)
        .map(|j| {
            if mask[j] {
                0.0
            } else {
                (scores[j] - top).exp()
            }
        })
        .collect();
    let sum: f64 = e.iter().sum();
    let p: Vec<f64> = e.iter().map(|x| x / sum).collect();
    let context: f64 = p.iter().zip(values).map(|(p, v)| p * v).sum();
    let dp: Vec<f64> = values.iter().map(|v| g * v).collect();
    let d: f64 = p.iter().zip(&dp).map(|(p, x)| p * x).sum();
    let ds: Vec<f64> = p.iter().zip(&dp).map(|(p, x)| p * (x - d)).collect();
    let grad_q: f64 = ds.iter().zip(keys).map(|(s, k)| s * k).sum();
    let t = |data: Vec<f64>| json!({"shape": [1, 1, data.len(), 1], "data": data});
    let row = |data: Vec<f64>| json!({"shape": [1, 1, 1, data.len()], "data": data});
    json!({
        "name": name,
        "query": t(vec![q]),
        "key": t(keys.to_vec()),
        "value": t(values.to_vec()),
        "mask": {"shape": [1, 1, 1, m], "data": mask},
        "bias": null,
        "causal": "none",
        "scale": 1.0,
        "grad_out": t(vec![g]),
        "expected": {
            "context": t(vec![context]),
            "weights": row(p.clone()),
            "grad_query": t(vec![grad_q]),
            "grad_key": t(ds.iter().map(|s| s * q).collect()),
            "grad_value": t(p.iter().map(|p| p * g).collect()),
        },
        "tolerance": {"abs": 1e-6, "rel": 1e-5},
    })
}

fn write(dir: &Path, name: &str, case: &Value) {
    std::fs::write(dir.join(name), serde_json::to_string(case).unwrap()).expect("write");
}

/// Every implementation that runs on flex.
fn flex_implementations() -> Vec<String> {
    let flex = sdpa::BackendFamily::Flex;
    sdpa::Implementation::all(2)
        .filter(|i| i.runs_on(flex))
        .map(|i| i.to_string())
        .collect()
}

/// Scores 848 apart: the far key's weight underflows to 0 in f64 (and f32), yet the key is
/// visible; the masked key is not (item 10).
#[test]
fn keys_whose_weight_underflows_are_still_visible() {
    let dir = tempfile::tempdir().expect("tmp");
    let case = one_query_case(
        "underflow",
        1.0,
        &[0.0, 848.0, 5.0],
        &[2.0, -0.5, 3.0],
        &[false, false, true],
    );
    assert_eq!(case["expected"]["weights"]["data"][0], json!(0.0));
    write(dir.path(), "a_mask.json", &case);
    // The same hidden key through a bias that is −∞ in f32 (JSON has no −∞).
    let mut biased = case.clone();
    biased["mask"] = Value::Null;
    biased["bias"] = json!({"shape": [1, 1, 1, 3], "data": [0.0, 0.0, -1e39]});
    write(dir.path(), "b_bias.json", &biased);
    for implementation in flex_implementations() {
        let out = sdpa(&[
            "golden",
            &arg(dir.path()),
            "--backend",
            "flex",
            "--implementation",
            &implementation,
        ]);
        let printed = text(&out);
        assert_eq!(code(&out), Some(0), "{implementation}: {printed}");
        assert!(
            printed.contains("2 passed, 0 failed"),
            "{implementation}: {printed}"
        );
        assert!(
            !printed.contains("row_visible_keys=1.0e0(!)"),
            "{implementation}: {printed}"
        );
    }
}

/// A saturated softmax: the query and key gradients lie within the tolerance of zero, so their
/// checks cannot fail. The case is checked on the rest, its line says so, and only `--strict`
/// fails it (item 11).
#[test]
fn a_tolerance_that_cannot_fail_on_one_tensor_is_said_and_fails_only_under_strict() {
    let dir = tempfile::tempdir().expect("tmp");
    let case = one_query_case(
        "saturated",
        1.0,
        &[0.0, 30.0],
        &[2.0, -0.5],
        &[false, false],
    );
    let grad_q = case["expected"]["grad_query"]["data"][0].as_f64().unwrap();
    assert!(grad_q != 0.0 && grad_q.abs() < 1e-6, "{grad_q}");
    write(dir.path(), "saturated.json", &case);
    // The same case with a wrong context: the checks that can fail still do.
    let mut wrong = case.clone();
    wrong["expected"]["context"]["data"][0] = json!(0.25);
    let wrong_dir = tempfile::tempdir().expect("tmp");
    write(wrong_dir.path(), "wrong.json", &wrong);

    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(0), "{printed}");
    assert!(printed.contains("1 passed, 0 failed"), "{printed}");
    assert!(printed.contains("grad_query="), "{printed}");
    assert!(
        printed.contains("cannot fail on expected.grad_query, expected.grad_key"),
        "{printed}"
    );
    assert!(printed.contains("--strict"), "{printed}");

    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex", "--strict"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(printed.contains("0 passed, 1 failed"), "{printed}");
    assert!(printed.contains("cannot fail on"), "{printed}");

    let out = sdpa(&["golden", &arg(wrong_dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(
        printed.contains("context=") && printed.contains("(!)"),
        "{printed}"
    );
}

/// Cases that share a name are told apart by their file (relative to the folder given), and
/// out-of-range numbers print as `1e300`, not three hundred digits (item 12).
#[test]
fn lines_name_the_file_and_print_numbers_compactly() {
    let dir = tempfile::tempdir().expect("tmp");
    let case = one_query_case("same", 0.5, &[1.0, -1.0], &[2.0, -0.5], &[false, false]);
    write(dir.path(), "first.json", &case);
    write(dir.path(), "second.json", &case);
    let mut scale = case.clone();
    scale["scale"] = json!(1e300);
    write(dir.path(), "scale.json", &scale);
    let mut softcap = case.clone();
    softcap["softcap"] = json!(-1e300);
    write(dir.path(), "softcap.json", &softcap);
    // Issue 65, item 8: a soft-cap finite in f64 but past f32 says it overflows f32, and a
    // window of three entries names the field and its form.
    let mut huge_cap = case.clone();
    huge_cap["softcap"] = json!(1e300);
    write(dir.path(), "softcap_huge.json", &huge_cap);
    let mut window = case.clone();
    window["window"] = json!([1, 2, 3]);
    write(dir.path(), "window3.json", &window);
    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(printed.contains("2 passed, 4 failed"), "{printed}");
    let line = |file: &str| {
        printed
            .lines()
            .find(|l| l.contains(file))
            .unwrap_or_default()
            .to_string()
    };
    assert!(
        line("softcap_huge.json").contains("overflows f32"),
        "{printed}"
    );
    let window_line = line("window3.json");
    assert!(
        window_line.contains("window must be [left, right]")
            && window_line.contains("[1,2,3]")
            && !window_line.contains("trailing characters"),
        "{printed}"
    );
    // FAIL lines name their file as ok lines do: relative to the folder.
    for file in ["softcap_huge.json", "window3.json", "scale.json"] {
        let l = line(file);
        assert!(l.starts_with(&format!("FAIL {file}")), "{l}");
    }
    for file in ["first.json [same]", "second.json [same]"] {
        let line = printed.lines().find(|l| l.contains(file));
        assert!(
            line.is_some_and(|l| l.starts_with("ok")),
            "no ok line names {file}: {printed}"
        );
    }
    // Relative to the folder: the temporary folder's own path is not repeated on any line.
    let folder = arg(dir.path());
    assert!(
        printed
            .lines()
            .filter(|l| l.starts_with("ok") || l.starts_with("FAIL"))
            .all(|l| !l.contains(&folder)),
        "{printed}"
    );
    assert!(printed.contains("got 1e300"), "{printed}");
    assert!(printed.contains("softcap = -1e300"), "{printed}");
    assert!(!printed.contains("0000000000"), "{printed}");
}

/// A 2 GiB sparse `.json` is refused from its size, naming it, without being read (item 18).
#[test]
fn a_huge_case_file_is_refused_from_its_size() {
    let dir = tempfile::tempdir().expect("tmp");
    let case = one_query_case("small", 0.5, &[1.0, -1.0], &[2.0, -0.5], &[false, false]);
    write(dir.path(), "a_small.json", &case);
    let huge = std::fs::File::create(dir.path().join("b_huge.json")).expect("create");
    huge.set_len(2 << 30).expect("a sparse file");
    let started = std::time::Instant::now();
    let out = sdpa(&["golden", &arg(dir.path()), "--backend", "flex"]);
    let printed = text(&out);
    assert_eq!(code(&out), Some(1), "{printed}");
    assert!(printed.contains("1 passed, 1 failed"), "{printed}");
    let line = printed
        .lines()
        .find(|l| l.contains("b_huge.json"))
        .unwrap_or_default();
    assert!(
        line.starts_with("FAIL")
            && line.contains("2147483648 bytes")
            && line.contains("limit of 1073741824 bytes"),
        "{printed}"
    );
    // Reading 2 GiB of zeros took seconds (and 2.1 GB of memory); the size alone takes none.
    assert!(started.elapsed().as_secs() < 60, "{:?}", started.elapsed());
}

/// Inputs past a half type's range (a query of 1e300 in f16) are not a check of a run in that
/// type: the case is not served, said with the value and the type's largest (it passed as a
/// check that cannot fail, both sides NaN); with no case served, nothing was checked: exit 2.
#[test]
fn inputs_past_a_half_types_range_are_not_served_in_it() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut case = one_query_case("huge", 0.5, &[1.0, -1.0], &[2.0, -0.5], &[false, false]);
    case["query"]["data"][0] = json!(1e300);
    write(dir.path(), "huge.json", &case);
    for dtype in ["f16", "bf16"] {
        let out = sdpa(&[
            "golden",
            &arg(dir.path()),
            "--backend",
            "flex",
            "--dtype",
            dtype,
        ]);
        let printed = text(&out);
        assert_eq!(code(&out), Some(2), "{dtype}: {printed}");
        assert!(
            printed.contains("SKIP huge.json") && printed.contains("largest value"),
            "{dtype}: {printed}"
        );
    }
}
