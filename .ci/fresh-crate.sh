#!/usr/bin/env bash
# burn-sdpa as a Burn user's own project meets it, outside this workspace and its Cargo.lock:
#
# 1. `cargo package` makes the .crate that crates.io would serve (no verify build: the builds
#    below are that build, under a user's resolution instead of this workspace's lockfile).
# 2. A new crate depends on `burn = "=0.22.1"` (flex) and on the unpacked burn-sdpa with its
#    `flex` feature. Its lockfile is resolved fresh, as `cargo build` in a new project resolves
#    it: the newest versions the manifests allow, whatever this repository's Cargo.lock holds.
#    The versions that differ from the workspace's are printed.
# 3. Every Rust example of the README runs as a program of that crate (each block inside
#    `fn main`), and the first must say that it took the CPU kernel (`path: cpu_kernel`).
# 4. burn-sdpa's own unit tests run in the unpacked crate, under a lockfile resolved the same
#    way, with `flex` (sharing step 3's build).
# 5. `cube` compiled: the user's crate again with burn-sdpa's `cube` beside Burn's `wgpu` (`cube`
#    needs one of Burn's CubeCL backends: without one Burn 0.22.1's burn-backend does not
#    compile), resolved fresh and type-checked (`cargo check`, no code generation: a release
#    build of the wgpu stack took 21 min of CI's 90 here; the workspace's tests build and run it).
#
# Any failure fails the script. Steps 3 and 4 share one target folder (FRESH_TARGET, default
# $CARGO_TARGET_DIR/fresh), release profile. Usage: .ci/fresh-crate.sh (from anywhere).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${CARGO_TARGET_DIR:-$HOME/.cache/sdpa-target}"
work="${FRESH_DIR:-$target/fresh-crate}"
export CARGO_TARGET_DIR="${FRESH_TARGET:-$target/fresh}"
rm -rf "$work" && mkdir -p "$work"

# 1. The package.
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -1)
(cd "$root" && CARGO_TARGET_DIR="$target" cargo package --locked --allow-dirty --no-verify \
    -p burn-sdpa)
tar xzf "$target/package/burn-sdpa-$version.crate" -C "$work"
crate="$work/burn-sdpa-$version"

# 2. The user's crate, resolved fresh.
mkdir -p "$work/user/src/bin"
cat > "$work/user/Cargo.toml" <<EOF
[package]
name = "user"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
burn = { version = "=0.22.1", features = ["flex"] }
burn-sdpa = { path = "$crate", features = ["flex"] }
EOF
echo 'fn main() {}' > "$work/user/src/main.rs"
(cd "$work/user" && cargo generate-lockfile)
echo "versions that differ from the workspace's Cargo.lock:"
lock_versions() { awk '/^name = /{n=$3} /^version = /{print n, $3}' "$1" | tr -d '"' | sort -u; }
comm -13 <(lock_versions "$root/Cargo.lock") <(lock_versions "$work/user/Cargo.lock") \
    | sed 's/^/  /' || true

# 3. The README's examples, each a program.
awk -v dir="$work/user/src/bin" '
    /^```rust/ { n++; file = sprintf("%s/readme_%d.rs", dir, n); print "fn main() {" > file; inside = 1; next }
    /^```/ && inside { print "}" >> file; close(file); inside = 0; next }
    inside { print >> file }
' "$root/README.md"
examples=$(ls "$work/user/src/bin" | sed 's/\.rs$//' | sort -V)
[ -n "$examples" ] || { echo "no Rust example found in README.md"; exit 1; }
(cd "$work/user" && cargo build --release --bins)
for example in $examples; do
    echo "--- README example $example"
    "$CARGO_TARGET_DIR/release/$example" | tee "$work/$example.txt"
done
grep -q '^path: cpu_kernel' "$work/readme_1.txt" \
    || { echo "the README's first example did not take the CPU kernel"; exit 1; }

# 4. burn-sdpa's own unit tests under a fresh resolution.
(cd "$crate" && cargo generate-lockfile && cargo test --release --lib --features flex)

# 5. `cube` beside Burn's wgpu, type-checked under a fresh resolution.
mkdir -p "$work/user-cube/src"
cat > "$work/user-cube/Cargo.toml" <<EOF
[package]
name = "user-cube"
version = "0.1.0"
edition = "2024"
publish = false

[dependencies]
burn = { version = "=0.22.1", features = ["flex", "wgpu"] }
burn-sdpa = { path = "$crate", features = ["flex", "cube"] }
EOF
cp "$work/user/src/bin/readme_1.rs" "$work/user-cube/src/main.rs"
(cd "$work/user-cube" && cargo generate-lockfile && cargo check --release)
echo "fresh crate: README examples ran, burn-sdpa's unit tests passed, cube type-checked"
