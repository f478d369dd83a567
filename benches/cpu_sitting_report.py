#!/usr/bin/env python3
"""The tables of one `benches/cpu_sitting.sh` sitting, from the files it wrote (no number typed by
hand): the kernel at n = 1024 in f32 and bf16 against PyTorch, round by round, with GFLOP/s and
the 2048³ matmul ceilings; the kernel alone, bf16 against f32; the model against its twin.

    python3 benches/cpu_sitting_report.py docs/bench/sitting > docs/bench/BENCH_cpu.md
"""

import json
import os
import re
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def cell(rows, mode, path=None):
    """The median ms of `mode` (and `path`, for sdpa's rows) at n = 1024."""
    for r in rows:
        if r["mode"] == mode and r["n"] == 1024 and (path is None or r["path"] == path):
            return r["median_ms"]
    raise KeyError(f"{mode} {path}")


def cpu_flags(lscpu):
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16"]
    flags = re.search(r"^Flags:\s*(.*)$", lscpu, re.M)
    model = re.search(r"^Model name:\s*(.*)$", lscpu, re.M)
    family = re.search(r"^CPU family:\s*(.*)$", lscpu, re.M)
    have = flags.group(1).split() if flags else []
    return (model.group(1).strip() if model else "?", family.group(1).strip() if family else "?",
            [f for f in wanted if f in have])


def main():
    out = sys.argv[1]
    with open(os.path.join(out, "lscpu.txt")) as f:
        model, family, flags = cpu_flags(f.read())
    p = print
    p("# CPU speed against PyTorch: one sitting\n")
    p(f"`benches/cpu_sitting.sh PYTHON OUT` on {model} (CPU family {family}), "
      f"CPU flags: {', '.join(flags)}; its files are in `{out}`, the tables below come from them "
      f"(`python3 benches/cpu_sitting_report.py {out}`).\n")
    peak = os.path.join(out, "cpu_peak.log")
    if os.path.exists(peak):
        with open(peak) as f:
            lines = [l for l in f.read().splitlines() if "GFLOP/s" in l]
        p("The CPU's ceilings (`cargo run --release --example cpu_peak`: loops of independent "
          "instructions, no memory): " + "; ".join(lines) + ".\n")
    p("## The kernel, b 4, h 8, d 64, n = m = 1024\n")
    p("`sdpa bench --backend flex --n 1024 --skip-memory --mode forward --mode forward+backward "
      "[--dtype bf16]` (Burn tensors; `auto` takes `cpu_kernel`) against `benches/pytorch_sdpa.py "
      "--n 1024 [--dtype bf16]` (`F.scaled_dot_product_attention`), round 1 ours first, round 2 "
      "PyTorch first; median ms (GFLOP/s: 4·b·h·n²·d forward, 12·b·h·n²·d forward + backward).\n")
    p("| dtype | mode | round | sdpa Auto ms (GFLOP/s) | PyTorch ms (GFLOP/s) | sdpa / PyTorch speed |")
    p("|---|---|---|---|---|---|")
    flop = {"forward": 4 * 4 * 8 * 1024 * 1024 * 64, "forward+backward": 12 * 4 * 8 * 1024 * 1024 * 64}
    ratios = {}
    ceilings = []
    for dtype, suffix in (("f32", ""), ("bf16", "_bf16")):
        for mode in ("forward", "forward+backward"):
            for rnd in (1, 2):
                d = os.path.join(out, f"r{rnd}")
                ours = cell(load(os.path.join(d, f"bench_flex{suffix}.json"))["rows"], mode, "auto")
                pt = load(os.path.join(d, f"bench_pytorch{suffix}.json"))
                theirs = cell(pt["rows"], mode)
                if pt["config"].get("matmul_2048_gflops"):
                    ceilings.append(pt["config"]["matmul_2048_gflops"])
                gf = lambda ms: flop[mode] / ms / 1e6
                ratios.setdefault((dtype, mode), []).append(theirs / ours)
                p(f"| {dtype} | {mode} | {rnd} | {ours:.1f} ({gf(ours):.0f}) | {theirs:.1f} "
                  f"({gf(theirs):.0f}) | {theirs / ours:.2f}× |")
    p("")
    bf16_over_f32 = []
    for rnd in (1, 2):
        d = os.path.join(out, f"r{rnd}")
        f32 = cell(load(os.path.join(d, "bench_flex.json"))["rows"], "forward+backward", "auto")
        b16 = cell(load(os.path.join(d, "bench_flex_bf16.json"))["rows"], "forward+backward", "auto")
        bf16_over_f32.append(f32 / b16)
    p("sdpa bf16 against sdpa f32, forward + backward, same round: "
      + ", ".join(f"{x:.2f}×" for x in bf16_over_f32) + ".\n")
    if ceilings:
        f32c = [c["f32"] for c in ceilings]
        b16c = [c["bf16"] for c in ceilings]
        p(f"PyTorch's 2048³ matmul on the same threads (the machine's ceiling as PyTorch reaches it): "
          f"f32 {', '.join(f'{x:.0f}' for x in f32c)} GFLOP/s, bf16 {', '.join(f'{x:.0f}' for x in b16c)}.\n")
    p("## The kernel alone on host slices, f32 against bf16\n")
    for name, title in (("cpu_kernel_bf16.log", "b 4, h 8, d 64"),
                        ("cpu_kernel_bf16_model_shape.log", "the model's shape: b 64, h 2, d 32")):
        with open(os.path.join(out, name)) as f:
            text = f.read()
        head = text.splitlines()[0]
        p(f"`cargo run --release --example cpu_kernel_bf16` ({title}; 9 rounds alternating the types, "
          f"medians). {head.split(';', 1)[1].strip() if ';' in head else ''}\n")
        p("\n".join(l for l in text.splitlines() if l.startswith("|")) + "\n")
    p("## The model against its PyTorch twin\n")
    p("`benches/train_side_by_side.py --rounds 5 [--dtype bf16]` (batch 64, Adam, the loss and "
      "gradient norm read back every step on both sides; bf16: the attention alone in bf16 on both "
      "sides, f32 parameters, activations and optimizer).\n")
    p("| attention dtype | size | sdpa steps/s, median [min, max] | PyTorch | ratio of medians | per-round ratios |")
    p("|---|---|---|---|---|---|")
    for dtype, suffix in (("f32", ""), ("bf16", "_bf16")):
        t = load(os.path.join(out, "train", f"bench_train{suffix}.json"))
        for size, v in t["sizes"].items():
            ours = [x["median_steps_per_s"] for x in v["sdpa"]]
            theirs = [x["median_steps_per_s"] for x in v["pytorch"]]
            per = [a / b for a, b in zip(ours, theirs)]
            fmt = lambda xs: f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"
            p(f"| {dtype} | {size} | {fmt(ours)} | {fmt(theirs)} | "
              f"{statistics.median(ours) / statistics.median(theirs):.2f}× | "
              f"{', '.join(f'{x:.2f}' for x in per)} |")
    p("")
    p("Per-step profiles: `train/BENCH_train.md`, `train/BENCH_train_bf16.md` in the sitting's folder.")


if __name__ == "__main__":
    main()
