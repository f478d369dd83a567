#!/usr/bin/env python3
"""The files of one `benches/gpu_sitting.sh` sitting: gathers what each step wrote into
`OUT/rows.jsonl` and renders `OUT/BENCH_gpu.md` and `OUT/bench_gpu.json` from it (no number typed
by hand). Plain Python 3 (no PyTorch, no third-party module): the sitting calls it after every
step, so that a run cut short still leaves its tables.

    python3 benches/gpu_sitting_report.py ingest-bench OUT DIR          # an `sdpa bench --out DIR`
    python3 benches/gpu_sitting_report.py ingest-failure OUT PATH DTYPE D N RC LOG MODE...
    python3 benches/gpu_sitting_report.py ingest-golden OUT IMPLEMENTATION RC LOG
    python3 benches/gpu_sitting_report.py ingest-train OUT SIDE RC FILE_OR_LOG SIZE DTYPE
    python3 benches/gpu_sitting_report.py meta OUT KEY=VALUE...        # the sitting's settings
    python3 benches/gpu_sitting_report.py render OUT

Rows are JSON objects, one a line, with `side` (`sdpa` or `pytorch`), `path` (`cube_kernel`,
`fused`, `naive`, `pytorch`, `matmul`, `golden`, `train`, `env`), and either the measure
(`median_ms`, `tflops`) or `error`.
"""

import glob
import json
import os
import re
import sys

SIDES = [("cube_kernel", "ours: cube_kernel"), ("fused", "fused (Burn's flash forward)"),
         ("naive", "naive (Burn's tensor ops)"), ("pytorch", "PyTorch SDPA")]
MODES = ["forward", "forward+backward", "forward, causal", "forward+backward, causal"]


def rows_path(out):
    return os.path.join(out, "rows.jsonl")


def append(out, row):
    with open(rows_path(out), "a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(out):
    rows = []
    try:
        with open(rows_path(out)) as f:
            for line in f:
                line = line.strip()
                if line:
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass  # a line cut by a kill
    except FileNotFoundError:
        pass
    return rows


def tail(path, lines=6):
    try:
        with open(path, errors="replace") as f:
            text = [l.rstrip() for l in f.read().splitlines() if l.strip()]
    except OSError:
        return ""
    # The panic's or the error's own line first when there is one.
    keep = [l for l in text if "error" in l.lower() or "panicked" in l or "out of memory" in l.lower()]
    shown = []
    for line in keep[-2:] + text[-lines:]:
        if line not in shown:
            shown.append(line)
    return " / ".join(shown)[-1200:]


def exit_text(rc):
    rc = int(rc)
    return {124: "timed out (killed by the sitting's timeout)", 137: "killed (SIGKILL: the timeout, or memory)",
            101: "panicked (exit 101)", 2: "refused (exit 2)", 1: "failed (exit 1)",
            134: "aborted (SIGABRT)", 139: "crashed (SIGSEGV)"}.get(rc, f"exit {rc}")


SKIP = re.compile(r"^(\S+), (.*), n = (\d+): (.*)$", re.S)


def ingest_bench(out, folder):
    for path in sorted(glob.glob(os.path.join(folder, "bench_*.json"))):
        with open(path) as f:
            report = json.load(f)
        c = report["config"]
        common = {"side": "sdpa", "backend": report["backend"], "dtype": c["dtype"], "b": c["b"], "h": c["h"],
                  "d": c["d"]}
        for r in report["rows"]:
            append(out, dict(common, path=r["path"], mode=r["mode"], n=r["n"], median_ms=r["median_ms"],
                             times_ms=r["times_ms"], tflops=r["gflops"] / 1e3, takes=r.get("takes")))
        for s in report.get("skipped", []):
            m = SKIP.match(s)
            if m:
                append(out, dict(common, path=m.group(1), mode=m.group(2), n=int(m.group(3)),
                                 error=m.group(4)[:1200]))


PROGRESS = re.compile(r"(\S+) (forward(?:\+backward)?(?:, [a-z ]+)?) n=(\d+): ([\d.]+) ms, ([\d.]+) GFLOP/s")


def ingest_failure(out, path, dtype, d, n, rc, log, modes):
    """An `sdpa bench` run that ended without its JSON file (cut by the timeout, killed, crashed):
    the cells its log printed as measured are kept (from the log's progress lines), every other
    cell it owed gets the reason."""
    try:
        with open(log, errors="replace") as f:
            printed = f.read().splitlines()
    except OSError:
        printed = []
    have = {(r.get("path"), r.get("dtype"), r.get("d"), r.get("n"), r.get("mode")) for r in read_rows(out)}
    seen = set()
    for line in printed:
        m = PROGRESS.search(line)
        if m and m.group(1) == path and m.group(2) in modes and int(m.group(3)) == int(n) \
                and m.group(2) not in seen and (path, dtype, int(d), int(n), m.group(2)) not in have:
            seen.add(m.group(2))
            append(out, {"side": "sdpa", "path": path, "dtype": dtype, "d": int(d), "n": int(n),
                         "mode": m.group(2), "median_ms": float(m.group(4)),
                         "tflops": float(m.group(5)) / 1e3, "note": "read from the log of a cut run"})
    have = {(r.get("path"), r.get("dtype"), r.get("d"), r.get("n"), r.get("mode")) for r in read_rows(out)}
    for mode in modes:
        if (path, dtype, int(d), int(n), mode) not in have:
            append(out, {"side": "sdpa", "path": path, "dtype": dtype, "d": int(d), "n": int(n), "mode": mode,
                         "error": f"{exit_text(rc)}: {tail(log)}"})


GOLDEN_SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed(?:, (\d+) not served)?", re.M)


def ingest_golden(out, implementation, rc, log):
    with open(log, errors="replace") as f:
        text = f.read()
    lines = text.splitlines()
    per_folder = {}
    for line in lines:
        kind = line[:4]
        if kind not in ("ok  ", "FAIL", "SKIP"):
            continue
        m = re.search(r"([\w.-]+)__", line)
        folder = m.group(1) if m else "?"
        counts = per_folder.setdefault(folder, {"passed": 0, "failed": 0, "not_served": 0})
        counts[{"ok  ": "passed", "FAIL": "failed", "SKIP": "not_served"}[kind]] += 1
    total = {k: sum(c[k] for c in per_folder.values()) for k in ("passed", "failed", "not_served")}
    summary = GOLDEN_SUMMARY.search(text)
    row = {"side": "sdpa", "path": "golden", "implementation": implementation, "rc": int(rc),
           "passed": total["passed"], "failed": total["failed"], "not_served": total["not_served"],
           "per_folder": per_folder, "complete": bool(summary),
           "failures": [l[:300] for l in lines if l.startswith("FAIL")][:20]}
    if not summary:
        row["error"] = f"{exit_text(rc)} before its summary: {tail(log)}"
    append(out, row)


def ingest_train(out, side, rc, file_or_log, size, dtype):
    row = {"side": side, "path": "train", "size": size, "dtype": dtype}
    try:
        with open(file_or_log) as f:
            r = json.load(f)
        row.update({"seq_len": r["seq_len"], "median_steps_per_s": r["median_steps_per_s"],
                    "steps_per_s": r["steps_per_s"], "framework": r.get("framework"),
                    "implementation": r.get("implementation"),
                    "profile_ms_per_step": r.get("profile_ms_per_step")})
    except (OSError, ValueError, KeyError):
        row["error"] = f"{exit_text(rc)}: {tail(file_or_log)}"
    append(out, row)


def fmt(x, digits=1):
    return "–" if x is None else f"{x:.{digits}f}"


def tf(x):
    """TFLOP/s with two decimals, or three significant digits below 1 (the --small sizes)."""
    return f"{x:.2f}" if x >= 1 else f"{x:.3g}"


def render(out):
    rows = read_rows(out)
    meta = {}
    for r in rows:
        if r.get("path") == "meta":
            meta.update(r)
    backend, b, h = meta.get("backend", "cuda"), meta.get("b", 4), meta.get("h", 16)
    speed = [r for r in rows if r.get("path") in dict(SIDES) and "mode" in r]
    ceiling = next((r.get("tflops") for r in rows if r.get("path") == "matmul" and r.get("dtype") == "bf16"
                    and r.get("tflops")), None)
    env_rows = [r for r in rows if r.get("path") == "env"]
    cells = []
    for r in speed:
        key = (r["dtype"], r["d"], r["n"], r["mode"])
        if key not in cells:
            cells.append(key)

    def importance(key):
        dtype, d, n, mode = key
        return (n != 4096, d != 128, dtype != "bf16", n, -d, dtype, MODES.index(mode) if mode in MODES else 9)

    cells.sort(key=importance)

    def find(key, path):
        found = [r for r in speed if (r["dtype"], r["d"], r["n"], r["mode"]) == key and r["path"] == path]
        good = [r for r in found if r.get("tflops")]
        return (good or found or [None])[-1]

    def show(r):
        if r is None:
            return "not run"
        if r.get("tflops"):
            extra = f" [{r['backend']}]" if r.get("side") == "pytorch" and r.get("backend") else ""
            return f"{tf(r['tflops'])} ({r['median_ms']:.2f} ms){extra}"
        error = r.get("error", "?")
        short = "out of memory" if "memory" in error.lower() else error.split(":")[0][:60].replace("|", "/")
        return f"failed: {short}"

    lines = ["# GPU sitting: attention speed and golden cases", ""]
    if meta.get("sitting"):
        lines += [f"`benches/gpu_sitting.sh` ({meta['sitting']}) on `--backend {backend}`, started "
                  f"{meta.get('started', '?')}, budget {meta.get('budget', '?')} s.", ""]
    if meta.get("compiler"):  # empty: a binary that does not name its compiler
        lines += [f"Our kernels were compiled to {meta['compiler']} (binary `{meta.get('binary', 'sdpa')}`); "
                  "what the host had: the preflight at the end.", ""]
    gpu = next((r for r in env_rows if r.get("gpu")), None)
    if gpu:
        lines.append(f"{gpu['gpu']} (compute capability {gpu['capability']}, {gpu['gpu_memory_gib']:.0f} GiB), "
                     f"PyTorch {gpu['torch']} (CUDA {gpu['torch_cuda']}, cuDNN {gpu.get('cudnn')}), "
                     f"Python {gpu['python']}. Versions and `nvidia-smi`: `env.txt`.")
    else:
        lines.append("Versions and devices: `env.txt`.")
    lines.append("")
    lines.append("TFLOP/s (median ms): 4·b·h·n²·d forward, 12·b·h·n²·d forward + backward, half of it causal "
                 "(the convention of `sdpa bench` and `benches/pytorch_sdpa.py`); "
                 f"b {b}, h {h}, n = m. Ours: `sdpa bench --backend {backend} --path P` (a warm-up, then the median of the timed runs, each "
                 "waiting for the device); PyTorch: `benches/gpu_torch.py` (CUDA events; bf16 through "
                 "FlashAttention, f32 through the memory-efficient backend with TF32 off; the backend that "
                 "ran is in brackets).")
    lines.append("")
    if ceiling:
        size = next((r.get("size") for r in rows if r.get("path") == "matmul" and r.get("dtype") == "bf16"), "?")
        lines.append(f"Ceiling: a bf16 {size}³ `torch.matmul` ran at {tf(ceiling)} TFLOP/s in this sitting; the "
                     "last column is ours (cube_kernel) as a share of it.")
    else:
        lines.append("Ceiling: the bf16 matmul was not measured (see `rows.jsonl`).")
    lines.append("")
    lines.append("| cell (dtype, d, n, mode) | " + " | ".join(label for _, label in SIDES)
                 + " | cube_kernel / matmul ceiling |")
    lines.append("|---|" + "---|" * (len(SIDES) + 1))
    table = []
    for key in cells:
        dtype, d, n, mode = key
        got = {path: find(key, path) for path, _ in SIDES}
        ours = got["cube_kernel"]
        share = (f"{100 * ours['tflops'] / ceiling:.1f}%" if ceiling and ours and ours.get("tflops") else "–")
        lines.append(f"| {dtype}, d {d}, n {n}, {mode} | " + " | ".join(show(got[p]) for p, _ in SIDES)
                     + f" | {share} |")
        table.append({"dtype": dtype, "d": d, "n": n, "mode": mode,
                      **{p: (got[p] or {}).get("tflops") for p, _ in SIDES}})
    errors = [r for r in speed if r.get("error")]
    if errors:
        lines += ["", "Cells that did not run (the reason as the run gave it):", ""]
        for r in errors:
            lines.append(f"- {r['path']}, {r['dtype']}, d {r['d']}, n {r['n']}, {r['mode']}: {r['error'][:400]}")
    takes = sorted({(r["path"], r.get("takes")) for r in speed if r.get("side") == "sdpa" and r.get("takes")})
    if takes:
        lines += ["", "Paths the module took: " + ", ".join(f"{p} → {t}" for p, t in takes) + "."]
    golden = [r for r in rows if r.get("path") == "golden"]
    if golden:
        lines += ["", f"## Golden cases on `--backend {backend}` (forward and backward)", "",
                  "| implementation | passed | failed | not served | complete | per folder (passed/failed/not served) |",
                  "|---|---|---|---|---|---|"]
        for r in golden:
            folders = ", ".join(f"{k} {v['passed']}/{v['failed']}/{v['not_served']}"
                                for k, v in sorted(r["per_folder"].items()))
            lines.append(f"| {r['implementation']} | {r['passed']} | {r['failed']} | {r['not_served']} | "
                         f"{'yes' if r['complete'] else 'no: ' + r.get('error', '')[:200]} | {folders} |")
        lines.append("")
        for r in golden:
            for f in r.get("failures", []):
                lines.append(f"- {r['implementation']}: `{f}`")
    train = [r for r in rows if r.get("path") == "train"]
    if train:
        lines += ["", f"## Training steps/s: the model against its PyTorch twin (`--backend {backend}`)", "",
                  "| size | dtype | side | steps/s (median) | per round |", "|---|---|---|---|---|"]
        for r in train:
            lines.append(f"| {r['size']} (seq_len {r.get('seq_len', '?')}) | {r['dtype']} | {r['side']} | "
                         f"{fmt(r.get('median_steps_per_s'))} | "
                         + (", ".join(f"{x:.1f}" for x in r.get("steps_per_s", []))
                            or r.get("error", "")[:300].replace("|", "/"))
                         + " |")
    preflight = os.path.join(out, "preflight.txt")
    if os.path.exists(preflight):
        with open(preflight, errors="replace") as f:
            pre = [l.rstrip() for l in f if l.strip() and not l.startswith("#")]
        lines += ["", "## Preflight (`preflight.txt`)", ""] + [f"- {l}" for l in pre]
    steps = os.path.join(out, "steps.tsv")
    if os.path.exists(steps):
        lines += ["", "Every step of the sitting, its exit and its seconds: `steps.tsv`; logs: `logs/`."]
    summary = {"compiler": meta.get("compiler"), "binary": meta.get("binary"), "matmul_bf16_tflops": ceiling, "cells": table, "golden": golden, "train": train, "env": env_rows}
    with open(os.path.join(out, "bench_gpu.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "BENCH_gpu.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what, out, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "ingest-bench":
        ingest_bench(out, rest[0])
    elif what == "ingest-failure":
        path, dtype, d, n, rc, log, *modes = rest
        ingest_failure(out, path, dtype, d, n, rc, log, modes)
    elif what == "ingest-golden":
        ingest_golden(out, *rest)
    elif what == "ingest-train":
        ingest_train(out, *rest)
    elif what == "meta":
        row = {"path": "meta"}
        for item in rest:
            key, _, value = item.partition("=")
            row[key] = int(value) if value.isdigit() else value
        append(out, row)
    elif what == "render":
        render(out)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
