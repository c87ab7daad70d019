//! The LLM appliance's policy. One profile (`profiles/*.toml`) holds every value; [`render`]
//! turns it into the files an image installs, and [`doctor`] checks a booted box against it.
//! The server's memory is not estimated here: [`plan`] reads the server's own plan of the model
//! file, which the profile's memory policy is resolved against ([`Profile::memory_limits`]).
//!
//! [`secrets`] provisions the API keys and the TLS certificate on the box; [`tls`] knows the
//! certificate as a client sees it (its fingerprint, a client pinned to it).
//!
//! Modules depend downwards only: [`paths`], [`cidr`], [`plan`] and [`tls`] on nothing;
//! [`profile`] on those; [`render`], [`secrets`] and [`doctor`] on the profile.

pub mod cidr;
pub mod doctor;
pub mod paths;
pub mod plan;
pub mod profile;
pub mod render;
pub mod secrets;
pub mod tls;

pub use profile::Profile;
