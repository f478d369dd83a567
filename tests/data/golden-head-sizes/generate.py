"""Golden cases for the head sizes the CubeCL kernel tiles from the device's limits (issue 36),
with attention sinks and quiet softmax at three of them (issue 32).

Computed as the cases in `../golden/` are: float32 inputs (seeded), the attention and its
gradients in float64 with PyTorch (`loss = sum(context * grad_out)`), the contract of
`../golden/README.md` (bool masks: true = masked out; causal "top_left" / "bottom_right";
grouped-query heads in `repeat_interleave` order), and each case checked against PyTorch's own
`F.scaled_dot_product_attention` in float64. Values are written as the shortest decimals of
their float32 roundings.

    python generate.py        # rewrites the *.json beside this file (needs torch and numpy)
"""

import json
import math
import pathlib

import numpy as np
import torch
import torch.nn.functional as F

HERE = pathlib.Path(__file__).resolve().parent
TOLERANCE = {"abs": 2e-4, "rel": 2e-3}


def f32_list(t):
    return [float(str(np.float32(x))) for x in t.detach().reshape(-1).tolist()]


def tensor(t):
    return {"shape": list(t.shape), "data": f32_list(t)}


def hidden_by_causal(kind, n, m):
    """[n, m] bool, true where the causal rule hides key j from query i."""
    i = torch.arange(n).unsqueeze(1)
    j = torch.arange(m).unsqueeze(0)
    if kind == "none":
        return torch.zeros(n, m, dtype=torch.bool)
    offset = 0 if kind == "top_left" else m - n
    return j > i + offset


def reference(q, k, v, mask, causal, grad_out, sinks=None):
    """softmax(q kᵀ / √d_k + masks) v in float64, with the zero-row rule, and its gradients.

    `sinks` ([h] float32, or None): a logit per query head in every row's denominator that takes
    no value (`../golden/README.md`, extensions3); its gradient is returned too (None without).
    """
    q, k, v = (t.double().requires_grad_(True) for t in (q, k, v))
    sinks = None if sinks is None else sinks.double().requires_grad_(True)
    b, h, n, d_k = q.shape
    h_kv, m = k.shape[1], k.shape[2]
    group = h // h_kv
    kr = k.repeat_interleave(group, dim=1)
    vr = v.repeat_interleave(group, dim=1)
    scores = q @ kr.transpose(-1, -2) / math.sqrt(d_k)
    hidden = hidden_by_causal(causal, n, m).expand(b, h, n, m)
    if mask is not None:
        hidden = hidden | mask.expand(b, h, n, m)
    scores = scores.masked_fill(hidden, float("-inf"))
    row_max = scores.amax(dim=-1, keepdim=True)
    if sinks is not None:
        row_max = torch.maximum(row_max, sinks.detach().reshape(1, h, 1, 1))
    empty = torch.isinf(row_max)
    shift = torch.where(empty, torch.zeros_like(row_max), row_max)
    weights = torch.exp(scores - shift)
    weights = weights.masked_fill(hidden, 0.0)
    total = weights.sum(dim=-1, keepdim=True)
    if sinks is not None:
        total = total + torch.exp(sinks.reshape(1, h, 1, 1) - shift)
    weights = weights / torch.where(total > 0, total, torch.ones_like(total))
    context = weights @ vr
    (context * grad_out.double()).sum().backward()
    # PyTorch's own SDPA on the same case (rows with a visible key; none here is fully masked);
    # a sink is one more key in front, with a zero key and value row and the sink as its
    # float-mask logit.
    q0, k0, v0 = q.detach(), kr.detach(), vr.detach()
    if sinks is None:
        attn_mask = ~hidden
    else:
        zero = lambda t: torch.cat([torch.zeros_like(t[:, :, :1]), t], dim=2)
        k0, v0 = zero(k0), zero(v0)
        column = sinks.detach().reshape(1, h, 1, 1).expand(b, h, n, 1)
        rest = torch.zeros(b, h, n, m, dtype=torch.float64).masked_fill(hidden, float("-inf"))
        attn_mask = torch.cat([column, rest], dim=3)
    torch_ctx = F.scaled_dot_product_attention(q0, k0, v0, attn_mask=attn_mask)
    assert torch.allclose(torch_ctx, context.detach(), atol=1e-10), "disagrees with F.sdpa"
    grad_sinks = None if sinks is None else sinks.grad
    return context, weights, q.grad, k.grad, v.grad, grad_sinks


def case(name, seed, b, h, h_kv, n, m, d_k, d_v, causal, padding=None, sinks=None, quiet=False):
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32)
    q, k, v = randn(b, h, n, d_k), randn(b, h_kv, m, d_k), randn(b, h_kv, m, d_v)
    grad_out = randn(b, h, n, d_v)
    mask = None
    if padding is not None:
        # [b, 1, 1, m]: batch row r hides its last padding[r] keys.
        mask = torch.zeros(b, 1, 1, m, dtype=torch.bool)
        for r, pad in enumerate(padding):
            if pad:
                mask[r, 0, 0, m - pad :] = True
    sink_logits = None
    if sinks is not None:
        sink_logits = torch.tensor(sinks, dtype=torch.float32)
    elif quiet:
        sink_logits = torch.zeros(h, dtype=torch.float32)
    context, weights, gq, gk, gv, g_sinks = reference(q, k, v, mask, causal, grad_out, sink_logits)
    extension = {}
    if sinks is not None:
        extension["sinks"] = f32_list(sink_logits)
    if quiet:
        extension["quiet_softmax"] = True
    expected_sinks = {} if sinks is None else {"grad_sinks": f32_list(g_sinks)}
    return {
        "name": name,
        "query": tensor(q),
        "key": tensor(k),
        "value": tensor(v),
        "mask": None
        if mask is None
        else {"shape": list(mask.shape), "data": mask.reshape(-1).tolist()},
        "bias": None,
        "causal": causal,
        "scale": None,
        **extension,
        "grad_out": tensor(grad_out),
        "expected": {
            "context": tensor(context),
            "weights": tensor(weights),
            "grad_query": tensor(gq),
            "grad_key": tensor(gk),
            "grad_value": tensor(gv),
            **expected_sinks,
        },
        "tolerance": TOLERANCE,
    }


def cases():
    # d_v != d_k: a smaller value head, as in DeepSeek's MLA (d_k 192, d_v 128).
    other_dv = {96: 64, 128: 64, 160: 128, 192: 128, 256: 128}
    seed = 3600
    for d_k in [96, 128, 160, 192, 256]:
        d_v = other_dv[d_k]
        yield case(f"head_{d_k}_plain", seed, 1, 2, 2, 6, 9, d_k, d_k, "none")
        yield case(
            f"head_{d_k}_causal_bottom_right_gqa", seed + 1, 1, 4, 2, 5, 11, d_k, d_k, "bottom_right"
        )
        yield case(f"head_{d_k}_dv_{d_v}_top_left_n_gt_m", seed + 2, 1, 2, 2, 7, 5, d_k, d_v, "top_left")
        yield case(
            f"head_{d_k}_dv_{d_v}_decoding_padded",
            seed + 3,
            2,
            2,
            1,
            1,
            13,
            d_k,
            d_v,
            "bottom_right",
            padding=[0, 3],
        )
        seed += 10
    yield case("head_512_causal_bottom_right", seed, 1, 2, 2, 4, 6, 512, 512, "bottom_right")
    yield case("head_320_dv_512_plain", seed + 1, 1, 1, 1, 3, 5, 320, 512, "none")
    # Attention sinks and quiet softmax (`../golden/README.md`, extensions3) at large heads: the
    # CubeCL kernel's tiles for them, with its sink term and the sinks' gradient.
    yield case(
        "head_128_sinks_causal_bottom_right_gqa",
        seed + 2, 1, 4, 2, 5, 11, 128, 128, "bottom_right", sinks=[1.5, -0.5, 0.0, 3.0],
    )
    yield case(
        "head_256_dv_128_sinks_decoding_padded",
        seed + 3, 2, 2, 1, 1, 13, 256, 128, "bottom_right", padding=[0, 3], sinks=[2.0, -1.0],
    )
    yield case(
        "head_192_quiet_top_left_n_gt_m", seed + 4, 1, 2, 2, 7, 5, 192, 192, "top_left", quiet=True
    )


def main():
    for old in HERE.glob("*.json"):
        old.unlink()
    count = 0
    for c in cases():
        (HERE / f"{c['name']}.json").write_text(json.dumps(c, separators=(",", ":")) + "\n")
        count += 1
    print(f"wrote {count} cases to {HERE}")


if __name__ == "__main__":
    main()
