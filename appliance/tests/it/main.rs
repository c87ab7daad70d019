//! The appliance's integration tests: the profile, its rendered files (Debian and NixOS sides),
//! the doctor, the first-boot secrets and the server's memory plan.
//! `autotests = false`: every integration test of this crate is a module of this one binary,
//! so the crate's dependencies are linked once.

mod common;
mod doctor;
mod meters;
mod nix_initrd;
mod nix_profile;
mod profile;
mod render;
mod secrets;
mod server_plan;
