#!/usr/bin/env python3
"""The model's training speed against its PyTorch twin, in one sitting, alternating rounds
(optional: nothing in the project depends on PyTorch).

    cargo build --release
    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    /tmp/torch/bin/python benches/train_side_by_side.py --rounds 5 --out docs/bench

Each round runs `sdpa train-bench --rounds 1` (ours) and `benches/pytorch_model.py --rounds 1`
(the twin) for each size, in alternating order (ours first in even rounds, PyTorch first in odd
ones), so that a drift of the machine's speed hits both. Each call is a fresh process that warms
up and then times its steps. Reported: per side the median steps/s over rounds with its range,
the ratio of the medians and the per-round ratios (paired by round), and each side's per-step
profile (median over rounds per phase). `--dtype bf16` runs both sides with the attention in
bf16 (f32 elsewhere: `sdpa train-bench --dtype bf16`, `pytorch_model.py --dtype bf16`). Writes
`BENCH_train.md` and `bench_train.json` (`BENCH_train_bf16.md`, `bench_train_bf16.json`) into
`--out`, with the CPU's flags from /proc/cpuinfo.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def cpu_model_and_flags():
    model, flags = platform.processor() or platform.machine(), []
    try:
        with open("/proc/cpuinfo") as f:
            info = dict(line.split(":", 1) for line in f.read().split("\n\n")[0].splitlines() if ":" in line)
        info = {k.strip(): v.strip() for k, v in info.items()}
        model, flags = info.get("model name", model), info.get("flags", "").split()
    except OSError:
        pass
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16",
              "avx512_fp16", "amx_tile", "amx_bf16"]
    return model, [f for f in wanted if f in flags]


def run_json(cmd, path, threads):
    # The same number of threads on both sides: PyTorch's --threads, sdpa's rayon pool.
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
    subprocess.run(cmd, check=True, stdout=sys.stderr, env=env)
    with open(path) as f:
        return json.load(f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--size", action="append", choices=["small", "large", "xlarge"])
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--sdpa", default=os.path.join(ROOT, "target", "release", "sdpa"),
                   help="the sdpa binary (default: target/release/sdpa; CARGO_TARGET_DIR is honoured)")
    p.add_argument("--implementation", default=None, help="sdpa's --implementation")
    p.add_argument("--out", default="bench-out")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--backend", default="flex", help="sdpa's --backend (cuda: use --device cuda too)")
    p.add_argument("--device", default="cpu", help="the twin's torch device (cpu or cuda)")
    a = p.parse_args()
    if "CARGO_TARGET_DIR" in os.environ and a.sdpa == os.path.join(ROOT, "target", "release", "sdpa"):
        a.sdpa = os.path.join(os.environ["CARGO_TARGET_DIR"], "release", "sdpa")
    sizes = a.size or ["small", "large"]
    work = tempfile.mkdtemp(prefix="train-side-by-side-")
    results = {s: {"sdpa": [], "pytorch": []} for s in sizes}
    for r in range(a.rounds):
        for size in sizes:
            ours = [a.sdpa, "train-bench", "--size", size, "--rounds", "1", "--out", work,
                    "--dtype", a.dtype, "--backend", a.backend, "--overwrite"]
            if a.implementation:
                ours += ["--implementation", a.implementation]
            theirs = [sys.executable, os.path.join(HERE, "pytorch_model.py"), "--size", size,
                      "--rounds", "1", "--threads", str(a.threads), "--seed", str(42 + r), "--out", work,
                      "--dtype", a.dtype, "--device", a.device]
            ours += ["--seed", str(42 + r)]
            suffix = "" if a.dtype == "f32" else "_bf16"
            order = [("sdpa", ours, f"train_{a.backend}_{size}{suffix}.json"),
                     ("pytorch", theirs, f"train_pytorch_{size}{suffix}.json")]
            if r % 2 == 1:
                order.reverse()
            for side, cmd, name in order:
                results[size][side].append(run_json(cmd, os.path.join(work, name), a.threads))
            print(f"round {r + 1}/{a.rounds} {size}: sdpa {results[size]['sdpa'][-1]['median_steps_per_s']:.1f}, "
                  f"pytorch {results[size]['pytorch'][-1]['median_steps_per_s']:.1f} steps/s", file=sys.stderr)

    model, flags = cpu_model_and_flags()
    summary = {"cpu": model, "cpu_flags": flags, "threads": a.threads, "rounds": a.rounds,
               "dtype": a.dtype, "sizes": {}}
    lines = [
        "# Training speed: the model against its PyTorch twin"
        + ("" if a.dtype == "f32" else " (attention in bf16)"),
        "",
        f"`{' '.join(['python', 'benches/train_side_by_side.py'] + sys.argv[1:])}` on {model}, "
        f"{a.threads} threads; CPU flags: {', '.join(flags) or 'none of the SIMD ones'}.",
        f"{a.rounds} rounds, alternating which side runs first; each call is a fresh process "
        "(warm-up, then its timed steps). Batch 64, Adam, no per-step logging on either side; "
        "both read the loss and the gradient norm back every step.",
        "",
        "| size | sdpa steps/s (median [min, max]) | PyTorch steps/s | ratio of medians | per-round ratios |",
        "|---|---|---|---|---|",
    ]
    profiles = []
    for size in sizes:
        rate = {side: [x["median_steps_per_s"] for x in results[size][side]] for side in ("sdpa", "pytorch")}
        ratios = [o / t for o, t in zip(rate["sdpa"], rate["pytorch"])]
        med = {side: statistics.median(v) for side, v in rate.items()}
        summary["sizes"][size] = {
            "sdpa": results[size]["sdpa"],
            "pytorch": results[size]["pytorch"],
            "median_steps_per_s": med,
            "ratio_of_medians": med["sdpa"] / med["pytorch"],
            "round_ratios": ratios,
        }
        first = results[size]["sdpa"][0]
        lines.append(
            f"| {size} (seq_len {first['seq_len']}) | {med['sdpa']:.1f} [{min(rate['sdpa']):.1f}, {max(rate['sdpa']):.1f}] "
            f"| {med['pytorch']:.1f} [{min(rate['pytorch']):.1f}, {max(rate['pytorch']):.1f}] "
            f"| {med['sdpa'] / med['pytorch']:.2f}× | {', '.join(f'{x:.2f}' for x in ratios)} |"
        )
        for side in ("sdpa", "pytorch"):
            phases = results[size][side][0]["profile_ms_per_step"].keys()
            prof = {ph: statistics.median(x["profile_ms_per_step"][ph] for x in results[size][side]) for ph in phases}
            profiles.append((size, side, prof))
    lines += ["", "Per-step profile (ms per step, median over rounds):", ""]
    for size, side, prof in profiles:
        total = sum(prof.values())
        parts = ", ".join(f"{ph} {ms:.2f}" for ph, ms in prof.items() if ms > 0.005)
        lines.append(f"- {size}, {side}: {parts} (total {total:.2f})")
    first = results[sizes[0]]
    lines += ["", f"Versions: {first['sdpa'][0]['framework']}; {first['pytorch'][0]['framework']} "
              f"(CPU capability {first['pytorch'][0]['cpu_capability']})."]
    os.makedirs(a.out, exist_ok=True)
    suffix = "" if a.dtype == "f32" else "_bf16"
    with open(os.path.join(a.out, f"bench_train{suffix}.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(a.out, f"BENCH_train{suffix}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
