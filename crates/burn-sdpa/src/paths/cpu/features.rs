//! The SIMD features of this CPU, detected at run time: what the benches and reports name, and
//! the instruction set the softmax loops of [`super::simd`] run with.

/// The SIMD features of this CPU that matter to the CPU kernel and to the matrix products it
/// calls, detected at run time (x86-64; empty elsewhere), in `lscpu`'s spelling.
pub fn cpu_features() -> Vec<&'static str> {
    #[allow(unused_mut)]
    let mut found = Vec::new();
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! probe {
            ($($feature:tt => $name:literal),* $(,)?) => {
                $(if std::arch::is_x86_feature_detected!($feature) {
                    found.push($name);
                })*
            };
        }
        probe!(
            "avx2" => "avx2",
            "fma" => "fma",
            "f16c" => "f16c",
            "avx512f" => "avx512f",
            "avx512bw" => "avx512bw",
            "avx512vl" => "avx512vl",
            "avx512bf16" => "avx512_bf16",
            "avx512fp16" => "avx512_fp16",
        );
        // AMX detection is not stable in `is_x86_feature_detected!`: CPUID leaf 7, EDX bits 24
        // (AMX-TILE) and 22 (AMX-BF16), as the CPU reports them (reporting only: nothing here
        // runs AMX instructions).
        // Leaf 7 exists when the maximum basic leaf (leaf 0's EAX) is at least 7.
        let edx = if std::arch::x86_64::__cpuid(0).eax >= 7 {
            std::arch::x86_64::__cpuid_count(7, 0).edx
        } else {
            0
        };
        if edx & (1 << 24) != 0 {
            found.push("amx_tile");
        }
        if edx & (1 << 22) != 0 {
            found.push("amx_bf16");
        }
    }
    found
}

/// The instruction set the softmax loops run with on this CPU: `avx512`, `avx2` or `portable`.
pub fn softmax_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if std::arch::is_x86_feature_detected!("avx512f") {
            return "avx512";
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return "avx2";
        }
    }
    "portable"
}
