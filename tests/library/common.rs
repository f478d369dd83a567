//! Devices and tensor helpers shared by the library tests.

use burn::prelude::*;
use burn::tensor::{DType, TensorData};
use sdpa::{BackendFamily, BackendKind, Implementation};

/// Every implementation that runs on `device`'s backend: [`Implementation::all`] (the chunked
/// path with `block_size` keys per block), filtered by [`Implementation::runs_on`], without the
/// tensor-core path (see below).
pub fn implementations(block_size: usize, device: &Device) -> Vec<Implementation> {
    let family = BackendFamily::of(device);
    Implementation::all(block_size)
        .filter(|implementation| implementation.runs_on(family))
        // The tensor-core path takes f16 and bf16 inputs only (f32 is refused by name), on a
        // device with matrix instructions: its checks are the half-precision golden runs
        // (`golden.rs`), not these f32 ones.
        .filter(|implementation| *implementation != Implementation::CubeTensorCores)
        .collect()
}

/// Every backend compiled into this test binary, opened. A compiled-in backend that cannot open
/// a device fails the test (no silent skip): in CI the wgpu feature is on and lavapipe provides
/// the adapter. The one exception is a backend that needs a GPU
/// ([`BackendKind::needs_gpu`], CUDA) on a machine without one: left out with a note on stderr
/// (a build with `--features cuda` runs these tests on CI's CPU-only machine too).
pub fn devices() -> Vec<(BackendKind, Device)> {
    let (usable, unusable) = BackendKind::usable();
    for (b, e) in unusable {
        assert!(
            b.needs_gpu(),
            "backend {b} is compiled in but unusable: {e}"
        );
        eprintln!("note: {b} left out: {e}");
    }
    for (_, device) in &usable {
        device.seed(7);
    }
    usable
}

/// The CPU backends compiled in (fast enough for many random cases).
pub fn cpu_devices() -> Vec<(BackendKind, Device)> {
    devices()
        .into_iter()
        .filter(|(b, _)| !matches!(b, BackendKind::Wgpu | BackendKind::Cuda))
        .collect()
}

/// A float tensor from f64 values (stored as the device's default float, f32).
pub fn tensor4(data: &[f64], shape: [usize; 4], device: &Device) -> Tensor<4> {
    let data: Vec<f32> = data.iter().map(|&x| x as f32).collect();
    Tensor::from_data(TensorData::new(data, shape), device)
}

/// A float64 tensor (for finite differences).
pub fn tensor4_f64(data: &[f64], shape: [usize; 4], device: &Device) -> Tensor<4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), (device, DType::F64))
}

/// A bool tensor.
pub fn bool4(data: &[bool], shape: [usize; 4], device: &Device) -> Tensor<4, Bool> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), device)
}

/// Reads any float tensor as f64 values.
pub fn values<const D: usize>(t: Tensor<D>) -> Vec<f64> {
    t.into_data()
        .convert::<f64>()
        .try_into_vec::<f64>()
        .expect("float data")
}

/// Largest |a − b|.
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "length mismatch");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// A small deterministic generator of normal-ish values (sum of uniforms), for tests that need
/// fixed data without a dependency on an RNG crate's stream.
pub fn lcg_values(seed: u64, len: usize) -> Vec<f64> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            let mut s = 0.0;
            for _ in 0..4 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                s += (state >> 11) as f64 / (1u64 << 53) as f64;
            }
            (s - 2.0) * 1.732
        })
        .collect()
}

/// Runs the ignored test `path` (`module::name`) of this test binary alone in a child process
/// with `env` set, and asserts that it ran and passed (its output is printed).
///
/// Two uses: knobs read once per process (the CubeCL kernel's tiling), and parallel work on
/// lavapipe. CubeCL serves each device from one server, so the wgpu tests of one process compile
/// and run their kernels one at a time (two such tests in one process used 107% of the CPU,
/// measured): a heavy wgpu test run in a child process gets its own device and the second core.
/// Kernels compiled in another process come from Mesa's shader cache.
pub fn in_child(path: &str, env: &[(&str, &str)]) {
    let exe = std::env::current_exe().expect("the test binary");
    let mut command = std::process::Command::new(&exe);
    // Run under another dynamic loader (`.ci/lavapipe-coopmat.sh`, which names its libraries):
    // the running executable is that loader, so the child is the loader again on this binary.
    if let Some(libs) = std::env::var_os("LAVAPIPE_COOPMAT_LIBS")
        && exe
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("ld-linux"))
    {
        let binary = std::env::args_os().next().expect("the test binary's path");
        command.arg("--library-path").arg(libs).arg(binary);
    }
    let output = command
        .args([
            path,
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().copied())
        .output()
        .expect("the child test runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{path} with {env:?} failed:\n{stdout}\n{stderr}"
    );
}

/// Whether `SDPA_TEST_FULL` is set: the few wgpu tests that trim their cases on lavapipe to fit
/// CI's 90 minutes on 2 cores (each says what it leaves out, and why that is covered elsewhere)
/// then run every case.
pub fn full_lavapipe() -> bool {
    std::env::var_os("SDPA_TEST_FULL").is_some()
}
