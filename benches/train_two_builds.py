#!/usr/bin/env python3
"""Two builds of `sdpa` on the same training command, in alternating rounds: is a build slower
than an older one on this machine? (The question of issue 29: was part of a drop in training
speed a regression in this codebase?)

    git worktree add /tmp/old <commit>
    (cd /tmp/old && CARGO_TARGET_DIR=/tmp/old-target cargo build --release --bin sdpa)
    python3 benches/train_two_builds.py --old /tmp/old-target/release/sdpa \
        --new target/release/sdpa --rounds 5 --out docs/bench

Each round runs `sdpa train --k 8 --vocab 64 --steps 400 --no-early-stop` (the issue's command;
`--train-args` replaces it) with each binary in a fresh run folder, in alternating order (new
first in even rounds), and reads steps/s from the run's `summary.json` (wall time of the whole
run: records every 10 steps and held-out evaluations every 50 included, as `sdpa train` runs by
default). Reported: per build the median steps/s with its range, the per-round ratios new/old
(paired by round) and their median. Writes `BENCH_train_builds.md` and `bench_train_builds.json`.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile

DEFAULT_ARGS = "--k 8 --vocab 64 --steps 400 --no-early-stop"


def run(binary, args, out):
    cmd = [binary, "train", *shlex.split(args), "--out", out]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=sys.stderr)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)["steps_per_s"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--old", required=True, help="the older build's sdpa binary")
    p.add_argument("--new", required=True, help="the newer build's sdpa binary")
    p.add_argument("--old-name", default="old", help="a label for the older build (e.g. its commit)")
    p.add_argument("--new-name", default="new", help="a label for the newer build")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--train-args", default=DEFAULT_ARGS)
    p.add_argument("--out", default="bench-out")
    a = p.parse_args()
    work = tempfile.mkdtemp(prefix="train-two-builds-")
    rates = {"old": [], "new": []}
    for r in range(a.rounds):
        order = ["new", "old"] if r % 2 == 0 else ["old", "new"]
        for side in order:
            binary = a.old if side == "old" else a.new
            rates[side].append(run(binary, a.train_args, os.path.join(work, f"{side}-{r}")))
        print(f"round {r + 1}/{a.rounds}: {a.new_name} {rates['new'][-1]:.1f}, "
              f"{a.old_name} {rates['old'][-1]:.1f} steps/s", file=sys.stderr)
    ratios = [n / o for n, o in zip(rates["new"], rates["old"])]
    summary = {
        "command": f"sdpa train {a.train_args}",
        "rounds": a.rounds,
        "builds": {a.old_name: rates["old"], a.new_name: rates["new"]},
        "ratios_new_over_old": ratios,
        "median_ratio": statistics.median(ratios),
    }
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "bench_train_builds.json"), "w") as f:
        json.dump(summary, f, indent=2)
    fmt = lambda xs: f"{statistics.median(xs):.1f} [{min(xs):.1f}, {max(xs):.1f}]"
    lines = [
        "# Training speed of two builds, side by side",
        "",
        f"`{' '.join(['python', 'benches/train_two_builds.py'] + sys.argv[1:])}`: "
        f"`sdpa train {a.train_args}` with each build, {a.rounds} rounds alternating which runs "
        "first, a fresh process and run folder each; steps/s over the whole run (records and "
        "evaluations included).",
        "",
        "| build | steps/s, median [min, max] |",
        "|---|---|",
        f"| {a.old_name} | {fmt(rates['old'])} |",
        f"| {a.new_name} | {fmt(rates['new'])} |",
        "",
        f"Per-round ratios {a.new_name} / {a.old_name}: {', '.join(f'{x:.2f}' for x in ratios)} "
        f"(median {statistics.median(ratios):.2f}).",
    ]
    with open(os.path.join(a.out, "BENCH_train_builds.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
