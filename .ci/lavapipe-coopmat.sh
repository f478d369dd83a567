#!/usr/bin/env bash
# A Vulkan driver on the CPU that exposes cooperative matrices (VK_KHR_cooperative_matrix), the
# matrix instructions CubeCL's `cmma` compiles to through Burn's `vulkan` feature (SPIR-V).
#
# Debian 12's lavapipe (Mesa 22.3) has none, nor has bookworm-backports' (Mesa 25.0.7, checked
# with vulkaninfo on 2026-12-06); Debian sid's (Mesa 26.2.6, LLVM 22) reports
# VK_KHR_cooperative_matrix revision 2 and cooperativeMatrix = true. Sid's Mesa needs glibc 2.43,
# so this script does not install it: it downloads sid's packages (no root needed, no change to
# the system) into DIR, and runs a command under sid's own dynamic loader with sid's libraries
# and that driver, so that the system's Mesa and glibc stay as they are. A Rust binary built on
# Debian 12 runs unchanged on the newer glibc.
#
#   .ci/lavapipe-coopmat.sh                  # fetch (once) and print what vulkaninfo reports
#   .ci/lavapipe-coopmat.sh -- CMD [ARGS..]  # run CMD with that driver
#
# DIR is $LAVAPIPE_COOPMAT_DIR (default ~/.cache/lavapipe-coopmat). Sid moves: the versions
# fetched are written to DIR/versions.txt.
set -euo pipefail

DIR="${LAVAPIPE_COOPMAT_DIR:-$HOME/.cache/lavapipe-coopmat}"
ROOT="$DIR/root"
LIBS="$ROOT/usr/lib/x86_64-linux-gnu"
ICD="$ROOT/usr/share/vulkan/icd.d/lvp_icd.json"

# mesa-vulkan-drivers (26.2.6-1 on 2026-12-06) and the libraries its lavapipe and vulkaninfo
# load, as sid's packages name them.
PACKAGES=(mesa-vulkan-drivers libvulkan1 vulkan-tools libc6 libgcc-s1 libstdc++6 libllvm22
    libzstd1 libelf1t64 libdrm2 libdrm-amdgpu1 libexpat1 zlib1g libx11-xcb1 libx11-6 libxcb1
    libxcb-dri3-0 libxcb-present0 libxcb-randr0 libxcb-shm0 libxcb-sync1 libxcb-xfixes0
    libxshmfence1 libxau6 libxdmcp6 libbsd0 libmd0 libwayland-client0 libdisplay-info3
    libpng16-16t64 libffi8 libedit2 libxml2-16 libicu78 libtinfo6 libbz2-1.0 liblzma5)

fetch() {
    [ -f "$ICD" ] && return 0
    mkdir -p "$DIR/debs" "$DIR/lists/partial"
    echo "deb http://deb.debian.org/debian sid main" > "$DIR/sources.list"
    local apt=(-o "Dir::Etc::sourcelist=$DIR/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$DIR/lists" -o "Debug::NoLocking=1")
    apt-get "${apt[@]}" update -qq
    (cd "$DIR/debs" && apt-get "${apt[@]}" download -qq "${PACKAGES[@]}" 2>&1 | grep -v unsandboxed || true)
    for deb in "$DIR"/debs/*.deb; do dpkg-deb -x "$deb" "$ROOT"; done
    (cd "$DIR/debs" && ls *.deb) > "$DIR/versions.txt"
    # The manifest names the driver by file name; point it at the unpacked library.
    sed -i "s#\"library_path\": \"[^\"]*\"#\"library_path\": \"$LIBS/libvulkan_lvp.so\"#" "$ICD"
}

run() {
    export VK_ICD_FILENAMES="$ICD"
    # For a test binary that runs itself again (tests/library/common.rs: in_child).
    export LAVAPIPE_COOPMAT_LIBS="$LIBS"
    export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp/xdg-runtime-$(id -u)}"
    mkdir -p "$XDG_RUNTIME_DIR" && chmod 700 "$XDG_RUNTIME_DIR"
    exec "$ROOT/usr/lib64/ld-linux-x86-64.so.2" --library-path "$LIBS" "$@"
}

fetch
if [ "${1:-}" = "--" ]; then
    shift
    [ $# -gt 0 ] || { echo "usage: $0 [-- CMD ARGS..]" >&2; exit 2; }
    run "$@"
fi
( run "$ROOT/usr/bin/vulkaninfo" 2>/dev/null ) \
    | grep -E "deviceName|driverInfo|VK_KHR_cooperative_matrix|cooperativeMatrix " | sort -u
