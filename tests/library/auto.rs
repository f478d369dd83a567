//! `Implementation::Auto` on every backend compiled in: it recognizes the backend, takes the
//! path its documented rule names, and that path gives the naive path's output and gradients.

use burn::prelude::*;
use sdpa::{
    AttentionInput, AttentionPath, BackendFamily, BackendKind, Implementation,
    ScaledDotProductAttentionConfig,
};

use crate::common::{devices, lcg_values, max_abs_diff, tensor4, values};

#[test]
fn backend_family_is_recognized() {
    for (backend, device) in devices() {
        let expected = match backend {
            BackendKind::Flex => BackendFamily::Flex,
            BackendKind::Ndarray => BackendFamily::NdArray,
            BackendKind::Wgpu | BackendKind::Cuda | BackendKind::Vulkan => BackendFamily::CubeCl,
        };
        assert_eq!(BackendFamily::of(&device), expected, "{backend}");
        assert_eq!(
            BackendFamily::of(&device.clone().autodiff()),
            expected,
            "{backend} autodiff"
        );
    }
}

#[test]
fn auto_takes_the_documented_path_and_matches_naive() {
    // m = DEFAULT_BLOCK_SIZE + 44 keys: more than one key block of the chunked path and of the CPU
    // kernel (whose forward and backward tiles are smaller), so both cross block edges; on
    // the CPU backends.
    let (b, h, n, m, d) = (1, 2, 6, Implementation::DEFAULT_BLOCK_SIZE + 44, 8);
    let auto = ScaledDotProductAttentionConfig::new().init();
    let naive = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::Naive)
        .init();
    for (backend, device) in devices() {
        for autodiff in [false, true] {
            let device = if autodiff {
                device.clone().autodiff()
            } else {
                device.clone()
            };
            let q = tensor4(&lcg_values(21, b * h * n * d), [b, h, n, d], &device);
            let k = tensor4(&lcg_values(22, b * h * m * d), [b, h, m, d], &device);
            let v = tensor4(&lcg_values(23, b * h * m * d), [b, h, m, d], &device);
            let input =
                |q: &Tensor<4>| AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
            let path = auto.path(&input(&q)).expect("auto resolves");
            // On the CPU backends (the root package turns on the kernel's backend extension):
            // this crate's kernel, inference and training, masked or not. On wgpu (the root
            // package's `wgpu` feature turns on `burn-sdpa/cube`): the CubeCL kernel, inference
            // and training (this fails if `Auto` stops taking it for a training call) on a
            // device without matrix instructions (lavapipe on Debian 12, wgpu's WGSL compiler).
            // On a device with them (CUDA; Vulkan with cooperative matrices): the CubeCL kernel
            // for training, Burn's tensor-core kernel for inference wherever it serves the call.
            let tensor_cores = sdpa::has_tensor_cores(&device);
            let expected = |input: &AttentionInput| {
                let fused_serves = auto
                    .why_not(input, AttentionPath::Fused)
                    .expect("a valid call")
                    .is_none();
                match backend {
                    BackendKind::Flex | BackendKind::Ndarray => AttentionPath::CpuKernel,
                    _ if tensor_cores && !autodiff && fused_serves => AttentionPath::Fused,
                    BackendKind::Wgpu | BackendKind::Cuda | BackendKind::Vulkan => {
                        AttentionPath::CubeKernel
                    }
                }
            };
            assert_eq!(path, expected(&input(&q)), "{backend}, autodiff {autodiff}");
            let masked = input(&q).mask(Tensor::<4, Bool>::full([1, 1, 1, m], false, &device));
            assert_eq!(
                auto.path(&masked).expect("auto resolves"),
                expected(&masked),
                "{backend}, autodiff {autodiff}, masked"
            );
            // Asking for the weights always takes the naive path.
            let with_weights = input(&q).need_weights();
            assert_eq!(
                auto.path(&with_weights).expect("auto resolves"),
                AttentionPath::Naive
            );

            let (q_auto, q_naive) = if autodiff {
                (q.clone().require_grad(), q.clone().require_grad())
            } else {
                (q.clone(), q.clone())
            };
            let out_auto = auto.forward(input(&q_auto)).context;
            let out_naive = naive.forward(input(&q_naive)).context;
            let diff = max_abs_diff(&values(out_auto.clone()), &values(out_naive.clone()));
            assert!(
                diff < 1e-5,
                "{backend}, autodiff {autodiff}: output differs by {diff}"
            );
            if autodiff {
                let g_auto = q_auto.grad(&out_auto.sum().backward()).expect("grad");
                let g_naive = q_naive.grad(&out_naive.sum().backward()).expect("grad");
                let diff = max_abs_diff(&values(g_auto), &values(g_naive));
                assert!(diff < 1e-5, "{backend}: ∂/∂Q differs by {diff}");
            }
        }
    }
}

#[test]
fn cpu_kernel_reads_shared_and_permuted_inputs() {
    // The kernel reads the tensors on the host: a query laid out [b, n, h, d] and permuted (as in
    // multi-head attention), and a key and value still held elsewhere, must read as the same
    // values on every backend (NdArray takes its own copy path for those).
    let (b, h, n, m, d) = (2, 3, 70, 140, 8);
    let kernel = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::CpuKernel)
        .init();
    let naive = ScaledDotProductAttentionConfig::new()
        .with_implementation(Implementation::Naive)
        .init();
    for (backend, device) in devices() {
        // [b, n, h, d] -> [b, h, n, d]: a non-contiguous view.
        let q = tensor4(&lcg_values(31, b * n * h * d), [b, n, h, d], &device).swap_dims(1, 2);
        let k = tensor4(&lcg_values(32, b * h * m * d), [b, h, m, d], &device);
        let v = tensor4(&lcg_values(33, b * h * m * d), [b, h, m, d], &device);
        let input = || AttentionInput::new(q.clone(), k.clone(), v.clone()).causal();
        let got = values(kernel.forward(input()).context);
        let want = values(naive.forward(input()).context);
        let diff = max_abs_diff(&got, &want);
        assert!(diff < 1e-5, "{backend}: differs from naive by {diff}");
        // The inputs are still intact and usable afterwards.
        assert_eq!(q.dims(), [b, h, n, d]);
        let again = values(kernel.forward(input()).context);
        assert_eq!(got, again, "{backend}: a second call differs");
    }
}

/// The README's example (and the drop-in layers' training step in `drop-in.md`) on Flex with
/// autodiff: a training-sized call takes the fused CPU kernel, and `path` says so, for the module,
/// the multi-head layer and the drop-in layer alike.
#[test]
fn the_readme_example_takes_the_fused_path() {
    use burn::tensor::Distribution;
    use sdpa::nn::attention::{MhaInput, MultiHeadAttentionConfig};
    use sdpa::{MultiHeadSdpaConfig, MultiHeadSdpaInput};
    let device = Device::flex().autodiff();
    let attn = ScaledDotProductAttentionConfig::new().init();
    let x = |shape: [usize; 4]| Tensor::<4>::random(shape, Distribution::Default, &device);
    let q = x([2, 8, 256, 64]).require_grad();
    let (k, v) = (x([2, 8, 256, 64]), x([2, 8, 256, 64]));
    let input = AttentionInput::new(q.clone(), k, v).causal();
    assert_eq!(attn.path(&input).unwrap(), AttentionPath::CpuKernel);
    let grads = attn.forward(input).context.sum().backward();
    assert!(q.grad(&grads).is_some());

    let tokens = Tensor::<3>::random([2, 128, 64], Distribution::Default, &device);
    // burn-nn's default dropout (0.1) keeps a training call on the naive path; without it, the
    // kernel.
    let with_dropout = MultiHeadAttentionConfig::new(64, 4).init(&device);
    let input = MhaInput::self_attn(tokens.clone()).causal();
    assert_eq!(with_dropout.path(&input).unwrap(), AttentionPath::Naive);
    let drop_in = MultiHeadAttentionConfig::new(64, 4)
        .with_dropout(0.0)
        .init(&device);
    assert_eq!(drop_in.path(&input).unwrap(), AttentionPath::CpuKernel);
    assert_eq!(
        drop_in.path(&input.need_weights()).unwrap(),
        AttentionPath::Naive
    );
    let layer = MultiHeadSdpaConfig::new(64, 4).init(&device);
    let input = MultiHeadSdpaInput::self_attn(tokens).causal();
    assert_eq!(layer.path(&input).unwrap(), AttentionPath::CpuKernel);
}
