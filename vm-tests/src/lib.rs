//! The VM suite's library part: the QEMU launcher, shared with `cargo xtask image --smoke` so
//! both boot the image one way, and the names of the checks, which `cargo xtask vm-test`
//! holds `--only` to before it builds anything.

pub mod check_names;
pub mod qemu;
