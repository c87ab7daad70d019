//! Which integer dot-product instructions the kernels run with, chosen once at start-up.
//!
//! The binary is built for x86-64-v3 (AVX2), which the appliance's Zen 1 has. Newer CPUs also
//! have VNNI: `vpdpbusd` does in one instruction what AVX2 needs `maddubs`, `madd` and an add
//! for (four u8·i8 products summed into each i32 lane, without the i16 saturation of `maddubs`),
//! and `vpdpwssd` folds `madd` and its add. Every kernel is compiled for both ([`Kernels`] is
//! generic over an [`Isa`]); the matmul entry points in [`super`] pick one per call from
//! [`selected`]. Where a kernel uses VNNI its integer sums are the AVX2 ones exactly (the
//! callers' operands never reach the saturation that could tell them apart), so the two give
//! bit-identical results: a CPU's choice never changes an answer.
//!
//! The VNNI instructions are the EVEX forms of AVX512-VNNI on 256-bit registers (AVX512VL):
//! Cascade Lake, Ice Lake and Sapphire Rapids Xeons, AMD Zen 4 and Zen 5 have them, which covers
//! the cloud machines that have VNNI at all (the VEX-only AVX-VNNI of Intel's client cores
//! is left out). They are written as inline assembly in `simd`, so they inline into the generic
//! kernels without compiling those for AVX-512 (which could put AVX-512 instructions anywhere).
//!
//! [`Kernels`]: super::format::Kernels

use std::sync::atomic::{AtomicU8, Ordering};

/// An instruction set the kernels are compiled for: a type, so every kernel is monomorphised
/// per set and the choice costs nothing inside the loops.
pub trait Isa: 'static {
    /// Whether the kernels may use `vpdpbusd`/`vpdpwssd`.
    const VNNI: bool;
}

/// x86-64-v3: AVX2, FMA, F16C (what the binary requires).
pub enum Avx2 {}

/// x86-64-v3 and AVX512-VNNI with AVX512VL (run only where [`detected`] says so).
pub enum Vnni {}

impl Isa for Avx2 {
    const VNNI: bool = false;
}

impl Isa for Vnni {
    const VNNI: bool = true;
}

/// An instruction set by name, as `--kernels` takes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Choice {
    /// The x86-64-v3 kernels, on every CPU.
    Avx2,
    /// The VNNI kernels (only where the CPU has them).
    Vnni,
}

impl std::fmt::Display for Choice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Choice::Avx2 => "avx2",
            Choice::Vnni => "vnni",
        })
    }
}

/// The best set this CPU runs.
pub fn detected() -> Choice {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512vnni")
        && std::arch::is_x86_feature_detected!("avx512vl")
    {
        return Choice::Vnni;
    }
    Choice::Avx2
}

/// 0: not chosen yet; otherwise `1 + Choice as u8`.
static SELECTED: AtomicU8 = AtomicU8::new(0);

/// The set the matmuls run with: [`select`]'s, or else [`detected`]'s (detected on first use).
#[inline]
pub fn selected() -> Choice {
    #[cfg(test)]
    if let Some(forced) = FORCED.get() {
        return forced;
    }
    match SELECTED.load(Ordering::Relaxed) {
        1 => Choice::Avx2,
        2 => Choice::Vnni,
        _ => {
            let best = detected();
            SELECTED.store(1 + best as u8, Ordering::Relaxed);
            best
        }
    }
}

/// A kernel set this CPU cannot run.
#[derive(Debug, thiserror::Error)]
#[error(
    "--kernels {0}: this CPU lacks AVX512-VNNI with AVX512VL (Intel Cascade Lake, AMD Zen 4 and \
     later have them); use --kernels avx2 or leave the flag out"
)]
pub struct Unsupported(pub Choice);

/// Makes every later matmul run with `choice`, for the whole process (`--kernels`; tests and
/// benches compare the sets). Refuses a set the CPU lacks, naming it, so that a flag can never
/// turn into SIGILL.
pub fn select(choice: Choice) -> Result<(), Unsupported> {
    if choice == Choice::Vnni && detected() != Choice::Vnni {
        return Err(Unsupported(choice));
    }
    SELECTED.store(1 + choice as u8, Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
thread_local! {
    /// The unit tests' choice for their own thread ([`forced`]), so tests that compare the sets
    /// can run beside the others.
    static FORCED: std::cell::Cell<Option<Choice>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the matmuls of this thread on `choice` (unit tests only; the caller checks
/// that the CPU has it).
#[cfg(test)]
pub fn forced<T>(choice: Choice, f: impl FnOnce() -> T) -> T {
    let before = FORCED.replace(Some(choice));
    let out = f();
    FORCED.set(before);
    out
}

/// Runs `$body` with the type `$I` naming the selected [`Isa`] (the body is compiled for both).
macro_rules! with_isa {
    ($I:ident => $body:expr) => {
        match $crate::quant::isa::selected() {
            $crate::quant::isa::Choice::Avx2 => {
                type $I = $crate::quant::isa::Avx2;
                $body
            }
            $crate::quant::isa::Choice::Vnni => {
                type $I = $crate::quant::isa::Vnni;
                $body
            }
        }
    };
}
pub(crate) use with_isa;
