/* The glibc 2.38 names that Debian sid's LLVM 23 static libraries call, for a link against an
 * older glibc (Debian 12 has 2.36).
 *
 * glibc 2.38's headers redirect strtol & co. and the scanf family to __isoc23_* versions (C23:
 * they also read a "0b" binary prefix where the base is 0 or 2). sid's LLVM was compiled
 * against those headers, so its archives name the new symbols, which Debian 12's libc lacks.
 * LLVM parses decimal and hexadecimal numbers with them (options, target features, data
 * layouts), never binary prefixes, so forwarding each to its classic function is exact for
 * every input LLVM gives them.
 *
 * .ci/llvm-for-cuda.sh compiles this file into libsdpa_isoc23_compat.a beside sid's LLVM
 * libraries, and the llvm-config it lays out names that archive last in `--libs`: only a build
 * that links this LLVM (the `cuda` feature) gets it. Since the archive comes before the C
 * library on the link line, these definitions are taken on any build host, so the binary needs
 * no GLIBC_2.38 symbol whatever glibc it was linked on.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

long __isoc23_strtol(const char *nptr, char **endptr, int base) {
    return strtol(nptr, endptr, base);
}

long long __isoc23_strtoll(const char *nptr, char **endptr, int base) {
    return strtoll(nptr, endptr, base);
}

unsigned long __isoc23_strtoul(const char *nptr, char **endptr, int base) {
    return strtoul(nptr, endptr, base);
}

unsigned long long __isoc23_strtoull(const char *nptr, char **endptr, int base) {
    return strtoull(nptr, endptr, base);
}

int __isoc23_sscanf(const char *str, const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vsscanf(str, format, args);
    va_end(args);
    return n;
}

int __isoc23_scanf(const char *format, ...) {
    va_list args;
    va_start(args, format);
    int n = vscanf(format, args);
    va_end(args);
    return n;
}
