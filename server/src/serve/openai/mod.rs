//! The bodies of the OpenAI API: requests as the official SDKs send them, responses as they
//! parse them.

mod one_or_list;
mod request;
mod response;
pub mod responses;
pub mod tools;

pub use request::*;
pub use response::*;
