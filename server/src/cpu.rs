//! The start-up CPU check. The binary is compiled for x86-64-v3 (AVX2, FMA, F16C, BMI1/2); on an
//! older CPU the first such instruction would kill it with SIGILL, and systemd would restart it
//! forever.
//!
//! The check cannot be Rust code: with `-C target-cpu=x86-64-v3` the compiler treats those
//! features as given, folds `is_x86_feature_detected!` to `true`, and may emit AVX or BMI
//! instructions in any function, the check's own included. So it is a few lines of assembly in
//! `.init_array` (the binary's `cpu_guard` module), run by the C runtime before Rust's `main`: CPUID (leaves 1 and 7) and XGETBV
//! (the OS saves YMM state), and on a miss a message written with the `write` system call and
//! `exit_group` with [`crate::exit::Status::CpuUnsupported`], one of the statuses systemd is told
//! not to restart on.

/// The message on standard error, also checked by the VM test.
pub const MESSAGE: &str = "llm-server: this CPU lacks AVX2, FMA, F16C or BMI1/BMI2, which this \
x86-64-v3 build needs (Intel Haswell or AMD Zen and later). Run it on such a CPU (OCI \
VM.Standard.E2.1.Micro has them; in QEMU use -cpu max or -cpu host).\n";
