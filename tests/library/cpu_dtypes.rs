//! The CPU kernel on bf16 and f16 data (Flex): half-precision storage, f32 softmax and
//! accumulators, so its context and gradients sit within a few roundings of an f32 `Naive` run on
//! the same (exactly representable) values, and closer to it than `Naive` computing in the half
//! type itself; `Auto` takes it for those calls on Flex, for inference and training. The tile products run on the fastest
//! instruction set this machine has (`cpu_kernel::bf16_product_isa`; the library's unit tests run
//! every one it has). NdArray has no bf16 tensors.

#![cfg(feature = "flex")]

use burn::prelude::*;
use burn::tensor::{DType, Distribution};
use sdpa::{
    AttentionError, AttentionInput, AttentionPath, BackendKind, Implementation,
    MultiHeadSdpaConfig, Precision, ScaledDotProductAttentionConfig, cpu_kernel,
};

use crate::common::values;
use crate::half_precision::{Shape, U_BF16, U_F16, compare, relative_error, run};

/// Head sizes below one 32-value depth tile (12) and of two full ones (64, the sizes the model
/// and the bench use), across several of the kernel's query and key blocks.
const SHAPES: [Shape; 2] = [(37, 53, 4, 2, 12), (300, 260, 2, 1, 64)];

#[test]
fn the_cpu_kernel_computes_bf16_in_f32_on_flex() {
    let device = Device::flex().autodiff();
    device.seed(13);
    println!("bf16 tile products: {}", cpu_kernel::bf16_product_isa());
    compare(
        &device,
        DType::BF16,
        U_BF16,
        Implementation::CpuKernel,
        &SHAPES,
    );
}

/// f16 has no product instructions here: the kernel computes f16 calls in f32 on widened copies
/// and rounds the results once (`paths/cpu/storage.rs`), so the same rule holds with f16's
/// unit roundoff.
#[test]
fn the_cpu_kernel_computes_f16_in_f32_on_flex() {
    let device = Device::flex().autodiff();
    device.seed(16);
    compare(
        &device,
        DType::F16,
        U_F16,
        Implementation::CpuKernel,
        &SHAPES,
    );
}

#[test]
fn auto_takes_the_cpu_kernel_for_half_precision_on_flex() {
    for (device, dtype) in [
        (Device::flex(), DType::BF16),
        (Device::flex().autodiff(), DType::BF16),
        (Device::flex().autodiff(), DType::F16),
    ] {
        let x = Tensor::<4>::zeros([1, 2, 300, 32], (&device, dtype));
        let input = AttentionInput::new(x.clone(), x.clone(), x.clone());
        let attention = ScaledDotProductAttentionConfig::new().init();
        assert_eq!(
            attention.path(&input).unwrap(),
            AttentionPath::CpuKernel,
            "{device:?}"
        );
        // With a bias (in the inputs' dtype, as the module requires), masked, causal.
        let bias = Tensor::<4>::zeros([1, 1, 300, 300], (&device, dtype));
        let mask = Tensor::<4, Bool>::empty([1, 1, 300, 300], &device);
        let input = input.bias(bias).mask(mask).causal();
        assert_eq!(
            attention.path(&input).unwrap(),
            AttentionPath::CpuKernel,
            "{device:?} with a bias and masks"
        );
    }
}

/// A NaN in a value row hidden by the causal mask from the earlier queries: the policy poisons
/// exactly the rows that see it, in bf16 as in f32 (a bare kernel would multiply the hidden
/// key's zero weight by NaN and poison every row), forward and backward.
#[test]
fn a_non_finite_bf16_input_poisons_the_rows_the_f32_kernel_poisons() {
    let device = Device::flex().autodiff();
    device.seed(14);
    let random = |shape: [usize; 4]| {
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device).cast(DType::BF16)
    };
    // n = m: query i sees keys 0..=i.
    let (q, k, v) = (
        random([1, 2, 40, 16]),
        random([1, 2, 40, 16]),
        random([1, 2, 40, 16]),
    );
    let nan = Tensor::<4>::full([1, 1, 1, 16], f32::NAN, (&device, DType::BF16));
    let v = v.slice_assign(s![0..1, 1..2, 7..8, 0..16], nan);
    let attention = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CpuKernel)
        .init();
    let run = |dtype| {
        let leaf = |t: &Tensor<4>| t.clone().cast(dtype).detach().require_grad();
        let (q, k, v) = (leaf(&q), leaf(&k), leaf(&v));
        let context = attention
            .forward(AttentionInput::new(q.clone(), k.clone(), v.clone()).causal())
            .context;
        let grads = context.clone().sum().backward();
        (values(context), values(q.grad(&grads).expect("a gradient")))
    };
    let ((context16, dq16), (context32, dq32)) = (run(DType::BF16), run(DType::F32));
    let nan_rows = |xs: &[f64]| -> Vec<bool> { xs.chunks(16).map(|r| r[0].is_nan()).collect() };
    // Head 1's rows 7.. see the NaN; head 0 and head 1's rows 0..7 do not.
    let expected: Vec<bool> = (0..80).map(|row| row >= 40 + 7).collect();
    assert_eq!(nan_rows(&context16), expected, "bf16 context");
    assert_eq!(nan_rows(&context32), expected, "f32 context");
    assert_eq!(
        nan_rows(&dq16),
        nan_rows(&dq32),
        "the query gradients' NaN rows"
    );
    assert!(
        nan_rows(&dq16)[..47].iter().all(|&bad| !bad),
        "a row that does not see the NaN has a finite gradient"
    );
}

/// A bias broadcast over batch, heads and queries (`[1, 1, 1, m]`) in bf16: its gradient (the
/// score gradient summed over b·h·n rows, in f32, rounded once) within the few roundings of
/// every other output of f32 Naive on the same values.
#[test]
fn a_broadcast_bf16_bias_gets_its_gradient_within_a_few_roundings() {
    let device = Device::flex().autodiff();
    device.seed(17);
    let random = |shape: [usize; 4]| {
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device)
            .cast(DType::BF16)
            .cast(burn::tensor::FloatDType::F32)
    };
    let input = AttentionInput::new(
        random([2, 4, 64, 32]),
        random([2, 4, 80, 32]),
        random([2, 4, 80, 32]),
    )
    .bias(random([1, 1, 1, 80]));
    let weights = random([2, 4, 64, 32]);
    let got = run(
        &input,
        &weights,
        DType::BF16,
        Implementation::CpuKernel,
        None,
    );
    let reference = run(&input, &weights, DType::F32, Implementation::Naive, None);
    let err = relative_error(&got[4], &reference[4]);
    assert!(
        err <= 4.0 * U_BF16,
        "the bias gradient is {:.2} bf16 roundings from the f32 reference",
        err / U_BF16
    );
}

/// `Precision::Bf16` around f32 inputs: the call computes what the same call on the inputs cast
/// to bf16 computes (the CPU kernel, through `Auto`), and returns the context and the gradients
/// in f32. A device without bf16 tensors refuses it by name.
#[test]
fn bf16_precision_casts_f32_inputs_and_returns_f32() {
    let device = Device::flex().autodiff();
    device.seed(15);
    let random = |shape: [usize; 4]| {
        Tensor::<4>::random(shape, Distribution::Normal(0.0, 1.0), &device).require_grad()
    };
    let (q, k, v) = (
        random([2, 2, 70, 32]),
        random([2, 2, 90, 32]),
        random([2, 2, 90, 32]),
    );
    let input = AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
    let autocast = ScaledDotProductAttentionConfig::new()
        .with_precision(Precision::Bf16)
        .init();
    assert_eq!(autocast.path(&input).unwrap(), AttentionPath::CpuKernel);
    let context = autocast.forward(input.clone()).context;
    assert_eq!(context.dtype(), DType::F32);
    let grads = context.clone().sum().backward();
    let dq = q.grad(&grads).expect("a gradient");
    assert_eq!(dq.dtype(), DType::F32);

    let by_hand = ScaledDotProductAttentionConfig::new().init().forward(
        AttentionInput::new(
            q.clone().cast(DType::BF16),
            k.clone().cast(DType::BF16),
            v.clone().cast(DType::BF16),
        )
        .causal(),
    );
    assert_eq!(values(context), values(by_hand.context));

    let Ok(ndarray) = BackendKind::Ndarray.device() else {
        return; // built without NdArray
    };
    let x = Tensor::<4>::zeros([1, 1, 4, 8], &ndarray);
    let err = autocast
        .try_forward(AttentionInput::new(x.clone(), x.clone(), x))
        .expect_err("NdArray has no bf16");
    assert!(
        matches!(
            err,
            AttentionError::InvalidConfig {
                field: "precision",
                ..
            }
        ),
        "{err}"
    );
    // The multi-head layer refuses it when it is built, before any call.
    let err = MultiHeadSdpaConfig::new(16, 2)
        .with_precision(Precision::Bf16)
        .try_init(&ndarray)
        .expect_err("NdArray has no bf16");
    assert!(
        matches!(
            err,
            AttentionError::InvalidConfig {
                field: "precision",
                ..
            }
        ),
        "{err}"
    );
}
