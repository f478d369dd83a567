//! Agreement with Burn's built-in `burn::tensor::module::attention` where the semantics
//! coincide: default or explicit scale, boolean mask, bottom-right causal, bias without mask.

use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use sdpa::{AttentionInput, CausalAlignment, ScalePolicy, ScaledDotProductAttentionConfig};

use crate::common::{bool4, devices, lcg_values, max_abs_diff, tensor4, values};

#[test]
fn agrees_with_burn_builtin_attention() {
    let (b, h, n, m, d) = (2, 3, 5, 7, 8);
    for (backend, device) in devices() {
        let q = || tensor4(&lcg_values(11, b * h * n * d), [b, h, n, d], &device);
        let k = || tensor4(&lcg_values(12, b * h * m * d), [b, h, m, d], &device);
        let v = || tensor4(&lcg_values(13, b * h * m * d), [b, h, m, d], &device);
        let mask_data: Vec<bool> = lcg_values(14, b * n * m).iter().map(|x| *x > 0.8).collect();
        let mask = || bool4(&mask_data, [b, 1, n, m], &device).expand([b, h, n, m]);
        let bias =
            || tensor4(&lcg_values(15, h * n * m), [1, h, n, m], &device).expand([b, h, n, m]);

        let cases: Vec<(&str, ScalePolicy, bool, bool, bool)> = vec![
            ("plain", ScalePolicy::InvSqrtDk, false, false, false),
            ("fixed scale", ScalePolicy::Fixed(0.5), false, false, false),
            ("mask", ScalePolicy::InvSqrtDk, true, false, false),
            (
                "causal bottom-right",
                ScalePolicy::InvSqrtDk,
                false,
                true,
                false,
            ),
            ("mask + causal", ScalePolicy::InvSqrtDk, true, true, false),
            ("bias", ScalePolicy::InvSqrtDk, false, false, true),
        ];
        for (name, scale, use_mask, causal, use_bias) in cases {
            let options = AttentionModuleOptions {
                scale: match scale {
                    ScalePolicy::InvSqrtDk => None,
                    other => Some(other.factor(d)),
                },
                softcap: None,
                is_causal: causal,
            };
            let theirs = attention(
                q(),
                k(),
                v(),
                use_mask.then(mask),
                use_bias.then(bias),
                options,
            );
            let attn = ScaledDotProductAttentionConfig::new()
                .with_scale(scale)
                .with_causal_alignment(CausalAlignment::BottomRight)
                .init();
            let mut input = AttentionInput::new(q(), k(), v());
            if use_mask {
                input = input.mask(mask());
            }
            if use_bias {
                input = input.bias(bias());
            }
            if causal {
                input = input.causal();
            }
            let ours = attn.forward(input).context;
            let diff = max_abs_diff(&values(ours), &values(theirs));
            println!("{backend}: {name}: max |ours - burn::attention| = {diff:.2e}");
            assert!(
                diff < 1e-5,
                "{backend}: {name}: differs from Burn's attention by {diff}"
            );
        }
    }
}
