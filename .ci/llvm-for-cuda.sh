#!/usr/bin/env bash
# The LLVM 23.1 that Burn's CUDA backend links, from Debian sid, for `--features cuda`.
#
# cubecl-cuda 0.11.3 always links cubecl-llvm (kernels lowered to PTX through LLVM's NVPTX
# back end), whose build dependency tracel-llvm-bundler 23.1.0-4 downloads an LLVM 23.1 bundle
# from GitHub, which these machines and CI cannot reach. The bundler skips that download when
# its folder, $XDG_DATA_HOME/tracel/tracel-llvm-23.1.0-4 (default ~/.local/share/...), holds
# the file .tracel-llvm-installed; it then runs that folder's bin/llvm-config --link-static for
# the libraries, the system libraries, the headers and the C++ flags. This script fills that
# folder from Debian sid's own LLVM 23.1 packages, without root and without installing anything:
#
#   1. downloads llvm-23-dev, llvm-23 and libllvm23 (1:23.1.x) with a private sources list into
#      a cache outside the clone ($SDPA_LLVM_DIR, default ~/.cache/sdpa-llvm23; ~390 MB
#      unpacked), and unpacks them there with dpkg-deb;
#   2. checks that they are LLVM 23.1.x (the bundler's ABI: another minor version refuses);
#   3. compiles .ci/isoc23-compat.c (the five glibc 2.38 names sid's archives call, forwarded to
#      the classic functions, for a link on Debian 12's glibc 2.36) into an archive beside
#      LLVM's, and links libz.so / libzstd.so there to the system's runtime libraries (Debian 12
#      has no libzstd-dev);
#   4. writes the bundler's folder: bin/llvm-config, a wrapper of sid's that (a) leaves out
#      Polly, which sid ships in another package and nothing here calls, (b) appends the glibc
#      archive after LLVM's libraries, and (c) leaves out the system libraries that nothing
#      linked here uses and a GPU host may lack (libz3, libxml2); then the sentinel.
#
# Idempotent: a second run checks what is there and changes nothing. Nothing in the default
# build (flex, ndarray, wgpu) needs it. Then:
#
#   .ci/llvm-for-cuda.sh && cargo build --release --features cuda
#
# When sid no longer serves 23.1.x (or Debian's packages cannot be reached), the script stops
# with exit code 3 and says so. Keep the .deb files of a run that worked (DIR/debs) and point
# SDPA_LLVM_DEBS at a folder holding them: the script then downloads nothing. (Or put tracel's
# own bundle where the bundler looks, from a machine that reaches GitHub: benches/gpu_sitting.sh's
# header says how.) Any other failure exits 1.
#
# Options: --print-dir prints the bundler's folder and exits (0 if it is ready, 1 if not).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DIR="${SDPA_LLVM_DIR:-$HOME/.cache/sdpa-llvm23}"
ROOT="$DIR/root"
LLVM="$ROOT/usr/lib/llvm-23"
# What tracel-llvm-bundler 23.1.0-4 reads (its config.rs: dirs::data_local_dir()).
BUNDLE="${XDG_DATA_HOME:-$HOME/.local/share}/tracel/tracel-llvm-23.1.0-4"
SENTINEL="$BUNDLE/.tracel-llvm-installed"
MARK="$BUNDLE/.sdpa-llvm-from-debian-sid"
PACKAGES=(llvm-23-dev llvm-23 libllvm23)
WANT_MINOR="23.1."
SOURCE="${SDPA_LLVM_SOURCE:-deb http://deb.debian.org/debian sid main}"

say() { printf 'llvm-for-cuda: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }
unavailable() { say "$*"; exit 3; } # the packages cannot be had (not this machine's fault)
# ldconfig lives in /sbin, which a user's PATH may lack.
LDCONFIG="$(command -v ldconfig || echo /sbin/ldconfig)"

ready() {
    [ -f "$SENTINEL" ] && [ -x "$BUNDLE/bin/llvm-config" ] &&
        case "$("$BUNDLE/bin/llvm-config" --version 2>/dev/null)" in "$WANT_MINOR"*) true ;; *) false ;; esac
}

if [ "${1:-}" = "--print-dir" ]; then
    echo "$BUNDLE"
    ready
    exit
fi

# A bundle the bundler downloaded itself (a machine that reaches GitHub) is left as it is.
if [ -f "$SENTINEL" ] && [ ! -f "$MARK" ]; then
    say "$BUNDLE holds tracel's own LLVM bundle: left as it is"
    echo "$BUNDLE"
    exit 0
fi
if [ -f "$MARK" ] && ready && [ -f "$LLVM/lib/libsdpa_isoc23_compat.a" ]; then
    say "ready: $("$BUNDLE/bin/llvm-config" --version) from $(cat "$MARK") in $BUNDLE"
    echo "$BUNDLE"
    exit 0
fi

command -v dpkg-deb >/dev/null || fail "dpkg-deb not found: this script needs a Debian-like system"
command -v cc >/dev/null || fail "cc not found: install gcc (Debian: apt-get install gcc)"

# --- 1. sid's packages, into DIR (or from SDPA_LLVM_DEBS) ---
debs="$DIR/debs"
if [ -n "${SDPA_LLVM_DEBS:-}" ]; then
    debs="$SDPA_LLVM_DEBS"
    say "using the .deb files in $debs (SDPA_LLVM_DEBS): nothing downloaded"
else
    command -v apt-get >/dev/null || fail "apt-get not found: set SDPA_LLVM_DEBS to a folder with ${PACKAGES[*]} (.deb)"
    mkdir -p "$debs" "$DIR/lists/partial"
    echo "$SOURCE" > "$DIR/sources.list"
    apt=(-o "Dir::Etc::sourcelist=$DIR/sources.list" -o "Dir::Etc::sourceparts=-"
        -o "Dir::State::Lists=$DIR/lists" -o "Debug::NoLocking=1")
    say "reading the package list of: $SOURCE"
    apt-get "${apt[@]}" update -qq 2> >(grep -v unsandboxed >&2) ||
        unavailable "apt-get update failed for '$SOURCE' (no network to Debian's packages?)"
    for package in "${PACKAGES[@]}"; do
        version="$(apt-cache "${apt[@]}" policy "$package" 2>/dev/null | sed -n 's/^ *Candidate: //p')"
        case "$version" in
            1:"$WANT_MINOR"*) ;;
            *)
                unavailable "'$SOURCE' serves $package '${version:-(not at all)}', not 1:${WANT_MINOR}x, the
LLVM that tracel-llvm-bundler 23.1.0-4 (cubecl-cuda 0.11.3, Burn 0.22.1) links. What to do:
  - point SDPA_LLVM_DEBS at a folder with the ${PACKAGES[*]} 1:${WANT_MINOR}x .deb files
    (kept in $debs by an earlier run of this script, or from Debian's snapshot archive), or
  - put tracel's own bundle where the bundler looks (benches/gpu_sitting.sh's header), or
  - move to a Burn whose cubecl-cuda links the LLVM that sid serves now." ;;
        esac
    done
    # Into a fresh folder, swapped in once every package came: a failed download keeps the
    # .deb files of the last run that worked.
    rm -rf "$debs.partial" && mkdir -p "$debs.partial"
    (cd "$debs.partial" && apt-get "${apt[@]}" download -qq "${PACKAGES[@]}" 2>&1 | grep -v unsandboxed || true)
    for package in "${PACKAGES[@]}"; do
        ls "$debs.partial/${package}_"*.deb >/dev/null 2>&1 ||
            unavailable "the download of $package from '$SOURCE' failed"
    done
    rm -rf "$debs" && mv "$debs.partial" "$debs"
fi
# One .deb per package: the newest 23.1.x there (a folder may keep several).
declare -A DEB=()
for package in "${PACKAGES[@]}"; do
    DEB[$package]="$(ls "$debs/${package}_"*"23.1."*.deb 2>/dev/null | sort -V | tail -1 || true)"
    [ -n "${DEB[$package]}" ] || unavailable "no ${package}_*23.1.*.deb in $debs"
done

# --- 2. unpacked into DIR/root (a fresh folder, moved into place once complete) ---
fresh="$DIR/root.partial"
rm -rf "$fresh"
mkdir -p "$fresh"
for package in "${PACKAGES[@]}"; do dpkg-deb -x "${DEB[$package]}" "$fresh"; done
version="$("$fresh/usr/lib/llvm-23/bin/llvm-config" --version)" ||
    fail "sid's llvm-config does not run here"
case "$version" in
    "$WANT_MINOR"*) ;;
    *) fail "the packages hold LLVM $version, not ${WANT_MINOR}x (tracel-llvm-bundler 23.1.0-4's ABI)" ;;
esac
lib="$fresh/usr/lib/llvm-23/lib"

# --- 3. the glibc 2.38 names, and the compression libraries by their runtime names ---
cc -O2 -fPIC -c "$HERE/isoc23-compat.c" -o "$lib/isoc23-compat.o"
ar rcs "$lib/libsdpa_isoc23_compat.a" "$lib/isoc23-compat.o"
rm "$lib/isoc23-compat.o"
for name in libz libzstd; do
    runtime="$("$LDCONFIG" -p | sed -n "s/.*$name\.so\.1 (libc6,x86-64) => //p" | head -1)"
    [ -n "$runtime" ] || fail "$name.so.1 not found (ldconfig -p): install Debian's ${name#lib}1 package"
    ln -sf "$runtime" "$lib/$name.so"
done

rm -rf "$ROOT"
mv "$fresh" "$ROOT"

# --- 4. the bundler's folder ---
rm -rf "$BUNDLE"
mkdir -p "$BUNDLE/bin"
cat > "$BUNDLE/bin/llvm-config" <<EOF
#!/usr/bin/env bash
# Written by .ci/llvm-for-cuda.sh: Debian sid's llvm-config ($version) as tracel-llvm-bundler
# calls it, with Polly left out (not unpacked, never called), the glibc 2.38 names appended to
# the libraries, and only the system libraries that a GPU host has (no libz3, no libxml2).
set -euo pipefail
out="\$("$LLVM/bin/llvm-config" "\$@")"
for arg in "\$@"; do
    case "\$arg" in
        --libs|--libnames|--libfiles)
            out="\$(tr ' ' '\n' <<< "\$out" | grep -v -i polly | tr '\n' ' ')"
            [ "\$arg" = --libs ] && out="\$out -lsdpa_isoc23_compat" ;;
        --system-libs)
            out="\$(tr ' ' '\n' <<< "\$out" | grep -v -E 'z3|xml2' | tr '\n' ' ')" ;;
    esac
done
echo "\$out"
EOF
chmod +x "$BUNDLE/bin/llvm-config"
# The headers and libraries are reached through llvm-config's own answers (DIR/root); these
# links are for a person looking at the folder.
ln -s "$LLVM/include" "$BUNDLE/include"
ln -s "$LLVM/lib" "$BUNDLE/lib"
for package in "${PACKAGES[@]}"; do basename "${DEB[$package]}"; done > "$DIR/versions.txt"
echo "Debian sid's LLVM $version (.ci/llvm-for-cuda.sh, $(date -u +%F))" > "$MARK"
touch "$SENTINEL"
ready || fail "$BUNDLE/bin/llvm-config does not answer ${WANT_MINOR}x"
say "ready: LLVM $version in $BUNDLE (packages: $(tr '\n' ' ' < "$DIR/versions.txt"))"
echo "$BUNDLE"
