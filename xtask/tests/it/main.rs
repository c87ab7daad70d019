//! xtask's integration tests: the model fetch against a local HTTP server and nix/model.nix's
//! source, the 1B profile against the planner, the OCI upload against a strict stand-in CLI, the
//! Nix package's source, the deploy/oci/ configuration against the OCI provider's documented
//! names, the server's dependency features alone against the workspace's, `vm-test`'s argument
//! checks, and the tree's hygiene (tidy).
//! `autotests = false`: every integration test of this crate is a module of this one binary,
//! so the crate's dependencies are linked once.

mod deploy_oci;
mod feature_unification;
mod model_fetch;
mod nix_model;
mod nix_package;
mod oci_upload;
mod profile_1b;
mod tidy;
mod vm_test_args;
