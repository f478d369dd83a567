#!/usr/bin/env bash
# The GPU kit: the `sdpa` binaries a lent GPU machine runs (it has CUDA, Python and PyTorch, no
# Rust and no registry), built here, stripped, and packed with what they load that a GPU host
# may lack, into one file that benches/gpu_sitting.sh takes in place of a binary:
#
#   benches/gpu_kit.sh [--llvm-only]        # → .gpu/kit.tar.xz, .gpu/kit-llvm.tar.xz, .gpu/kit-nvrtc.tar.xz
#   benches/gpu_sitting.sh --small .gpu/kit.tar.xz OUT   # here, on lavapipe, end to end
#   benches/gpu_sitting.sh --headline .gpu/kit.tar.xz "$OUT"   # there
#
# The kit holds:
#   sdpa-llvm   --features "cuda vulkan": CUDA kernels compiled to PTX by LLVM 23.1 (linked in)
#   sdpa-nvrtc  --features "cuda-nvrtc vulkan": CUDA kernels compiled to CUDA C++ by NVRTC,
#               which it loads from the host at run time (PyTorch's wheels ship libnvrtc)
#   lib/libvulkan.so.1   Debian 12's Vulkan loader, for a host without one (the `vulkan`
#               and `wgpu` backends load it; NVIDIA's driver brings its own ICD, not the loader)
#   MANIFEST.txt         the commit, the features, each binary's `--version`, its NEEDED
#               libraries and the newest glibc symbol version it asks for
#
# Both binaries link Debian sid's LLVM (.ci/llvm-for-cuda.sh, run first): cubecl-cuda 0.11.3
# links it whichever compiler is the default. Each needs at run time only glibc, libstdc++,
# libgcc_s, libm, libz and libzstd (.ci/needed-libs.sh: another NEEDED library fails the kit), plus
# the CUDA driver (libcuda.so.1), loaded when the cuda backend opens. They are two builds of
# Burn (the compiler is chosen by cubecl-cuda's `cpp` feature at build time; cubecl has no run-
# time switch), about 20 minutes each on 2 cores from a warm dependency cache.
#
# The files are xz with a 256 MiB window, so that in kit.tar.xz the second binary, most of whose
# bytes are the first's, costs little (decompressing needs ~260 MB of memory). kit.tar.xz holds
# both (under 64 MiB); kit-llvm.tar.xz and kit-nvrtc.tar.xz one each, for the device tool, which
# carries the working tree (~25 MB) and what `carry` names within 64 MiB: name one of them
# (e.g. `.gpu/kit-nvrtc.tar.xz`). /.gpu/ is ignored by git.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$(pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
KIT="$ROOT/.gpu/kit"
PACKED="$ROOT/.gpu/kit.tar.xz"

builds=("llvm:cuda vulkan" "nvrtc:cuda-nvrtc vulkan")
[ "${1:-}" = "--llvm-only" ] && builds=("llvm:cuda vulkan")

.ci/llvm-for-cuda.sh >/dev/null
rm -rf "$KIT" "$ROOT/.gpu/kit"*.tar.xz "$ROOT/.gpu/stage-"*
mkdir -p "$KIT/lib"

{
    echo "# GPU kit, $(date -u +%FT%TZ), commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo ' (with uncommitted changes)')"
    echo "# built on: $(. /etc/os-release && echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    echo "# LLVM: $(cat "$(.ci/llvm-for-cuda.sh --print-dir)/.sdpa-llvm-from-debian-sid" 2>/dev/null || echo "tracel's own bundle")"
} > "$KIT/MANIFEST.txt"
for build in "${builds[@]}"; do
    name="${build%%:*}"; features="${build#*:}"
    echo "== sdpa-$name: cargo build --release --locked --features \"$features\" --bin sdpa" >&2
    start=$(date +%s)
    cargo build --release --locked --features "$features" --bin sdpa
    strip -o "$KIT/sdpa-$name" "$CARGO_TARGET_DIR/release/sdpa"
    libs="$(.ci/needed-libs.sh "$KIT/sdpa-$name")" || exit 1
    {
        echo
        echo "## sdpa-$name: --features \"$features\" ($(( $(date +%s) - start )) s to build here)"
        "$KIT/sdpa-$name" --version
        echo "size: $(stat -c %s "$KIT/sdpa-$name") bytes stripped"
        echo "$libs"
    } >> "$KIT/MANIFEST.txt"
done

# The Vulkan loader (Debian's libvulkan1: .ci/run installs it).
loader="$(ldconfig -p | sed -n 's/.*libvulkan\.so\.1 (libc6,x86-64) => //p' | head -1)"
[ -n "$loader" ] || { echo "no libvulkan.so.1 here: apt-get install libvulkan1" >&2; exit 1; }
cp -L "$loader" "$KIT/lib/libvulkan.so.1"
echo "lib/libvulkan.so.1: $loader (Debian's libvulkan1 $(dpkg-query -W -f '${Version}' libvulkan1 2>/dev/null || echo '?'))" >> "$KIT/MANIFEST.txt"

# pack NAME FILES...: the kit folder's FILES (MANIFEST.txt and lib/ always) into .gpu/NAME.
pack() {
    local name="$1"; shift
    local stage="$ROOT/.gpu/stage-$name"
    rm -rf "$stage" && mkdir -p "$stage/kit"
    cp -a "$KIT/MANIFEST.txt" "$KIT/lib" "$stage/kit/"
    local f; for f in "$@"; do cp -a "$KIT/$f" "$stage/kit/"; done
    tar -C "$stage" -cf - kit | xz -9 --lzma2=preset=9,dict=256MiB -T1 > "$ROOT/.gpu/$name"
    rm -rf "$stage"
    echo "$ROOT/.gpu/$name: $(stat -c %s "$ROOT/.gpu/$name") bytes"
}
# Both binaries in one file (the second costs little), and each alone: the device tool carries
# the working tree and what it names within 64 MiB, and the tree holds ~25 MB, so one call
# carries one compiler's kit (`.gpu/kit-llvm.tar.xz` or `.gpu/kit-nvrtc.tar.xz`).
binaries=(); for build in "${builds[@]}"; do binaries+=("sdpa-${build%%:*}"); done
packed=("$(pack kit.tar.xz "${binaries[@]}")")
if [ "${#binaries[@]}" -gt 1 ]; then
    for binary in "${binaries[@]}"; do packed+=("$(pack "kit-${binary#sdpa-}.tar.xz" "$binary")"); done
fi
printf '%s\n' "${packed[@]}" | tee -a "$KIT/MANIFEST.txt"
cp "$KIT/MANIFEST.txt" "$ROOT/.gpu/MANIFEST.txt"
rm -rf "$KIT"
limit=$((64 * 1024 * 1024))
size=$(stat -c %s "$PACKED")
if [ "$size" -gt "$limit" ]; then
    echo "the kit is $size bytes, over 64 MiB" >&2
    exit 1
fi
# What travels with a device call beside the kit: tracked and untracked files git does not ignore.
tree=$(git ls-files -co --exclude-standard -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s}' || true)
for file in "${packed[@]}"; do
    bytes=$(stat -c %s "${file%%:*}")
    echo "${file%%:*}: $((bytes / 1048576)) MiB + the working tree $((tree / 1048576)) MiB = $(((bytes + tree) / 1048576)) MiB of the device tool's 64" >&2
done
echo "$PACKED"
