#!/usr/bin/env bash
# One GPU sitting (issue 52): the golden cases and the attention speed on `--backend cuda`,
# against PyTorch's `F.scaled_dot_product_attention` and a bf16 matmul ceiling measured in the
# same run, then the model's training steps/s against its PyTorch twin. Made for a lent GPU
# machine (CUDA, Python and PyTorch; no Rust): the sdpa binary comes prebuilt.
#
#   benches/gpu_sitting.sh [--small|--headline] KIT_OR_BINARY OUT_DIR
#
# KIT_OR_BINARY is the GPU kit (.gpu/kit.tar.xz, from benches/gpu_kit.sh: two `sdpa` binaries,
# CUDA kernels compiled by LLVM or by NVRTC, and a Vulkan loader), or one `sdpa` binary (which
# may be xz-compressed, a name ending in .xz). The binaries link LLVM 23.1: .ci/llvm-for-cuda.sh
# lays out Debian sid's where cubecl-cuda's LLVM bundler looks (tracel's own bundle needs
# GitHub: the bundler downloads tracel-llvm-23.1.0-4-linux-x64.tar.xz and its .checksums.json
# into ~/.cache/tracel/; on a machine without network, put the two files there and build with
# TRACEL_LLVM_BUNDLER_SKIP_CHECKSUM_DOWNLOAD=1).
#
# A preflight of at most 30 s comes first (OUT/preflight.txt): nvidia-smi, the glibc version,
# libcuda, where libnvrtc is (the system's, or PyTorch's site-packages), NVIDIA's Vulkan ICD and
# a Vulkan loader (the kit's where the host has none), PyTorch's version and whether its flash
# SDPA runs, and whether each of the kit's binaries opens the device. What is missing is
# recorded and the sitting goes on with what works. From a kit, the sitting runs the NVRTC
# binary where libnvrtc was found and it opened the device, else the LLVM one
# (SITTING_COMPILER=llvm|nvrtc picks); the report names the compiler that produced the kernels.
#
#   (full)      about 8 minutes at most (SITTING_BUDGET seconds, default 460): every step below,
#               the most important first, each skipped once the budget is spent;
#   --headline  about 4 minutes at most (default budget 230 s): b 4, h 16, d 128, n = m = 4096,
#               bf16 (f32 with SITTING_BACKEND=wgpu), forward and forward + backward (dense and
#               causal), every side (the tensor-core kernels, cube_tensor_cores, in bf16), then
#               the cube_tensor_cores golden cases in bf16 if time is left;
#   --small     the same script end to end on `--backend wgpu` (lavapipe on a CPU-only machine)
#               at tiny sizes, PyTorch on the CPU if $PYTHON has torch (else that side is
#               skipped): run it before spending GPU time.
#
# Every step runs under `timeout`, so a hang or a crash (a GPU out of memory) is recorded and the
# sitting goes on; every figure is appended to OUT/rows.jsonl as it is measured and
# OUT/BENCH_gpu.md + OUT/bench_gpu.json are rendered again after each step, so a run cut short
# still returns what it measured. OUT/env.txt (nvidia-smi and versions) is written first,
# OUT/steps.tsv lists every step (exit code, seconds), OUT/logs/ holds each step's output and
# OUT/bench/ each `sdpa bench` run's own files.
#
# Environment: PYTHON (default python3; the PyTorch side and the tables), SITTING_BUDGET
# (seconds), GPU_B / GPU_H (default 4 / 16), SITTING_BACKEND (default cuda; wgpu runs our side
# through Vulkan on the same GPU, for a binary built without the cuda feature: wgpu has no bf16,
# so its bf16 cells are recorded as refused).
set -uo pipefail

mode=full
case "${1:-}" in
    --small) mode=small; shift ;;
    --headline) mode=headline; shift ;;
esac
SDPA="${1:?usage: gpu_sitting.sh [--small|--headline] KIT_OR_BINARY OUT_DIR}"
OUT="${2:?usage: gpu_sitting.sh [--small|--headline] KIT_OR_BINARY OUT_DIR}"
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
case "$SDPA" in /*) ;; *) SDPA="$ROOT/$SDPA" ;; esac
mkdir -p "$OUT/logs" "$OUT/bench" || exit 2
OUT="$(cd "$OUT" && pwd)"
PYTHON="${PYTHON:-python3}"
# The kit (KIT.tar.xz) is unpacked into this run's temporary folder (tar with xz, or Python's
# tarfile where xz is missing); a binary carried compressed (SDPA.xz) likewise.
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu-sitting.XXXXXX")"
trap 'rm -rf "$SCRATCH"' EXIT
unxz_to() { # FILE.xz DEST: xz, or Python's lzma where xz is missing
    if command -v xz >/dev/null 2>&1; then xz -dc "$1" > "$2"; else
        "$PYTHON" -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"
    fi
}
KIT=""
declare -A KIT_BINARIES=()
if [ "${SDPA%.tar.xz}" != "$SDPA" ]; then
    unxz_to "$SDPA" "$SCRATCH/kit.tar" && tar -C "$SCRATCH" -xf "$SCRATCH/kit.tar" && rm "$SCRATCH/kit.tar" \
        || { echo "cannot unpack the kit $SDPA" >&2; exit 2; }
    KIT="$SCRATCH/kit"
    for compiler in llvm nvrtc; do
        [ -x "$KIT/sdpa-$compiler" ] && KIT_BINARIES[$compiler]="$KIT/sdpa-$compiler"
    done
    [ "${#KIT_BINARIES[@]}" -gt 0 ] || { echo "no sdpa-llvm or sdpa-nvrtc in the kit $SDPA" >&2; exit 2; }
    SDPA="${KIT_BINARIES[llvm]:-${KIT_BINARIES[nvrtc]}}"
elif [ "${SDPA%.xz}" != "$SDPA" ]; then
    unxz_to "$SDPA" "$SCRATCH/sdpa" || { echo "cannot unpack $SDPA" >&2; exit 2; }
    chmod +x "$SCRATCH/sdpa"
    SDPA="$SCRATCH/sdpa"
fi
[ -x "$SDPA" ] || { echo "not an executable: $SDPA" >&2; exit 2; }
REPORT=("$PYTHON" "$ROOT/benches/gpu_sitting_report.py")
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg-runtime-$(id -u)}"
mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"

case "$mode" in
    full) budget="${SITTING_BUDGET:-460}" ;;
    headline) budget="${SITTING_BUDGET:-230}" ;;
    small) budget="${SITTING_BUDGET:-1800}" ;;
esac
START=$(date +%s)
DEADLINE=$((START + budget))
MIN_STEP=12

if [ "$mode" = small ]; then
    BACKEND="${SITTING_BACKEND:-wgpu}"; B="${GPU_B:-1}"; H="${GPU_H:-2}"; TORCH_DEVICE=cpu
    GOLDEN_DIRS=(tests/data/golden)
else
    BACKEND="${SITTING_BACKEND:-cuda}"; B="${GPU_B:-4}"; H="${GPU_H:-16}"; TORCH_DEVICE=cuda
    GOLDEN_DIRS=(tests/data/golden tests/data/golden-extensions tests/data/golden-extensions2
        tests/data/golden-extensions3 tests/data/golden-head-sizes)
fi
MODES=("forward" "forward+backward" "forward, causal" "forward+backward, causal")

# --- the libraries the binaries load at run time ---
# libnvrtc (the NVRTC binary; cudarc also tries it for the LLVM one): the system's, else CUDA's
# folders, else PyTorch's wheels (nvidia-cuda-nvrtc: site-packages/nvidia/*/lib).
# ldconfig lives in /sbin, which a user's PATH may lack.
LDCONFIG="$(command -v ldconfig || echo /sbin/ldconfig)"
NVRTC_FOUND="$("$LDCONFIG" -p 2>/dev/null | sed -n 's/.*libnvrtc\.so[.0-9]* .*=> //p' | head -1)"
if [ -z "$NVRTC_FOUND" ]; then
    extra=""
    for dir in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/*/lib \
        $("$PYTHON" -c 'import glob, site; print(" ".join(glob.glob(site.getsitepackages()[0] + "/nvidia/*/lib")))' 2>/dev/null); do
        if ls "$dir"/libnvrtc.so* >/dev/null 2>&1; then
            extra="$extra:$dir"
            [ -z "$NVRTC_FOUND" ] && NVRTC_FOUND="$(ls "$dir"/libnvrtc.so* | head -1)"
        fi
    done
    export LD_LIBRARY_PATH="${extra#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# A Vulkan loader (wgpu and vulkan backends): the host's, else the kit's (Debian 12's).
VULKAN_LOADER="$("$LDCONFIG" -p 2>/dev/null | sed -n 's/.*libvulkan\.so\.1 .*=> //p' | head -1)"
if [ -z "$VULKAN_LOADER" ] && [ -n "$KIT" ] && [ -f "$KIT/lib/libvulkan.so.1" ]; then
    VULKAN_LOADER="$KIT/lib/libvulkan.so.1 (the kit's)"
    export LD_LIBRARY_PATH="$KIT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# NVIDIA's Vulkan ICD: where the loader looks, else the driver's own folder (named to it).
VULKAN_ICD="$(ls /usr/share/vulkan/icd.d/nvidia_icd*.json /etc/vulkan/icd.d/nvidia_icd*.json 2>/dev/null | head -1)"
if [ -z "$VULKAN_ICD" ] && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
    VULKAN_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
    export VK_DRIVER_FILES="$VULKAN_ICD"
fi

# PyTorch: on the GPU it must see CUDA; in --small, torch on the CPU if this Python has it.
if "$PYTHON" -c 'import torch, sys; sys.exit(0 if ("'"$TORCH_DEVICE"'" == "cpu" or torch.cuda.is_available()) else 1)' >/dev/null 2>&1; then
    HAVE_TORCH=1
else
    HAVE_TORCH=0
fi
HAVE_PYTHON=1
"$PYTHON" -c 'import json' >/dev/null 2>&1 || HAVE_PYTHON=0

render() { [ "$HAVE_PYTHON" = 1 ] && "${REPORT[@]}" render "$OUT" >/dev/null 2>>"$OUT/logs/report.err"; true; }
left() { echo $((DEADLINE - $(date +%s))); }
printf 'step\texit\tseconds\tlog\n' > "$OUT/steps.tsv"

# step NAME LIMIT LOG CMD...: runs CMD under `timeout` (LIMIT seconds, or what is left of the
# budget), records its exit code and time; RC holds the exit code (-1: skipped, out of time).
RC=0
step() {
    local name="$1" limit="$2" log="$3"; shift 3
    local remaining; remaining=$(left)
    if [ "$remaining" -lt "$MIN_STEP" ]; then
        printf '%s\tskipped: out of time\t0\t-\n' "$name" >> "$OUT/steps.tsv"
        echo "skip $name (out of time)" >&2
        RC=-1
        return 0
    fi
    [ "$limit" -gt "$remaining" ] && limit=$remaining
    local t0; t0=$(date +%s%N)
    echo "run  $name (at most ${limit}s, $(( $(date +%s) - START ))s in)" >&2
    timeout -k 5 "$limit" "$@" < /dev/null > "$log" 2>&1
    RC=$?
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%s\t%s\t%d.%03d\t%s\n' "$name" "$RC" $((ms / 1000)) $((ms % 1000)) "${log#"$OUT"/}" \
        >> "$OUT/steps.tsv"
    [ "$RC" -ne 0 ] && echo "     $name: exit $RC (log ${log#"$OUT"/})" >&2
    return 0
}

# --small here, with a binary that has the vulkan feature (the kit's): Burn's `vulkan` compiles
# every wgpu kernel to SPIR-V, which Debian 12's lavapipe crashes on (a segfault, measured);
# Debian sid's lavapipe runs it, with cooperative matrices, so the binaries run under it
# (.ci/lavapipe-coopmat.sh fetches it once, without installing anything). SITTING_PREFIX, when
# set, is used instead (a command and its arguments, split on spaces; empty: none).
RUN_PREFIX=()
if [ -n "${SITTING_PREFIX+x}" ]; then
    read -r -a RUN_PREFIX <<< "$SITTING_PREFIX"
elif [ "$mode" = small ] && "$SDPA" --version 2>/dev/null | grep -q '^backend vulkan' \
    && [ -x "$ROOT/.ci/lavapipe-coopmat.sh" ]; then
    if "$ROOT/.ci/lavapipe-coopmat.sh" > "$OUT/logs/lavapipe-coopmat.txt" 2>&1; then
        RUN_PREFIX=("$ROOT/.ci/lavapipe-coopmat.sh" --)
    else
        echo "sid's lavapipe could not be fetched (logs/lavapipe-coopmat.txt): the binaries run on this machine's driver" >&2
    fi
fi

# --- 1. the preflight (at most 30 s): what the host has, and which binary opens the device ---
PRE_DEADLINE=$(( $(date +%s) + 30 ))
pre() { # SECONDS CMD...: CMD under what is left of the preflight's 30 s (at most SECONDS)
    local t=$(( PRE_DEADLINE - $(date +%s) )); [ "$t" -gt "$1" ] && t=$1; shift
    [ "$t" -lt 1 ] && { echo "(skipped: the preflight's 30 s are spent)"; return 0; }
    timeout -k 1 "$t" "$@" 2>&1 || echo "(exit $?)"
}
opens() { # BINARY: the device's answer ("opened", else the reason it did not)
    local probe_dir; probe_dir="$(mktemp -d "$SCRATCH/probe.XXXXXX")"
    local said; said="$(pre 8 "${RUN_PREFIX[@]}" "$1" golden "$probe_dir" --backend "$BACKEND" | tail -3 | tr '\n' ' ')"
    case "$said" in *"no *.json case files"*) echo opened ;; *) echo "${said:-(no answer)}" ;; esac
}
# PyTorch's version, and whether its flash SDPA runs on this GPU.
TORCH_CHECK="$(cat <<'PY'
try:
    import torch, torch.nn.functional as F
except ImportError as e:
    print(f"not importable ({e})"); raise SystemExit
line = f"{torch.__version__} (CUDA {torch.version.cuda})"
if not torch.cuda.is_available():
    print(line + "; flash SDPA: no CUDA device"); raise SystemExit
from torch.nn.attention import sdpa_kernel, SDPBackend
q = torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16)
try:
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        F.scaled_dot_product_attention(q, q, q)
    torch.cuda.synchronize()
    print(line + "; flash SDPA: runs")
except Exception as e:
    print(line + "; flash SDPA: " + str(e).splitlines()[0][:200])
PY
)"
{
    echo "# preflight, $(date -u +%FT%TZ): gpu_sitting.sh $mode on --backend $BACKEND"
    echo "gpu: $(pre 5 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader | head -1)"
    echo "glibc: $(getconf GNU_LIBC_VERSION 2>/dev/null || ldd --version 2>/dev/null | head -1)"
    echo "libcuda: $("$LDCONFIG" -p 2>/dev/null | sed -n 's/.*libcuda\.so\.1 .*=> //p' | head -1 | grep . || echo 'not found (ldconfig)')"
    echo "libnvrtc: ${NVRTC_FOUND:-not found (ldconfig, /usr/local/cuda*, the site-packages of PyTorch)}"
    echo "vulkan loader: ${VULKAN_LOADER:-not found}"
    echo "vulkan icd (NVIDIA): ${VULKAN_ICD:-not found}"
    echo "torch: $(pre 14 "$PYTHON" -c "$TORCH_CHECK" | tail -1)"
    if [ -n "$KIT" ]; then
        for compiler in "${!KIT_BINARIES[@]}"; do
            echo "sdpa-$compiler on $BACKEND: $(opens "${KIT_BINARIES[$compiler]}")"
        done
    else
        echo "sdpa on $BACKEND: $(opens "$SDPA")"
    fi
    [ "${#RUN_PREFIX[@]}" -gt 0 ] && echo "run under: ${RUN_PREFIX[*]}"
    echo "preflight seconds: $(( $(date +%s) - PRE_DEADLINE + 30 ))"
} > "$OUT/preflight.txt"
# From a kit: the NVRTC binary where it opened the device, else the LLVM one; SITTING_COMPILER
# names one.
if [ -n "$KIT" ]; then
    want="${SITTING_COMPILER:-}"
    if [ -z "$want" ]; then
        # NVRTC compiles each kernel through the host's libnvrtc (opening the device compiles
        # nothing): only where libnvrtc was found and the binary opened the device.
        want=llvm
        if [ -n "$NVRTC_FOUND" ] && grep -q '^sdpa-nvrtc on .*: opened$' "$OUT/preflight.txt"; then
            want=nvrtc
        fi
        [ -n "${KIT_BINARIES[$want]:-}" ] || want=nvrtc
    fi
    [ -n "${KIT_BINARIES[$want]:-}" ] || { echo "SITTING_COMPILER=$want: no sdpa-$want in the kit" >&2; exit 2; }
    SDPA="${KIT_BINARIES[$want]}"
    echo "ran: sdpa-$want" >> "$OUT/preflight.txt"
fi
COMPILER="$("$SDPA" --version 2>/dev/null | sed -n "s/^backend $BACKEND: kernels compiled to //p")"
echo "kernels: ${COMPILER:-(not named by this binary)}" >> "$OUT/preflight.txt"
cat "$OUT/preflight.txt" >&2

# The longer record of the machine and the versions.
{
    echo "# gpu_sitting.sh $mode, $(date -u +%FT%TZ), budget ${budget}s"
    echo "## uname"; uname -a
    echo "## nvidia-smi"; timeout 20 nvidia-smi 2>&1 || echo "(no nvidia-smi)"
    echo "## nvidia-smi --query-gpu"
    timeout 20 nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit,compute_cap --format=csv 2>&1 || true
    echo "## CUDA"; (nvcc --version 2>/dev/null || echo "(no nvcc)"); ls -d /usr/local/cuda* 2>/dev/null
    echo "## Vulkan (the wgpu backend)"; ls /usr/share/vulkan/icd.d /etc/vulkan/icd.d 2>&1
    ldconfig -p 2>/dev/null | grep -E 'libvulkan\.so|libGLX_nvidia|libnvidia-vulkan' || echo "(no libvulkan in ldconfig)"
    echo "## libraries"; ldconfig -p 2>/dev/null | grep -E 'libcuda\.so|libnvrtc\.so' || echo "(none in ldconfig)"
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    echo "## sdpa"; "$SDPA" --version 2>&1; ls -l "$SDPA"; (ldd "$SDPA" 2>&1 || true)
    [ -n "$KIT" ] && { echo "## the kit's MANIFEST.txt"; cat "$KIT/MANIFEST.txt"; }
    echo "## python"; "$PYTHON" --version 2>&1
    echo "## CPU"; (lscpu 2>/dev/null | head -20) || true
    echo "## memory"; (free -g 2>/dev/null) || true
} > "$OUT/env.txt" 2>&1
rm -f "$OUT/rows.jsonl"
[ "$HAVE_PYTHON" = 1 ] && "${REPORT[@]}" meta "$OUT" "sitting=$mode" "backend=$BACKEND" "b=$B" "h=$H" \
    "budget=$budget" "started=$(date -u +%FT%TZ)" "binary=$(basename "$SDPA")" \
    "compiler=${COMPILER:-}"
render

# --- helpers ---
torch_side() { # NAME LIMIT what... [args]: the PyTorch side, rows appended to rows.jsonl
    local name="$1" limit="$2"; shift 2
    if [ "$HAVE_TORCH" != 1 ]; then
        printf '%s\tskipped: no PyTorch (%s)\t0\t-\n' "$name" "$TORCH_DEVICE" >> "$OUT/steps.tsv"
        return 0
    fi
    # The sitting's timing first: a step's own options (after it) win.
    step "$name" "$limit" "$OUT/logs/$name.log" "$PYTHON" benches/gpu_torch.py "${TORCH_TIMING[@]}" \
        --device "$TORCH_DEVICE" --b "$B" --h "$H" --out "$OUT/rows.jsonl" "$@"
    render
}

ours() { # PATH DTYPE D N LIMIT: one `sdpa bench` run of one path on one cell, four modes
    local path="$1" dtype="$2" d="$3" n="$4" limit="$5"
    local name="bench-$dtype-d$d-n$n-$path" dir="$OUT/bench/$dtype-d$d-n$n-$path"
    rm -rf "$dir"
    local modes=(); local m; for m in "${MODES[@]}"; do modes+=(--mode "$m"); done
    local reps=(--reps 5 --min-total-ms 300)
    [ "$n" -ge 16384 ] && reps=(--reps 2 --min-total-ms 0)
    [ "$mode" = small ] && reps=(--reps 2 --min-total-ms 0)
    step "$name" "$limit" "$OUT/logs/$name.log" "${RUN_PREFIX[@]}" "$SDPA" bench --backend "$BACKEND" --path "$path" \
        --dtype "$dtype" --batch "$B" --heads "$H" --d-k "$d" --n "$n" --skip-memory --plain \
        "${reps[@]}" "${modes[@]}" --out "$dir"
    [ "$RC" = -1 ] && return 0
    # One cell's plots (single points, ~400 KB a run) need not come back from the GPU machine.
    rm -f "$dir"/*.png
    if [ "$HAVE_PYTHON" = 1 ]; then
        if ls "$dir"/bench_*.json >/dev/null 2>&1; then
            "${REPORT[@]}" ingest-bench "$OUT" "$dir"
        fi
        if [ "$RC" -ne 0 ] || ! ls "$dir"/bench_*.json >/dev/null 2>&1; then
            "${REPORT[@]}" ingest-failure "$OUT" "$path" "$dtype" "$d" "$n" "$RC" \
                "$OUT/logs/$name.log" "${MODES[@]}"
        fi
    fi
    render
}

# Every case of the golden folders in one folder (outside OUT: 6 MB that need not come back),
# named FOLDER__CASE.json, so that one run per implementation covers them all.
GOLDEN_CASES="$(mktemp -d "${TMPDIR:-/tmp}/gpu-sitting-golden.XXXXXX")"
trap 'rm -rf "$GOLDEN_CASES" "$SCRATCH"' EXIT
for dir in "${GOLDEN_DIRS[@]}"; do
    for f in "$dir"/*.json; do cp "$f" "$GOLDEN_CASES/$(basename "$dir")__$(basename "$f")"; done
done
golden() { # IMPLEMENTATION LIMIT [DTYPE]: every golden case, forward and backward (DTYPE f16
    # or bf16: the inputs rounded to it, compared with f32 naive on them; `sdpa golden --dtype`)
    local implementation="$1" limit="$2" dtype="${3:-f32}" name="golden-$1" label="$1"
    [ "$dtype" != f32 ] && name="golden-$1-$dtype" && label="$1 ($dtype)"
    step "$name" "$limit" "$OUT/logs/$name.log" "${RUN_PREFIX[@]}" "$SDPA" golden "$GOLDEN_CASES" \
        --backend "$BACKEND" --implementation "$implementation" --dtype "$dtype"
    [ "$RC" = -1 ] && return 0
    [ "$HAVE_PYTHON" = 1 ] && "${REPORT[@]}" ingest-golden "$OUT" "$label" "$RC" "$OUT/logs/$name.log"
    render
}

# Our paths for a cell of DTYPE: the tensor-core kernels (cube_tensor_cores) take f16 and bf16
# only, the scalar kernel (cube_kernel), Burn's fused forward and the naive path take all.
ours_paths() {
    if [ "$1" = f32 ]; then echo "cube_kernel fused naive"; else echo "cube_tensor_cores cube_kernel fused naive"; fi
}

# The headline cell is bf16, but on wgpu (no bf16 there) f32.
HEADLINE_DTYPE=bf16
[ "$BACKEND" = wgpu ] && HEADLINE_DTYPE=f32
cells() { # the (dtype, d, n) cells of one group, most important first
    case "$1" in
        headline) echo "$HEADLINE_DTYPE 128 4096" ;;
        main) printf '%s\n' "bf16 128 4096" "bf16 64 4096" "f32 128 4096" "f32 64 4096" \
            "bf16 128 1024" "bf16 64 1024" "f32 128 1024" "f32 64 1024" |
            grep -vx "$HEADLINE_DTYPE 128 4096" ;;
        long) printf '%s\n' "bf16 128 16384" "bf16 64 16384" "f32 128 16384" "f32 64 16384" ;;
    esac
}
torch_cells() { local c a=(); while read -r dt d n; do a+=(--cell "$dt:$d:$n"); done < <(cells "$1"); echo "${a[@]}"; }

if [ "$mode" = small ]; then
    cells() {
        case "$1" in
            headline) echo "f32 16 128" ;;
            main) printf '%s\n' "bf16 16 64" "f32 32 64" ;;
            long) echo "f32 16 256" ;;
        esac
    }
    TORCH_TIMING=(--reps 2 --max-reps 2 --min-total-ms 0 --size 256)
else
    TORCH_TIMING=(--reps 10 --max-reps 50 --min-total-ms 200 --size 8192)
fi

# --- 2. PyTorch: versions, the bf16 matmul ceiling and the headline cell ---
# shellcheck disable=SC2046
torch_side torch-headline 120 env matmul sdpa $(torch_cells headline)

# --- 3. our kernel's correctness on this GPU, then the headline cell on every path of ours ---
if [ "$mode" != headline ]; then golden cube_kernel 120; golden cube_tensor_cores 120 bf16; fi
while read -r dt d n; do
    for path in $(ours_paths "$dt"); do ours "$path" "$dt" "$d" "$n" 90; done
done < <(cells headline)
if [ "$mode" = headline ]; then
    golden cube_tensor_cores 120 bf16
    echo "sitting ($mode) done in $(( $(date +%s) - START ))s: $OUT/BENCH_gpu.md" >&2
    exit 0
fi

# --- 4. the other cells at n = 4096 and 1024: PyTorch in one process, then ours ---
# shellcheck disable=SC2046
torch_side torch-main 150 sdpa $(torch_cells main)
while read -r dt d n; do
    for path in $(ours_paths "$dt"); do ours "$path" "$dt" "$d" "$n" 90; done
done < <(cells main)

# --- 5. the golden cases through the other implementations (auto, and two for reference), and
# the tensor-core forward in f16 ---
for implementation in auto naive fused; do golden "$implementation" 120; done
golden cube_tensor_cores 120 f16

# --- 6. the model's training steps/s against its twin on the GPU: seq_len 512 and 2048 ---
# (--small: the small model, seq_len 16, two steps.)
train_sizes=(large xlarge)
[ "$mode" = small ] && train_sizes=(small)
for size in "${train_sizes[@]}"; do
    size_args=(--size "$size")
    [ "$mode" = small ] && size_args+=(--steps 2 --warmup 1)
    dir="$OUT/train"; mkdir -p "$dir"
    rm -f "$dir/train_${BACKEND}_$size.json" "$dir/train_pytorch_$size.json"
    step "train-sdpa-$size" 90 "$OUT/logs/train-sdpa-$size.log" "${RUN_PREFIX[@]}" "$SDPA" train-bench \
        --backend "$BACKEND" "${size_args[@]}" --rounds 2 --overwrite --out "$dir"
    if [ "$RC" != -1 ] && [ "$HAVE_PYTHON" = 1 ]; then
        file="$dir/train_${BACKEND}_$size.json"
        [ -f "$file" ] || file="$OUT/logs/train-sdpa-$size.log"
        "${REPORT[@]}" ingest-train "$OUT" sdpa "$RC" "$file" "$size" f32
    fi
    if [ "$HAVE_TORCH" = 1 ]; then
        step "train-pytorch-$size" 90 "$OUT/logs/train-pytorch-$size.log" "$PYTHON" \
            benches/pytorch_model.py "${size_args[@]}" --rounds 2 --device "$TORCH_DEVICE" --out "$dir"
        if [ "$RC" != -1 ] && [ "$HAVE_PYTHON" = 1 ]; then
            file="$dir/train_pytorch_$size.json"
            [ -f "$file" ] || file="$OUT/logs/train-pytorch-$size.log"
            "${REPORT[@]}" ingest-train "$OUT" pytorch "$RC" "$file" "$size" f32
        fi
    else
        printf '%s\tskipped: no PyTorch (%s)\t0\t-\n' "train-pytorch-$size" "$TORCH_DEVICE" >> "$OUT/steps.tsv"
    fi
    render
done

# --- 7. the long sequences, n = m = 16384 (the naive paths' n×n scores may not fit: recorded) ---
# shellcheck disable=SC2046
torch_side torch-long 120 sdpa --reps 3 --min-total-ms 0 $(torch_cells long)
while read -r dt d n; do
    for path in $(ours_paths "$dt"); do ours "$path" "$dt" "$d" "$n" 150; done
done < <(cells long)

render
echo "sitting ($mode) done in $(( $(date +%s) - START ))s: $OUT/BENCH_gpu.md" >&2
exit 0
