#!/usr/bin/env python3
"""Paired before/after timing of two builds of `examples/cpu_kernel_bf16.rs`.

Run (the two binaries take turns, the order swapped every pair, each run's table appended to LOG
under a line `== LABEL PAIR`):

    python3 benches/ab_pairs.py run LOG PAIRS old=/path/old new=/path/new -- b=64 h=2 d=32 512

Analyse (per mode and dtype: the median of the per-pair ratios OTHER / BASE and its 95% bootstrap
interval, 5000 resamples, seed 1; and how many ratios are above 1):

    python3 benches/ab_pairs.py analyse LOG old new

A ratio above 1 means OTHER is slower. Standard library only.
"""

import random
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\| (\d+) \| (forward(?: \+ backward)?) \| ([\d.]+) .*?\| ([\d.]+) ")


def run(log, pairs, binaries, args):
    labels = list(binaries)
    with open(log, "a", encoding="utf-8") as out:
        for pair in range(1, pairs + 1):
            order = labels if pair % 2 else labels[::-1]
            for label in order:
                text = subprocess.run(
                    [binaries[label], *args], capture_output=True, text=True, check=True
                ).stdout
                rows = [line for line in text.splitlines() if ROW.match(line)]
                out.write(f"== {label} {pair}\n" + "\n".join(rows) + "\n")
                out.flush()


def parse(log):
    data, current = {}, None
    with open(log, encoding="utf-8") as lines:
        for line in lines:
            header = re.match(r"== (\S+) (\d+)", line)
            if header:
                current = (header.group(1), int(header.group(2)))
                continue
            row = ROW.match(line)
            if row and current:
                n, mode, f32_ms, bf16_ms = row.groups()
                data[(*current, f"n={n} {mode}", "f32")] = float(f32_ms)
                data[(*current, f"n={n} {mode}", "bf16")] = float(bf16_ms)
    return data


def analyse(log, base, other):
    data = parse(log)
    rng = random.Random(1)
    cells = sorted({(mode, dtype) for (_, _, mode, dtype) in data})
    pairs = sorted({pair for (label, pair, _, _) in data if label == base})
    for mode, dtype in cells:
        ratios = [
            data[(other, p, mode, dtype)] / data[(base, p, mode, dtype)]
            for p in pairs
            if (other, p, mode, dtype) in data and (base, p, mode, dtype) in data
        ]
        if not ratios:
            continue
        boots = sorted(
            statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(5000)
        )
        above = sum(r > 1 for r in ratios)
        print(
            f"{mode:24s} {dtype:5s} pairs {len(ratios):2d}  {other}/{base} median "
            f"{statistics.median(ratios):.3f}  95% [{boots[125]:.3f}, {boots[4874]:.3f}]  "
            f"above 1: {above}"
        )


def main(argv):
    if len(argv) >= 4 and argv[0] == "run" and "--" in argv:
        split = argv.index("--")
        binaries = dict(arg.split("=", 1) for arg in argv[3:split])
        run(argv[1], int(argv[2]), binaries, argv[split + 1 :])
    elif len(argv) == 4 and argv[0] == "analyse":
        analyse(argv[1], argv[2], argv[3])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
