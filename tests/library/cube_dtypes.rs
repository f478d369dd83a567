//! The CubeCL flash kernel on half-precision data (wgpu): f16 inputs are computed in f32 and
//! only the results are rounded, so the kernel's f16 context and gradients sit within a few f16
//! roundings of an f32 `Naive` run on the same (f16-exact) values — and closer to it than
//! `Naive` computing in f16 itself. Each half type is served where the device reports it
//! (`Device::supports_dtype`); where it does not (bf16 on lavapipe), the kernel refuses it with
//! the reason and `Auto` takes another path.

#![cfg(feature = "wgpu")]

use burn::prelude::*;
use burn::tensor::{DType, FloatDType};
use sdpa::{
    AttentionInput, AttentionPath, BackendKind, Implementation, ScaledDotProductAttentionConfig,
};

use crate::half_precision::{Shape, U_BF16, U_F16, compare};

/// A short shape whose head size (12) takes the workgroup-memory tiles, a long one (16) the
/// plane broadcasts.
const SHAPES: [Shape; 2] = [(37, 53, 4, 2, 12), (300, 260, 2, 1, 16)];

/// On a device without `dtype`, the kernel refuses it with the reason and `Auto` does not take
/// it.
fn assert_refused(device: &Device, dtype: DType) {
    // `empty` allocates without running a kernel in the missing type.
    let x = Tensor::<4>::empty([1, 1, 4, 8], (device, dtype));
    let input = AttentionInput::new(x.clone(), x.clone(), x);
    let err = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CubeKernel)
        .init()
        .path(&input)
        .expect_err("a dtype the device lacks");
    assert!(
        err.to_string().contains("does not support this dtype"),
        "{err}"
    );
    let auto = ScaledDotProductAttentionConfig::new().init().path(&input);
    assert_ne!(auto.ok(), Some(AttentionPath::CubeKernel));
}

#[test]
fn the_cube_kernel_computes_f16_in_f32_on_wgpu() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(11);
    if !device.supports_dtype(FloatDType::F16) {
        println!("this wgpu device has no f16 (lavapipe, in CI, has it)");
        assert_refused(&device, DType::F16);
        return;
    }
    let x = Tensor::<4>::zeros([1, 1, 4, 8], (&device, DType::F16));
    let attention = ScaledDotProductAttentionConfig::new().init();
    assert_eq!(
        attention
            .path(&AttentionInput::new(x.clone(), x.clone(), x))
            .unwrap(),
        AttentionPath::CubeKernel,
        "Auto takes the kernel for f16"
    );
    compare(
        &device,
        DType::F16,
        U_F16,
        Implementation::CubeKernel,
        &SHAPES,
    );
}

#[test]
fn the_cube_kernel_serves_bf16_where_the_device_has_it() {
    let device = BackendKind::Wgpu.device().expect("wgpu").autodiff();
    device.seed(12);
    if device.supports_dtype(FloatDType::BF16) {
        compare(
            &device,
            DType::BF16,
            U_BF16,
            Implementation::CubeKernel,
            &SHAPES,
        );
    } else {
        assert_refused(&device, DType::BF16);
    }
}
