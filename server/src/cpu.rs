//! The start-up CPU check. The binary is compiled for x86-64-v3; on an older CPU the first AVX2
//! instruction would kill it with SIGILL, so `main` asks first and refuses with a message.

/// The features x86-64-v3 code relies on, as `is_x86_feature_detected!` names them.
pub const REQUIRED: [&str; 5] = ["avx", "avx2", "fma", "f16c", "bmi2"];

/// `Err` with a message naming the missing features and the fix, when this CPU lacks any.
pub fn check() -> Result<(), String> {
    let missing = missing_features();
    if missing.is_empty() {
        return Ok(());
    }
    Err(format!(
        "this CPU lacks {} which this x86-64-v3 build needs (AVX2, FMA, F16C, BMI2: Intel Haswell \
         or AMD Zen and later). Run it on such a CPU (OCI VM.Standard.E2.1.Micro has them; in QEMU \
         use -cpu max or -cpu host).",
        missing.join(", ")
    ))
}

#[cfg(target_arch = "x86_64")]
fn missing_features() -> Vec<&'static str> {
    let have = [
        std::arch::is_x86_feature_detected!("avx"),
        std::arch::is_x86_feature_detected!("avx2"),
        std::arch::is_x86_feature_detected!("fma"),
        std::arch::is_x86_feature_detected!("f16c"),
        std::arch::is_x86_feature_detected!("bmi2"),
    ];
    REQUIRED
        .iter()
        .zip(have)
        .filter(|(_, ok)| !ok)
        .map(|(n, _)| *n)
        .collect()
}

#[cfg(not(target_arch = "x86_64"))]
fn missing_features() -> Vec<&'static str> {
    vec!["an x86-64 processor"]
}
