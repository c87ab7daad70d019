//! The LLM appliance's policy. One profile (`profiles/*.toml`) holds every value; [`render`]
//! turns it into the files an image installs, and [`doctor`] checks a booted box against it.
//! The server's memory is not estimated here: [`plan`] reads the server's own plan of the model
//! file, which the profile's limits are held to ([`Profile::check_plan`]).
//!
//! Modules depend downwards only: [`paths`], [`cidr`] and [`plan`] on nothing; [`profile`] on
//! those; [`render`] and [`doctor`] on the profile.

pub mod cidr;
pub mod doctor;
pub mod paths;
pub mod plan;
pub mod profile;
pub mod render;

pub use profile::Profile;
