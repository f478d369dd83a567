//! Bad input never panics deep inside Burn: each case gives an `AttentionError` whose message
//! names the shapes or values, and the panicking `forward`/`init` carry the same message.

use burn::prelude::*;
use sdpa::{
    AttentionError, AttentionInput, MultiHeadSdpaConfig, MultiHeadSdpaInput, ScalePolicy,
    ScaledDotProductAttentionConfig,
};

use crate::common::devices;

fn device() -> Device {
    devices().remove(0).1
}

fn z(shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::zeros(shape, device)
}

fn try_shapes(q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> AttentionError {
    let d = device();
    let attn = ScaledDotProductAttentionConfig::new().init();
    attn.try_forward(AttentionInput::new(z(q, &d), z(k, &d), z(v, &d)))
        .expect_err("must be rejected")
}

fn message_of_panic(f: impl FnOnce() + std::panic::UnwindSafe) -> String {
    let err = std::panic::catch_unwind(f).expect_err("must panic");
    err.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn wrong_d_k() {
    let e = try_shapes([1, 2, 3, 4], [1, 2, 5, 8], [1, 2, 5, 6]);
    assert!(matches!(e, AttentionError::DkMismatch { .. }), "{e:?}");
    assert!(
        e.to_string().contains("[1, 2, 3, 4]") && e.to_string().contains("[1, 2, 5, 8]"),
        "{e}"
    );
}

#[test]
fn wrong_batch() {
    let e = try_shapes([2, 2, 3, 4], [1, 2, 5, 4], [1, 2, 5, 6]);
    assert!(matches!(e, AttentionError::BatchMismatch { .. }), "{e:?}");
    assert!(e.to_string().contains("[2, 2, 3, 4]"), "{e}");
}

#[test]
fn key_and_value_lengths_differ() {
    let e = try_shapes([1, 2, 3, 4], [1, 2, 5, 4], [1, 2, 6, 6]);
    assert!(
        matches!(e, AttentionError::KeyValueMismatch { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains("[1, 2, 6, 6]"), "{e}");
}

#[test]
fn key_and_value_heads_differ() {
    let e = try_shapes([1, 4, 3, 4], [1, 2, 5, 4], [1, 4, 5, 6]);
    assert!(
        matches!(e, AttentionError::KeyValueMismatch { .. }),
        "{e:?}"
    );
}

#[test]
fn heads_not_divisible() {
    let e = try_shapes([1, 3, 3, 4], [1, 2, 5, 4], [1, 2, 5, 6]);
    assert_eq!(
        e,
        AttentionError::HeadGrouping {
            n_heads: 3,
            n_kv_heads: 2
        }
    );
    assert!(
        e.to_string().contains("3 heads") && e.to_string().contains("2"),
        "{e}"
    );
}

#[test]
fn empty_axis() {
    let e = try_shapes([1, 2, 3, 4], [1, 2, 0, 4], [1, 2, 0, 6]);
    assert!(
        matches!(e, AttentionError::EmptyAxis { tensor: "key", .. }),
        "{e:?}"
    );
}

#[test]
fn mask_that_does_not_broadcast() {
    let d = device();
    let attn = ScaledDotProductAttentionConfig::new().init();
    for shape in [[1, 1, 3, 4], [3, 1, 1, 5], [1, 3, 1, 5], [1, 1, 2, 5]] {
        let mask = Tensor::<4, Bool>::empty(shape, &d);
        let e = attn
            .try_forward(
                AttentionInput::new(
                    z([2, 2, 3, 4], &d),
                    z([2, 2, 5, 4], &d),
                    z([2, 2, 5, 6], &d),
                )
                .mask(mask),
            )
            .expect_err("must be rejected");
        assert!(
            matches!(e, AttentionError::NotBroadcastable { tensor: "mask", .. }),
            "{e:?}"
        );
        assert!(
            e.to_string().contains(&format!("{shape:?}")) && e.to_string().contains("[2, 2, 3, 5]"),
            "{e}"
        );
    }
}

#[test]
fn bias_that_does_not_broadcast() {
    let d = device();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let e = attn
        .try_forward(
            AttentionInput::new(
                z([2, 2, 3, 4], &d),
                z([2, 2, 5, 4], &d),
                z([2, 2, 5, 6], &d),
            )
            .bias(z([1, 1, 3, 4], &d)),
        )
        .expect_err("must be rejected");
    assert!(
        matches!(e, AttentionError::NotBroadcastable { tensor: "bias", .. }),
        "{e:?}"
    );
}

#[test]
fn non_finite_or_non_positive_fixed_scale() {
    for s in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        let e = ScaledDotProductAttentionConfig::new()
            .with_scale(ScalePolicy::Fixed(s))
            .try_init()
            .expect_err("must be rejected");
        assert!(matches!(e, AttentionError::InvalidScale(_)), "{e:?}");
        assert!(e.to_string().contains(&format!("{s}")), "{e}");
    }
}

#[test]
fn dropout_outside_unit_interval() {
    for p in [-0.1, 1.0, 1.5, f64::NAN] {
        let e = ScaledDotProductAttentionConfig::new()
            .with_dropout(p)
            .try_init()
            .expect_err("must be rejected");
        assert!(matches!(e, AttentionError::InvalidDropout(_)), "{e:?}");
        assert!(e.to_string().contains(&format!("{p}")), "{e}");
    }
}

#[test]
fn forward_and_init_panic_with_the_same_message() {
    let d = device();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let input = AttentionInput::new(
        z([1, 2, 3, 4], &d),
        z([1, 2, 5, 8], &d),
        z([1, 2, 5, 6], &d),
    );
    let want = attn
        .try_forward(input.clone())
        .expect_err("rejected")
        .to_string();
    let got = message_of_panic(std::panic::AssertUnwindSafe(|| {
        attn.forward(input);
    }));
    assert_eq!(got, want);

    let cfg = ScaledDotProductAttentionConfig::new().with_dropout(2.0);
    let want = cfg.try_init().expect_err("rejected").to_string();
    assert_eq!(
        message_of_panic(|| {
            cfg.init();
        }),
        want
    );
}

#[test]
fn multi_head_config_is_validated_at_init() {
    let d = device();
    let cases = [
        (MultiHeadSdpaConfig::new(30, 4), "d_model = 30"),
        (MultiHeadSdpaConfig::new(32, 0), "n_heads = 0"),
        (MultiHeadSdpaConfig::new(0, 4), "d_model = 0"),
        (
            MultiHeadSdpaConfig::new(32, 4).with_n_kv_heads(Some(3)),
            "4 heads",
        ),
        (
            MultiHeadSdpaConfig::new(32, 4).with_n_kv_heads(Some(0)),
            "n_kv_heads = 0",
        ),
        (MultiHeadSdpaConfig::new(32, 4).with_d_k(Some(0)), "d_k = 0"),
        (MultiHeadSdpaConfig::new(32, 4).with_dropout(1.0), "dropout"),
        (
            MultiHeadSdpaConfig::new(32, 4).with_scale(ScalePolicy::Fixed(-2.0)),
            "-2",
        ),
    ];
    for (cfg, needle) in cases {
        let e = cfg.try_init(&d).expect_err("must be rejected");
        assert!(
            e.to_string().contains(needle),
            "`{e}` should mention `{needle}`"
        );
    }
    // d_k set explicitly lifts the divisibility requirement.
    let mha = MultiHeadSdpaConfig::new(30, 4)
        .with_d_k(Some(16))
        .try_init(&d)
        .expect("valid");
    assert_eq!(mha.d_k, 16);
}

#[test]
fn multi_head_input_shapes_are_checked() {
    let d = device();
    let mha = MultiHeadSdpaConfig::new(16, 2).init(&d);
    let x = Tensor::<3>::zeros([2, 5, 8], &d);
    let e = mha
        .try_forward(MultiHeadSdpaInput::self_attn(x))
        .expect_err("wrong d_model");
    assert!(
        e.to_string().contains("d_model = 16") && e.to_string().contains("[2, 5, 8]"),
        "{e}"
    );

    let x = Tensor::<3>::zeros([2, 5, 16], &d);
    let pad = Tensor::<2, Bool>::empty([2, 4], &d);
    let e = mha
        .try_forward(MultiHeadSdpaInput::self_attn(x.clone()).padding_mask(pad))
        .expect_err("wrong padding");
    assert!(
        e.to_string().contains("[2, 5]") && e.to_string().contains("[2, 4]"),
        "{e}"
    );

    let kv = Tensor::<3>::zeros([1, 5, 16], &d);
    let e = mha
        .try_forward(MultiHeadSdpaInput::new(x, kv.clone(), kv))
        .expect_err("wrong batch");
    assert!(
        matches!(
            e,
            AttentionError::Shape {
                what: "key/value",
                ..
            }
        ),
        "{e:?}"
    );
}
