//! The LLM appliance's policy. One profile (`profiles/*.toml`) holds every value; [`render`]
//! turns it into the files an image installs, and [`doctor`] checks a booted box against it.

pub mod cidr;
pub mod doctor;
pub mod plan;
pub mod profile;
pub mod render;

pub use profile::Profile;
