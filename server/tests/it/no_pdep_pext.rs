//! The built binary contains no PDEP or PEXT: they are microcoded on Zen 1 and Zen 2 (tens to
//! hundreds of cycles each, against one cycle on Intel and Zen 3+), and the appliance's E2.1.Micro
//! is a Zen 1 EPYC 7551. `-C target-cpu=x86-64-v3` enables BMI2, so LLVM may pick them for bit
//! scatter/gather code (a `_pdep_u32` intrinsic, or some shift-and-mask patterns): this
//! disassembles the binary (`objdump` from binutils) and fails on any.
//! Run under `--release` (as `cargo xtask test` does), it checks the binary that ships.

use std::process::Command;

#[test]
fn the_binary_has_no_pdep_or_pext() {
    let bin = env!("CARGO_BIN_EXE_llm-server");
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", bin])
        .output()
        .unwrap_or_else(|e| panic!("objdump (Debian package binutils) failed to start: {e}"));
    assert!(
        out.status.success(),
        "objdump -d {bin} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // objdump prints a mnemonic after the address and a tab: "  4012a0:\tpdep   %eax,%ebx,%ecx".
    let is_mnemonic = |line: &str, m: &str| {
        line.split('\t')
            .nth(1)
            .is_some_and(|insn| insn.split_whitespace().next() == Some(m))
    };
    assert!(is_mnemonic("  4012a0:\tpdep   %eax,%ebx,%ecx", "pdep"));
    assert!(!is_mnemonic("  4012a0:\tcall   4011f0 <pdep_like>", "pdep"));
    let mut function = "";
    let mut hits = Vec::new();
    for line in text.lines() {
        if line.ends_with(">:") {
            function = line;
        } else if is_mnemonic(line, "pdep") || is_mnemonic(line, "pext") {
            hits.push(format!("{function} {line}"));
        }
    }
    // The disassembly must be of real code, or the check proves nothing.
    assert!(
        text.lines()
            .filter(|l| is_mnemonic(l, "vpmaddubsw"))
            .count()
            > 0,
        "no vpmaddubsw in {bin}: is this the x86-64-v3 build?"
    );
    assert!(hits.is_empty(), "PDEP/PEXT in {bin}:\n{}", hits.join("\n"));
}
