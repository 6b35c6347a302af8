//! `muser check --backend cuda`: every CUDA kernel against the CPU reference kernel on fresh
//! random inputs, at the Muse Glimmer shapes and on both sides of every routing boundary
//! (1, 2, 4, 8, 9, 16 and 512 columns), with SPEC section 5's NMSE thresholds.

use muser_cuda::parity::{check_matvec, Parity};
use muser_cuda::Gpu;
use muser_gguf::GgmlType;

#[derive(clap::Args)]
pub struct Args {
    /// The backend to check (cuda).
    #[arg(long, default_value = "cuda")]
    backend: String,
    /// Small shapes only (a quick smoke test).
    #[arg(long)]
    quick: bool,
    /// Seed of the random inputs.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// (name, rows, cols, type) of the Muse Glimmer matrices.
const GLIMMER: &[(&str, usize, usize, GgmlType)] = &[
    ("attn_q/attn_gate", 4096, 6656, GgmlType::Q4_K),
    ("attn_k", 256, 6656, GgmlType::Q4_K),
    ("attn_v", 256, 6656, GgmlType::Q6_K),
    ("attn_output", 6656, 4096, GgmlType::Q4_K),
    ("ffn_gate/ffn_up", 19968, 6656, GgmlType::Q4_K),
    ("ffn_down", 6656, 19968, GgmlType::Q4_K),
    ("ffn_down (more bits)", 6656, 19968, GgmlType::Q6_K),
    ("output", 202048, 6656, GgmlType::Q5_K),
];

pub fn run(args: Args) -> anyhow::Result<()> {
    anyhow::ensure!(args.backend == "cuda", "muser check supports --backend cuda (got {:?})", args.backend);
    let gpu = Gpu::new(0)?;
    eprintln!("checking {} ({}) against the CPU reference", gpu.name, gpu.arch);
    let mut cases: Vec<(String, usize, usize, GgmlType, usize)> = Vec::new();
    let columns = [1usize, 2, 4, 8, 9, 16];
    if args.quick {
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32] {
            for n in columns {
                cases.push((format!("{ty}"), 64, 512, ty, n));
            }
        }
    } else {
        for &(name, rows, cols, ty) in GLIMMER {
            // The LM head's CPU reference is 1.3 G multiply-adds a column: two columns suffice.
            let ns: &[usize] = if rows > 100_000 { &[1, 2] } else { &columns };
            for &n in ns {
                cases.push((name.to_string(), rows, cols, ty, n));
            }
        }
        for ty in [GgmlType::Q5_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32] {
            for n in columns {
                cases.push((format!("{ty} 4096x6656"), 4096, 6656, ty, n));
            }
        }
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K, GgmlType::Q8_0, GgmlType::F16, GgmlType::F32] {
            cases.push((format!("{ty} prefill-width"), 1024, 6656, ty, 512));
        }
    }
    let mut results: Vec<(String, Parity)> = Vec::new();
    for (i, (name, rows, cols, ty, n)) in cases.iter().enumerate() {
        let p = check_matvec(&gpu, *ty, *rows, *cols, *n, args.seed.wrapping_add(i as u64))?;
        println!(
            "{:<6} {:<14} {:<24} {:<22} nmse {:>10.3e} (<= {:.0e})  {}",
            if p.pass() { "ok" } else { "FAIL" },
            p.kernel,
            name,
            p.shape,
            p.nmse,
            p.threshold,
            ty
        );
        results.push((name.clone(), p));
    }
    println!("\ndispatch audit (kernel: launches in this run):");
    for (k, n) in gpu.dispatch_counts() {
        println!("  {k:<20} {n}{}", if n == 0 { "   <- never dispatched" } else { "" });
    }
    let failed = results.iter().filter(|(_, p)| !p.pass()).count();
    anyhow::ensure!(failed == 0, "{failed} of {} parity checks failed", results.len());
    println!("all {} parity checks passed", results.len());
    Ok(())
}
