#!/usr/bin/env python3
"""The PyTorch side of `benches/gpu_sitting.sh` (optional: nothing in the project depends on
PyTorch): `F.scaled_dot_product_attention` on the sitting's cells, a bf16 matmul ceiling, and the
versions, each result appended to a JSON-lines file as soon as it is measured.

    python3 benches/gpu_torch.py env matmul --size 8192 --out OUT/rows.jsonl
    python3 benches/gpu_torch.py sdpa --cell bf16:128:4096 --b 4 --h 16 --mode forward \\
        --mode forward+backward --out OUT/rows.jsonl

Cells are `dtype:d:n` (n = m), with the modes of `sdpa bench --mode` (forward,
forward+backward, "forward, causal", "forward+backward, causal"). The SDPA backend is forced:
bf16 (and f16) through FlashAttention (`torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)`),
f32 through the memory-efficient backend (flash has no f32) with TF32 off, so that f32 is f32; a
backend that refuses the cell falls back to the math backend, and each row says which backend
ran. On the GPU the timing is CUDA events around each run (a warm-up, then at least `--reps`
runs and until `--min-total-ms`, at most `--max-reps`; the median), on the CPU (`--device cpu`,
the `--small` sitting) wall-clock time. Flops as `sdpa bench` and `benches/pytorch_sdpa.py`
count them: 4·b·h·n²·d forward, 12·b·h·n²·d forward + backward, half of it causal. A cell that
runs out of memory is written as a row with its error, and the next cell runs.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

MODES = {
    "forward": (False, False),
    "forward+backward": (True, False),
    "forward, causal": (False, True),
    "forward+backward, causal": (True, True),
}
DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def append(path, row):
    """Appends one JSON row and flushes it to disk (a cut run keeps what it measured)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    print(json.dumps({k: v for k, v in row.items() if k != "times_ms"}), flush=True)


def timer(device):
    """A function timing one call of `fn` in ms: CUDA events on the GPU, wall clock on the CPU."""
    if device.type == "cuda":
        def run(fn):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end)
    else:
        def run(fn):
            t = time.perf_counter()
            fn()
            return (time.perf_counter() - t) * 1e3
    return run


def repeat(args, device, fn):
    """A warm-up, then the timed runs (ms)."""
    time_once = timer(device)
    fn()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
    times = []
    while len(times) < args.max_reps and (len(times) < args.reps or sum(times) < args.min_total_ms):
        times.append(time_once(fn))
    return times


def backends_for(dtype, device):
    """(name, SDPBackend list) to try, in order: the forced fast backend, then math."""
    from torch.nn.attention import SDPBackend
    if device.type != "cuda":
        return [("math (CPU)", [SDPBackend.MATH])]
    if dtype == torch.float32:
        return [("efficient (f32, TF32 off)", [SDPBackend.EFFICIENT_ATTENTION]),
                ("math (f32, TF32 off)", [SDPBackend.MATH])]
    return [("flash", [SDPBackend.FLASH_ATTENTION]), ("math", [SDPBackend.MATH])]


def sdpa_cell(args, device, dtype_name, d, n, mode, generator):
    from torch.nn.attention import sdpa_kernel
    backward, causal = MODES[mode]
    dtype = DTYPES[dtype_name]
    row = {"side": "pytorch", "path": "pytorch", "dtype": dtype_name, "b": args.b, "h": args.h, "d": d,
           "n": n, "mode": mode, "device": str(device)}
    flops = (12.0 if backward else 4.0) * args.b * args.h * n * n * d
    if causal:
        flops /= 2.0
    errors = []
    for name, kinds in backends_for(dtype, device):
        q = k = v = None
        try:
            shape = (args.b, args.h, n, d)
            q, k, v = (torch.randn(shape, generator=generator, device=device).to(dtype) for _ in range(3))
            if backward:
                for t in (q, k, v):
                    t.requires_grad_(True)

            def once():
                with sdpa_kernel(kinds):
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                if backward:
                    # The loss summed in f32 for every dtype, as `sdpa bench` does.
                    out.float().sum().backward()
                    for t in (q, k, v):
                        t.grad = None

            times = repeat(args, device, once)
            med = statistics.median(times)
            row.update({"backend": name, "median_ms": med, "times_ms": times,
                        "tflops": flops / (med * 1e-3) / 1e12})
            if errors:
                row["fallback_because"] = errors
            return row
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:  # refused or out of memory
            errors.append(f"{name}: {str(e).splitlines()[0][:300]}")
        finally:
            del q, k, v
            if device.type == "cuda":
                torch.cuda.empty_cache()
    row["error"] = "; ".join(errors)
    return row


def matmul(args, device, generator):
    rows = []
    for dtype_name in args.matmul_dtype or ["bf16"]:
        dtype = DTYPES[dtype_name]
        s = args.size
        row = {"side": "pytorch", "path": "matmul", "dtype": dtype_name, "size": s, "device": str(device)}
        try:
            a = torch.randn(s, s, generator=generator, device=device).to(dtype)
            b = torch.randn(s, s, generator=generator, device=device).to(dtype)
            times = repeat(args, device, lambda: a @ b)
            med = statistics.median(times)
            row.update({"median_ms": med, "times_ms": times, "tflops": 2 * s**3 / (med * 1e-3) / 1e12,
                        "tf32": bool(torch.backends.cuda.matmul.allow_tf32)})
        except (RuntimeError, torch.cuda.OutOfMemoryError) as e:
            row["error"] = str(e).splitlines()[0][:300]
        rows.append(row)
    return rows


def env(device):
    info = {"side": "pytorch", "path": "env", "python": sys.version.split()[0], "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "machine": platform.platform(), "device": str(device)}
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        info.update({"gpu": p.name, "capability": f"{p.major}.{p.minor}",
                     "gpu_memory_gib": p.total_memory / 2**30, "sms": p.multi_processor_count,
                     "cudnn": torch.backends.cudnn.version(),
                     "flash_sdp_enabled": torch.backends.cuda.flash_sdp_enabled()})
    return info


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", nargs="+", choices=["env", "matmul", "sdpa"],
                   help="what to measure, in this order (one process: PyTorch starts once)")
    p.add_argument("--out", required=True, help="the JSON-lines file rows are appended to")
    p.add_argument("--device", default="cuda")
    p.add_argument("--cell", action="append", default=[], help="dtype:d:n (repeatable)")
    p.add_argument("--mode", action="append", help="a mode as `sdpa bench --mode` spells it (repeatable)")
    p.add_argument("--b", type=int, default=4)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--size", type=int, default=8192, help="the matmul's size (size³)")
    p.add_argument("--matmul-dtype", action="append", choices=sorted(DTYPES))
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--max-reps", type=int, default=50)
    p.add_argument("--min-total-ms", type=float, default=200.0)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        # f32 is f32: no TF32 in the f32 cells or the f32 matmul.
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    generator = torch.Generator(device=device).manual_seed(args.seed)
    modes = args.mode or list(MODES)
    for bad in [m for m in modes if m not in MODES]:
        p.error(f"unknown mode {bad!r}: one of {list(MODES)}")
    if "env" in args.what:
        append(args.out, env(device))
    if "matmul" in args.what:
        for row in matmul(args, device, generator):
            append(args.out, row)
    if "sdpa" in args.what:
        for cell in args.cell:
            dtype_name, d, n = cell.split(":")
            for mode in modes:
                append(args.out, sdpa_cell(args, device, dtype_name, int(d), int(n), mode, generator))


if __name__ == "__main__":
    main()
