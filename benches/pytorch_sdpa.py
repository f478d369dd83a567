#!/usr/bin/env python3
"""PyTorch's `F.scaled_dot_product_attention` on the same cells as `sdpa bench`, for a comparison
measured in one sitting on one machine (optional: nothing in the project depends on PyTorch).

    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    cargo run --release -- bench --backend flex --n 1024 --skip-memory --out bench-out
    /tmp/torch/bin/python benches/pytorch_sdpa.py --n 1024 --threads 2 --out bench-out

(`sdpa bench` first: it writes only into an empty folder or one of its own, see its `--out`.)

Same sizes (b = 4, h = 8, d = 64, n = m), f32, the same six modes (forward and forward +
backward; dense, a padding mask hiding the last 1/8 of every batch element's keys, causal), the
same timing rule (a warm-up, then at least 5 runs and until 3 s in total, at most 30; the
median), the same flop count (4·b·h·n²·d forward, 12·b·h·n²·d forward + backward; half of it
causal). Writes BENCH_pytorch.md and bench_pytorch.json.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn.functional as F

MODES = [
    ("forward", False, "dense"),
    ("forward+backward", True, "dense"),
    ("forward, padded", False, "padded"),
    ("forward+backward, padded", True, "padded"),
    ("forward, causal", False, "causal"),
    ("forward+backward, causal", True, "causal"),
]


def cell(b, h, n, d, masking, backward, padded_fraction, generator, dtype=torch.float32):
    shape = (b, h, n, d)
    q, k, v = (torch.randn(shape, generator=generator).to(dtype) for _ in range(3))
    if backward:
        for t in (q, k, v):
            t.requires_grad_(True)
    mask = None
    if masking == "padded":
        visible = n - min(round(n * padded_fraction), n - 1)
        # PyTorch's bool mask is True where attention is *allowed*: [b, 1, 1, n].
        mask = torch.zeros((b, 1, 1, n), dtype=torch.bool)
        mask[..., :visible] = True
    return q, k, v, mask


def run_once(q, k, v, mask, masking, backward):
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=masking == "causal")
    if backward:
        # The loss is summed in f32 for every dtype (as `sdpa bench` does).
        out.float().sum().backward()
        for t in (q, k, v):
            t.grad = None


def time_mode(args, n, name, backward, masking, generator):
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    q, k, v, mask = cell(args.b, args.h, n, args.d, masking, backward, args.padded_fraction, generator,
                         dtype)
    run_once(q, k, v, mask, masking, backward)  # warm-up
    times = []
    while len(times) < args.max_reps and (len(times) < args.reps or sum(times) < args.min_total_ms):
        t0 = time.perf_counter()
        run_once(q, k, v, mask, masking, backward)
        times.append((time.perf_counter() - t0) * 1e3)
    flops = (12.0 if backward else 4.0) * args.b * args.h * n * n * args.d
    if masking == "causal":
        flops /= 2.0
    med = statistics.median(times)
    return {"mode": name, "n": n, "median_ms": med, "times_ms": times, "gflops": flops / (med * 1e-3) / 1e9}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, action="append", help="n = m (repeatable; default 128..4096)")
    p.add_argument("--mode", action="append", help="a mode name as `sdpa bench --mode` spells it (repeatable)")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--b", type=int, default=4)
    p.add_argument("--h", type=int, default=8)
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--max-reps", type=int, default=30)
    p.add_argument("--min-total-ms", type=float, default=3000.0)
    p.add_argument("--padded-fraction", type=float, default=0.125)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="bench-out")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="q, k, v in this dtype (bf16: BENCH_pytorch_bf16.md, bench_pytorch_bf16.json)")
    p.add_argument("--matmul", action="store_true",
                   help="also time a 2048³ matmul in f32 and bf16 (the machine's ceiling)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    ns = args.n or [128, 256, 512, 1024, 2048, 4096]
    modes = [m for m in MODES if not args.mode or m[0] in args.mode]
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for n in ns:
        for name, backward, masking in modes:
            row = time_mode(args, n, name, backward, masking, generator)
            print(f"pytorch {name} n={n}: {row['median_ms']:.1f} ms, {row['gflops']:.1f} GFLOP/s", flush=True)
            rows.append(row)
    ceilings = {}
    if args.matmul:
        for name, dt in (("f32", torch.float32), ("bf16", torch.bfloat16)):
            a_mat = torch.randn(2048, 2048, generator=generator).to(dt)
            b_mat = torch.randn(2048, 2048, generator=generator).to(dt)
            times = []
            for _ in range(8):
                t = time.perf_counter()
                a_mat @ b_mat
                times.append(time.perf_counter() - t)
            ceilings[name] = 2 * 2048**3 / statistics.median(times[2:]) / 1e9
            print(f"pytorch matmul 2048³ {name}: {ceilings[name]:.0f} GFLOP/s", flush=True)
    os.makedirs(args.out, exist_ok=True)
    suffix = "" if args.dtype == "f32" else "_bf16"
    meta = {
        "dtype": args.dtype,
        "matmul_2048_gflops": ceilings,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "b": args.b,
        "h": args.h,
        "d": args.d,
        "padded_fraction": args.padded_fraction,
    }
    with open(os.path.join(args.out, f"bench_pytorch{suffix}.json"), "w") as f:
        json.dump({"config": meta, "rows": rows}, f, indent=2)
    lines = [
        f"## PyTorch {torch.__version__} `F.scaled_dot_product_attention` in {args.dtype}, {meta['threads']} threads "
        f"(b = {args.b}, h = {args.h}, d = {args.d}; median of {args.reps} to {args.max_reps} runs after a "
        f"warm-up, more runs until {args.min_total_ms:.0f} ms; padded: the last {100 * args.padded_fraction:.1f}% "
        "of the keys hidden, dense flops; causal: half the flops)",
        "",
        "| mode | n | median ms | GFLOP/s |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['mode']} | {r['n']} | {r['median_ms']:.1f} | {r['gflops']:.1f} |" for r in rows]
    if ceilings:
        lines += ["", "A 2048³ matmul (the machine's ceiling): "
                  + ", ".join(f"{k} {v:.0f} GFLOP/s" for k, v in ceilings.items()) + "."]
    with open(os.path.join(args.out, f"BENCH_pytorch{suffix}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {args.out}/BENCH_pytorch{suffix}.md and bench_pytorch{suffix}.json")


if __name__ == "__main__":
    main()
