#!/usr/bin/env bash
# One sitting of the CPU speed figures against PyTorch (optional: needs a PyTorch venv), every
# command alternating with its PyTorch counterpart:
#   1. the kernel at n = 1024 (b 4, h 8, d 64) in f32 and in bf16 through Burn tensors
#      (`sdpa bench`) against `F.scaled_dot_product_attention` (`benches/pytorch_sdpa.py`, with
#      the 2048³ matmul ceiling), two rounds, the order swapped in the second;
#   2. the kernel alone on host slices, f32 against bf16 (`examples/cpu_kernel_bf16`);
#   3. the model against its PyTorch twin, f32 and bf16 attention (`benches/train_side_by_side.py`,
#      5 rounds each);
#   and first the CPU's own ceilings (`examples/cpu_peak`: FMA and VDPBF16PS loops).
#
#   cargo build --release --bins --examples
#   python3 -m venv /tmp/torch && /tmp/torch/bin/pip install torch numpy
#   benches/cpu_sitting.sh /tmp/torch/bin/python docs/bench/sitting
#
# Writes everything under OUT (round folders r1, r2 with the bench files, logs, train/).
set -euo pipefail
PYTHON="${1:?usage: cpu_sitting.sh PYTHON OUT}"
OUT="${2:?usage: cpu_sitting.sh PYTHON OUT}"
cd "$(dirname "$0")/.."
TARGET="${CARGO_TARGET_DIR:-target}"
SDPA="$TARGET/release/sdpa"
THREADS="${THREADS:-$(nproc)}"
export RAYON_NUM_THREADS="$THREADS"
mkdir -p "$OUT"
lscpu > "$OUT/lscpu.txt"
"$TARGET/release/examples/cpu_peak" > "$OUT/cpu_peak.log" 2>&1

ours() {
    local dir="$1"
    # --overwrite: the round's folder holds this script's logs and PyTorch's files beside the
    # bench's (the bench writes only into a folder of its own otherwise).
    for dtype in f32 bf16; do
        "$SDPA" bench --backend flex --n 1024 --skip-memory --mode forward \
            --mode forward+backward --dtype "$dtype" --overwrite --out "$dir" \
            > "$dir/sdpa_$dtype.log" 2>&1
    done
}
theirs() {
    local dir="$1"
    "$PYTHON" benches/pytorch_sdpa.py --n 1024 --threads "$THREADS" --mode forward \
        --mode forward+backward --matmul --out "$dir" > "$dir/pytorch_f32.log" 2>&1
    "$PYTHON" benches/pytorch_sdpa.py --n 1024 --threads "$THREADS" --mode forward \
        --mode forward+backward --dtype bf16 --out "$dir" > "$dir/pytorch_bf16.log" 2>&1
}
for round in 1 2; do
    dir="$OUT/r$round"
    mkdir -p "$dir"
    if [ "$round" = 1 ]; then ours "$dir"; theirs "$dir"; else theirs "$dir"; ours "$dir"; fi
    echo "round $round done" >&2
done
"$TARGET/release/examples/cpu_kernel_bf16" > "$OUT/cpu_kernel_bf16.log" 2>&1
"$TARGET/release/examples/cpu_kernel_bf16" b=64 h=2 d=32 512 > "$OUT/cpu_kernel_bf16_model_shape.log" 2>&1
for dtype in f32 bf16; do
    "$PYTHON" benches/train_side_by_side.py --rounds 5 --threads "$THREADS" --dtype "$dtype" \
        --sdpa "$SDPA" --out "$OUT/train" > "$OUT/train_$dtype.log" 2>&1
done
echo "sitting done: $OUT" >&2
