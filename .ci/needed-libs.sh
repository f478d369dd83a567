#!/usr/bin/env bash
# Checks that a linked `sdpa` asks the dynamic loader only for libraries every Linux GPU host
# has: glibc's (libc, libm, libdl, librt, libpthread, the loader), libgcc_s, libstdc++, libz
# and libzstd. The CUDA driver (libcuda.so.1), NVRTC and the Vulkan loader are not NEEDED:
# they are opened at run time, when their backend opens. Prints the NEEDED list and the newest
# glibc symbol version the binary asks for; exits 1 naming any other library.
#
#   .ci/needed-libs.sh BINARY
set -euo pipefail
binary="${1:?usage: $0 BINARY}"
allowed='^(libc|libm|libdl|librt|libpthread|ld-linux-x86-64|libgcc_s|libstdc\+\+|libz|libzstd)\.so'
needed="$(readelf -d "$binary" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')"
echo "NEEDED: $needed"
echo "newest glibc symbol: $(objdump -T "$binary" | grep -o 'GLIBC_[0-9.]*' | sort -t. -k2,2n -k3,3n -u | tail -1)"
status=0
for lib in $needed; do
    if ! [[ "$lib" =~ $allowed ]]; then
        echo "$binary needs $lib, which a GPU host is not known to have" >&2
        status=1
    fi
done
exit $status
