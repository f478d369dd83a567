//! Does this device run CubeCL's matrix instructions (`cmma`: tensor cores on CUDA, cooperative
//! matrices on Vulkan)? Prints the matrix shapes and types the device's CubeCL client lists, then
//! runs one product of each square shape it lists for f16 or bf16 operands with an f32
//! accumulator (the forms the tensor-core attention path uses) and compares it with the same
//! product on the host.
//!
//! ```sh
//! # Vulkan through the SPIR-V compiler (Burn's `vulkan` feature); on a machine without a GPU,
//! # Debian sid's lavapipe, which has cooperative matrices (Debian 12's has none):
//! cargo build --release --features vulkan --example matrix_instructions
//! .ci/lavapipe-coopmat.sh -- target/release/examples/matrix_instructions vulkan
//! # CUDA (a binary linked where GitHub is reachable; see benches/gpu_sitting.sh):
//! cargo run --release --features cuda --example matrix_instructions -- cuda
//! ```
//!
//! Exit status: 0 when every such form ran and matched the host, 1 when one did not, 2 when the
//! device could not be opened, 3 when the device lists no such form.
//! The operands are small integers (exact in f16 and bf16), so the products are exact in f32:
//! any difference is a wrong result, not rounding.

#[cfg(any(feature = "vulkan", feature = "cuda"))]
mod probe {
    use burn::backend::DispatchDevice;
    use burn::prelude::Device;
    use cubecl::features::MmaConfig;
    use cubecl::ir::{ElemType, FloatKind};
    use cubecl::prelude::*;

    /// `out = lhs · rhs` for one `size`³ tile: `lhs` row-major, `rhs` column-major (so the
    /// host reads `rhs[j·size + k]` for B[k][j]), `out` row-major, accumulated in f32.
    #[cube(launch)]
    fn tile_product<I: Float>(
        lhs: &[I],
        rhs: &[I],
        out: &mut [f32],
        #[comptime] size: usize,
        #[define(I)] _e: ElemType,
    ) {
        let a = cmma::Matrix::<I>::from_slice(
            cmma::MatrixIdent::A,
            size,
            size,
            size,
            cmma::MatrixLayout::RowMajor,
            lhs,
            comptime!(size as u32),
        );
        let b = cmma::Matrix::<I>::from_slice(
            cmma::MatrixIdent::B,
            size,
            size,
            size,
            cmma::MatrixLayout::ColMajor,
            rhs,
            comptime!(size as u32),
        );
        let c = cmma::Matrix::<f32>::from_value(
            cmma::MatrixIdent::Accumulator,
            size,
            size,
            size,
            cmma::MatrixLayout::Undefined,
            0.0,
        );
        cmma::execute(&a, &b, &c, &c);
        cmma::store(
            out,
            &c,
            comptime!(size as u32),
            cmma::MatrixLayout::RowMajor,
        );
    }

    /// Whether `config` is a square form with `operand` inputs and an f32 accumulator.
    fn square_half(config: &MmaConfig) -> Option<(FloatKind, usize)> {
        let ElemType::Float(operand) = config.a_type else {
            return None;
        };
        let half = matches!(operand, FloatKind::F16 | FloatKind::BF16);
        let square = config.m == config.n && config.n == config.k;
        (half
            && config.b_type == config.a_type
            && config.cd_type == ElemType::Float(FloatKind::F32)
            && square)
            .then_some((operand, config.m as usize))
    }

    /// Runs the `size`³ tile product with `operand` inputs; the largest difference from the
    /// host.
    fn run(client: &cubecl::client::Client, operand: FloatKind, size: usize) -> f32 {
        use burn::tensor::{bf16, f16};
        let len = size * size;
        // Small integers, exact in both half types; B column-major: rhs[j·size + k] = B[k][j].
        let lhs: Vec<f32> = (0..len).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let rhs: Vec<f32> = (0..len).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
        let mut expected = vec![0.0f32; len];
        for row in 0..size {
            for col in 0..size {
                expected[row * size + col] = (0..size)
                    .map(|k| lhs[row * size + k] * rhs[col * size + k])
                    .sum();
            }
        }
        let bytes = |values: &[f32]| -> Vec<u8> {
            values
                .iter()
                .flat_map(|&x| match operand {
                    FloatKind::BF16 => bf16::from_f32(x).to_le_bytes(),
                    _ => f16::from_f32(x).to_le_bytes(),
                })
                .collect()
        };
        let lhs_handle = client.create_from_slice(&bytes(&lhs));
        let rhs_handle = client.create_from_slice(&bytes(&rhs));
        let out = client.empty(len * 4);
        // SAFETY: each handle holds exactly the `len` elements of its argument's type.
        let (lhs_arg, rhs_arg, out_arg) = unsafe {
            (
                BufferArg::from_raw_parts(lhs_handle, len),
                BufferArg::from_raw_parts(rhs_handle, len),
                BufferArg::from_raw_parts(out.clone(), len),
            )
        };
        tile_product::launch(
            client,
            CubeCount::Static(1, 1, 1),
            CubeDim::new_1d(client.properties().hardware.plane_size_max),
            lhs_arg,
            rhs_arg,
            out_arg,
            size,
            ElemType::Float(operand),
        );
        let actual = client.read_one_unchecked(out);
        actual
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .zip(&expected)
            .map(|(a, e)| (a - e).abs())
            .fold(
                if actual.len() == len * 4 {
                    0.0
                } else {
                    f32::INFINITY
                },
                f32::max,
            )
    }

    pub fn main(kind: &str) -> i32 {
        let device = match kind {
            #[cfg(feature = "vulkan")]
            "vulkan" => Device::vulkan(Default::default()),
            #[cfg(feature = "cuda")]
            "cuda" => Device::cuda(0),
            other => {
                eprintln!("unknown or not compiled in: {other} (vulkan, cuda)");
                return 2;
            }
        };
        let DispatchDevice::Cube(cube) = device.as_dispatch() else {
            eprintln!("{kind}: not a CubeCL device");
            return 2;
        };
        let client = cube.client();
        let properties = client.properties();
        println!("device: {}", properties.identity.name);
        let cmma = &properties.features.matmul.cmma;
        if cmma.is_empty() {
            println!("matrix instructions: none");
            return 3;
        }
        for config in cmma {
            println!(
                "cmma {}x{}x{}: {:?} x {:?} -> {:?}",
                config.m, config.n, config.k, config.a_type, config.b_type, config.cd_type
            );
        }
        let mut status = 3;
        for (operand, size) in cmma.iter().filter_map(square_half) {
            let diff = run(&client, operand, size);
            let ok = diff == 0.0;
            println!(
                "{operand:?} x {operand:?} -> F32 {size}x{size}x{size}: largest difference from \
                 the host {diff} ({})",
                if ok { "exact" } else { "WRONG" }
            );
            status = match (status, ok) {
                (1, _) | (_, false) => 1,
                _ => 0,
            };
        }
        if status == 3 {
            println!("no square f16 or bf16 form with an f32 accumulator");
        }
        status
    }
}

#[cfg(any(feature = "vulkan", feature = "cuda"))]
fn main() {
    let kind = std::env::args().nth(1).unwrap_or_else(|| "vulkan".into());
    std::process::exit(probe::main(&kind));
}

#[cfg(not(any(feature = "vulkan", feature = "cuda")))]
fn main() {
    eprintln!("build with --features vulkan (or cuda) to probe a device's matrix instructions");
    std::process::exit(2);
}
