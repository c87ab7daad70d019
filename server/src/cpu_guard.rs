//! The CPU guard itself (see `llm_server::cpu` for why it is assembly). It lives in the binary
//! crate because only the binary's own objects are always linked; a library object that nothing
//! references, and its `.init_array` entry with it, could be dropped.

use llm_server::cpu::MESSAGE;
use llm_server::exit::Status;

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
std::arch::global_asm!(
    // Leaf 1 ECX: FMA (12), OSXSAVE (27), AVX (28), F16C (29).
    ".equ LLM_LEAF1_ECX, (1 << 12) | (1 << 27) | (1 << 28) | (1 << 29)",
    // Leaf 7 EBX: BMI1 (3), AVX2 (5), BMI2 (8).
    ".equ LLM_LEAF7_EBX, (1 << 3) | (1 << 5) | (1 << 8)",
    ".pushsection .text.llm_server_cpu_guard,\"ax\",@progbits",
    ".p2align 4",
    "llm_server_cpu_guard:",
    "    push rbx", // CPUID clobbers RBX, which the caller keeps
    "    xor eax, eax",
    "    xor ecx, ecx",
    "    cpuid",
    "    cmp eax, 7",
    "    jb 2f",
    "    mov eax, 1",
    "    xor ecx, ecx",
    "    cpuid",
    "    and ecx, LLM_LEAF1_ECX",
    "    cmp ecx, LLM_LEAF1_ECX",
    "    jne 2f",
    "    xor ecx, ecx",
    "    xgetbv", // XCR0: the OS saves SSE (bit 1) and AVX (bit 2) state
    "    and eax, 6",
    "    cmp eax, 6",
    "    jne 2f",
    "    mov eax, 7",
    "    xor ecx, ecx",
    "    cpuid",
    "    and ebx, LLM_LEAF7_EBX",
    "    cmp ebx, LLM_LEAF7_EBX",
    "    jne 2f",
    "    pop rbx",
    "    ret",
    "2:",
    "    mov eax, 1", // write(2, message, length)
    "    mov edi, 2",
    "    lea rsi, [rip + {message}]",
    "    mov edx, {length}",
    "    syscall",
    "    mov eax, 231", // exit_group(status)
    "    mov edi, {status}",
    "    syscall",
    "    ud2",
    ".popsection",
    ".pushsection .init_array,\"aw\"",
    ".p2align 3",
    ".quad llm_server_cpu_guard",
    ".popsection",
    message = sym MESSAGE_BYTES,
    length = const MESSAGE.len(),
    status = const Status::CpuUnsupported.code(),
);

/// The message as a static the assembly can address.
#[used]
static MESSAGE_BYTES: [u8; MESSAGE.len()] = {
    let mut out = [0u8; MESSAGE.len()];
    let bytes = MESSAGE.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        out[i] = bytes[i];
        i += 1;
    }
    out
};
