"""Hand-made golden cases for scores that overflow f32 on finite inputs (issue 51, item 6).

PyTorch cannot compute these: in float64 nothing overflows, so its answer is the softmax of huge
finite scores, not the rule that f32 implementations must follow. The expected results are the
rule's (`README.md` beside this file), computed here in float64 with the standard library only:

- a score that overflows f32 to +inf: the +inf scores of a row share its weight evenly, its other
  keys get 0 (the limit of the exact softmax as those scores grow together; every case makes the
  +inf scores of a row equal, so that this limit is also the exact float64 answer);
- a score that overflows to -inf gets weight 0;
- a row that sees keys whose scores all overflow to -inf (no sink here) has no limit: NaN context
  and weights, written `null`;
- a row with no visible key stays zero.

No gradient flows through a score that overflowed (it is a constant), nor through a NaN row: the
values get their weight's share of `grad_out`, the query and keys get nothing from such rows.
Inputs are float32 numbers (written exactly), one batch row and one head, d_k = 2 and the default
scale 1/sqrt(2): q = [3e38, 0] and k = [2, 0] give 4.2e38 > f32::MAX.

    python3 generate.py        # rewrites the *.json beside this file (standard library only)
"""

import json
import math
import pathlib
import random
import struct

HERE = pathlib.Path(__file__).resolve().parent
TOLERANCE = {"abs": 2e-4, "rel": 2e-3}
# Every score is either clearly finite in f32 or clearly beyond it (rounding cannot decide).
FINITE_BELOW = 2.5e38
OVERFLOWS_FROM = 4.0e38


def f32(x):
    """The float32 rounding of x, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def normal_rows(rng, rows, cols):
    return [[f32(rng.gauss(0.0, 1.0)) for _ in range(cols)] for _ in range(rows)]


def tensor(rows):
    """[n][d] -> a [1, 1, n, d] tensor, NaN written as null."""
    data = [None if math.isnan(x) else x for row in rows for x in row]
    return {"shape": [1, 1, len(rows), len(rows[0])], "data": data}


def reference(q, k, v, hidden, grad_out):
    """The rule's context, weights and gradients of sum(context * grad_out), in float64."""
    n, d_k, m, d_v = len(q), len(q[0]), len(k), len(v[0])
    scale = 1.0 / math.sqrt(d_k)
    nan = float("nan")
    weights, d_scores, nan_rows = [], [], []
    for i in range(n):
        scores = [scale * sum(q[i][t] * k[j][t] for t in range(d_k)) for j in range(m)]
        for s in scores:
            assert abs(s) < FINITE_BELOW or abs(s) >= OVERFLOWS_FROM, s
        visible = [j for j in range(m) if not hidden[i][j]]
        plus = [j for j in visible if scores[j] >= OVERFLOWS_FROM]
        finite = [j for j in visible if abs(scores[j]) < FINITE_BELOW]
        w = [0.0] * m
        ds = [0.0] * m
        nan_row = bool(visible) and not plus and not finite
        if plus:
            # The +inf scores share the weight; they are constants: no score gradient.
            for j in plus:
                w[j] = 1.0 / len(plus)
        elif finite:
            top = max(scores[j] for j in finite)
            e = {j: math.exp(scores[j] - top) for j in finite}
            total = sum(e.values())
            for j in finite:
                w[j] = e[j] / total
            dp = [sum(grad_out[i][c] * v[j][c] for c in range(d_v)) for j in range(m)]
            mean = sum(w[j] * dp[j] for j in range(m))
            ds = [w[j] * (dp[j] - mean) for j in range(m)]
        weights.append([nan] * m if nan_row else w)
        d_scores.append(ds)
        nan_rows.append(nan_row)
    context = [
        [nan] * d_v
        if nan_rows[i]
        else [sum(weights[i][j] * v[j][c] for j in range(m)) for c in range(d_v)]
        for i in range(n)
    ]
    # A NaN row is a constant: its weights take no part in the gradients.
    used = [[0.0] * m if nan_rows[i] else weights[i] for i in range(n)]
    grad_q = [[scale * sum(d_scores[i][j] * k[j][t] for j in range(m)) for t in range(d_k)] for i in range(n)]
    grad_k = [[scale * sum(d_scores[i][j] * q[i][t] for i in range(n)) for t in range(d_k)] for j in range(m)]
    grad_v = [[sum(used[i][j] * grad_out[i][c] for i in range(n)) for c in range(d_v)] for j in range(m)]
    return context, weights, grad_q, grad_k, grad_v


def can_fail(rows):
    """Whether an output of zeros would fail the tolerance on these expected values (or they are
    all zeros or NaN): what `sdpa golden --strict` asks of every expected tensor."""
    numbers = [x for row in rows for x in row if not math.isnan(x)]
    if all(x == 0.0 for x in numbers):
        return True
    return any(abs(x) > TOLERANCE["abs"] + TOLERANCE["rel"] * abs(x) for x in numbers)


def case(name, seed, q, k, hidden=None):
    rng = random.Random(seed)
    n, m = len(q), len(k)
    v = normal_rows(rng, m, 3)
    grad_out = normal_rows(rng, n, 3)
    q = [[f32(x) for x in row] for row in q]
    k = [[f32(x) for x in row] for row in k]
    mask = hidden if hidden is not None else [[False] * m for _ in range(n)]
    context, weights, gq, gk, gv = reference(q, k, v, mask, grad_out)
    expected = {
        "context": tensor(context),
        "weights": tensor(weights),
        "grad_query": tensor(gq),
        "grad_key": tensor(gk),
        "grad_value": tensor(gv),
    }
    for what, rows in [("context", context), ("weights", weights), ("grad_query", gq), ("grad_key", gk), ("grad_value", gv)]:
        assert can_fail(rows), f"{name}: the tolerance cannot fail on {what}"
    return {
        "name": name,
        "query": tensor(q),
        "key": tensor(k),
        "value": tensor(v),
        "mask": None
        if hidden is None
        else {"shape": [1, 1, n, m], "data": [x for row in hidden for x in row]},
        "bias": None,
        "causal": "none",
        "scale": None,
        "grad_out": tensor(grad_out),
        "expected": expected,
        "tolerance": TOLERANCE,
    }


def cases():
    rng = random.Random(5106)
    normal = lambda: [f32(rng.gauss(0.0, 1.0)) for _ in range(2)]
    # The example: row 0 scores [+inf, 0, -2.1e38]: its context is v0 exactly.
    yield case("one_score_overflows_up", 5107, [[3e38, 0.0], normal()], [[2.0, 0.0], [0.0, 1.0], [-1.0, 0.5]])
    # Two equal scores overflow to +inf: they share row 0's weight, the context is (v0 + v1) / 2.
    yield case(
        "two_scores_overflow_up_and_share", 5108, [[3e38, 0.0], normal()], [[2.0, 0.0], [2.0, 0.0], [0.0, 1.0]]
    )
    # Every score of row 0 overflows to -inf: no limit, a NaN row beside a normal row.
    yield case("every_score_overflows_down", 5109, [[-3e38, 0.0], normal()], [[2.0, 0.5], [3.0, -1.0], [2.5, 1.0]])
    # With a mask: row 0 sees no key (zero, though its scores overflow); row 1 hides key 0 (+inf)
    # and sees -inf, +inf (key 2) and -inf: weight 1 on key 2, the hidden +inf takes no share;
    # row 2 hides its +inf keys and sees only -inf (NaN); row 3 is a normal row; row 4 is normal
    # but for key 3 ([-3e38, 0]), whose score overflows to -inf: weight 0. (No row with a huge
    # query has a finite score with weight: its key gradients would be rounding noise times 3e38.)
    yield case(
        "masked_overflow",
        5110,
        [[3e38, 0.0], [3e38, 0.0], [-3e38, 0.0], normal(), [2.0, 0.3]],
        [[2.0, 0.0], [-2.0, 0.0], [2.0, 0.5], [-3e38, 0.0]],
        hidden=[
            [True, True, True, True],
            [True, False, False, False],
            [False, True, False, True],
            [False, False, False, True],
            [False, False, False, False],
        ],
    )


def main():
    for old in HERE.glob("*.json"):
        old.unlink()
    count = 0
    for c in cases():
        text = json.dumps(c, separators=(",", ":"), allow_nan=False)
        (HERE / f"{c['name']}.json").write_text(text + "\n")
        count += 1
    print(f"wrote {count} cases to {HERE}")


if __name__ == "__main__":
    main()
