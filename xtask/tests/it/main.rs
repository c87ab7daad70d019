//! xtask's integration tests: the OCI upload against a stand-in CLI and the Nix package's source.
//! `autotests = false`: every integration test of this crate is a module of this one binary,
//! so the crate's dependencies are linked once.

mod nix_package;
mod oci_upload;
