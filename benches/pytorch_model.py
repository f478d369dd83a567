#!/usr/bin/env python3
"""A PyTorch twin of `sdpa train`'s default model, timed the way `sdpa train-bench` times ours
(optional: nothing in the project depends on PyTorch).

    python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
    cargo run --release -- train-bench --size small --out bench-out   # ours, same sitting
    /tmp/torch/bin/python benches/pytorch_model.py --size small --threads 2 --out bench-out
    /tmp/torch/bin/python benches/pytorch_model.py --size large --threads 2 --out bench-out

(ours first: `sdpa train-bench` writes only into an empty folder or one of its own.)

The same model (`crates/sdpa-model/src/model.rs`): token and learned position embeddings
(N(0, 1)), one pre-LayerNorm block with multi-head self-attention (four bias-free projections,
PyTorch's default Linear init = Burn's Kaiming uniform with gain 1/sqrt(3)), the residual, a final
LayerNorm and a linear head with bias; `F.scaled_dot_product_attention` with 1/sqrt(d_k); mean
cross-entropy over the scored positions of the *match* task; Adam (0.9, 0.999, eps 1e-5, Burn's
default) at lr 3e-3; batch 64. Per step, like `sdpa train`: a fresh batch drawn on the host, forward,
backward, the loss and the global gradient norm read back (the divergence check), the optimizer step.
No per-step logging on either side (`--log-every` past the budget).

Sizes: `small` is the default model (k 8, vocab 64: seq_len 16, d_model 64, 2 heads of d_k 32);
`large` is seq_len 512 (k 256, vocab 512), `xlarge` seq_len 2048 (k 1024, vocab 2048), the same
width. `--device cuda` runs the twin on the GPU (the batch drawn on the host and copied, as ours
is). Timing: `--warmup` steps, then
`--steps` steps in `--rounds` rounds; steps/s is the median over the rounds. The profile splits
each timed step into data, forward, backward, host read (loss and gradient norm) and optimizer.
Writes `train_pytorch_<size>.json`.
"""

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

SIZES = {"small": (8, 64), "large": (256, 512), "xlarge": (1024, 2048)}


class Block(nn.Module):
    def __init__(self, d_model, n_heads, d_k, dtype=torch.float32):
        super().__init__()
        self.dtype = dtype
        self.norm = nn.LayerNorm(d_model, eps=1e-5)
        self.query = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.key = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.value = nn.Linear(d_model, n_heads * d_k, bias=False)
        self.output = nn.Linear(n_heads * d_k, d_model, bias=False)
        self.n_heads, self.d_k = n_heads, d_k

    def forward(self, x):
        b, s, _ = x.shape
        h = self.norm(x)
        # [b, s, h·d_k] -> [b, h, s, d_k]
        split = lambda t: t.view(b, s, self.n_heads, self.d_k).transpose(1, 2)
        q, k, v = split(self.query(h)), split(self.key(h)), split(self.value(h))
        # --dtype bf16: the attention alone in bf16, as `sdpa train --dtype bf16` computes it
        # (f32 projections, parameters and optimizer around it).
        ctx = F.scaled_dot_product_attention(q.to(self.dtype), k.to(self.dtype), v.to(self.dtype))
        ctx = ctx.float()
        # [b, h, s, d_k] -> [b, s, h·d_k]
        ctx = ctx.transpose(1, 2).reshape(b, s, self.n_heads * self.d_k)
        return x + self.output(ctx)


class Model(nn.Module):
    def __init__(self, vocab, seq_len, n_classes, d_model=64, n_heads=2, dtype=torch.float32):
        super().__init__()
        self.token = nn.Embedding(vocab, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.block = Block(d_model, n_heads, d_model // n_heads, dtype)
        self.norm_out = nn.LayerNorm(d_model, eps=1e-5)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens, k):
        s = tokens.shape[1]
        x = self.token(tokens) + self.position(torch.arange(s, device=tokens.device).unsqueeze(0))
        x = self.norm_out(self.block(x))
        # the second half of the sequence is scored: [b, k, n_classes]
        return self.head(x[:, k:, :])


def batch(rng, b, k, vocab):
    """The match task: k distinct tokens, then a permutation of them; predict each copy's index."""
    first = np.argsort(rng.random((b, vocab)), axis=1)[:, :k]
    perm = np.argsort(rng.random((b, k)), axis=1)
    tokens = np.concatenate([first, np.take_along_axis(first, perm, axis=1)], axis=1)
    return torch.from_numpy(tokens).long(), torch.from_numpy(perm).long()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--threads", type=int, default=os.cpu_count())
    p.add_argument("--steps", type=int, default=None, help="timed steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32",
                   help="the attention's compute dtype (bf16: q, k, v cast for the SDPA call)")
    p.add_argument("--out", default=".")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (the GPU; times with synchronize)")
    a = p.parse_args()
    device = torch.device(a.device)
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    k, vocab = SIZES[a.size]
    steps = a.steps or {"small": 400, "large": 20, "xlarge": 10}[a.size]
    warmup = a.warmup if a.warmup is not None else {"small": 20, "large": 3, "xlarge": 2}[a.size]
    model = Model(vocab, 2 * k, k, dtype=torch.bfloat16 if a.dtype == "bf16" else torch.float32).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3, betas=(0.9, 0.999), eps=1e-5)
    rng = np.random.default_rng(a.seed)
    phases = {p: 0.0 for p in ("data", "forward", "backward", "host_read", "optimizer")}

    def step(profile):
        t0 = time.perf_counter()
        tokens, targets = batch(rng, a.batch_size, k, vocab)
        tokens, targets = tokens.to(device), targets.to(device)
        sync()
        t1 = time.perf_counter()
        logits = model(tokens, k)
        loss = F.cross_entropy(logits.reshape(-1, k), targets.reshape(-1))
        sync()
        t2 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        sync()
        t3 = time.perf_counter()
        grad_sq = torch.stack([g.grad.square().sum() for g in model.parameters()]).sum()
        loss_v, norm = loss.item(), grad_sq.sqrt().item()
        if not (np.isfinite(loss_v) and np.isfinite(norm)):
            raise SystemExit(f"diverged: loss {loss_v}, gradient norm {norm}")
        t4 = time.perf_counter()
        opt.step()
        sync()
        t5 = time.perf_counter()
        if profile:
            for name, dt in zip(phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                phases[name] += dt
        return loss_v

    for _ in range(warmup):
        step(False)
    rates, loss = [], float("nan")
    for _ in range(a.rounds):
        t = time.perf_counter()
        for _ in range(steps):
            loss = step(True)
        rates.append(steps / (time.perf_counter() - t))
    n = steps * a.rounds
    result = {
        "framework": f"pytorch {torch.__version__}",
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "size": a.size,
        "dtype": a.dtype,
        "k": k,
        "vocab": vocab,
        "seq_len": 2 * k,
        "batch_size": a.batch_size,
        "steps_per_round": steps,
        "rounds": a.rounds,
        "steps_per_s": rates,
        "median_steps_per_s": statistics.median(rates),
        "profile_ms_per_step": {p: 1e3 * t / n for p, t in phases.items()},
        "final_loss": loss,
    }
    os.makedirs(a.out, exist_ok=True)
    suffix = "" if a.dtype == "f32" else "_bf16"
    path = os.path.join(a.out, f"train_pytorch_{a.size}{suffix}.json")
    with open(path, "w") as f:
        json.dump(result, f, indent=2)
    prof = ", ".join(f"{p} {v:.2f}" for p, v in result["profile_ms_per_step"].items())
    print(f"pytorch {a.size} ({a.dtype}): {result['median_steps_per_s']:.1f} steps/s "
          f"(rounds {', '.join(f'{r:.1f}' for r in rates)}); ms/step: {prof} -> {path}")


if __name__ == "__main__":
    main()
