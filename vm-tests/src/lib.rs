//! The VM suite's library part: the QEMU launcher, shared with `cargo xtask image --smoke` so
//! both boot the image one way.

pub mod qemu;
