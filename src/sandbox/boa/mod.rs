//! The Boa runner: forged JavaScript in a hardened, reused realm (DESIGN decision 3).
//!
//! Rooms: `validate` (static checks with Boa's parser), `realm` (hardened, frozen context),
//! `convert` (bounded JSON conversion both ways), `jobs` (budgeted job executor), `host_api`
//! (console, crypto, the fetch bridge), `runner` ([`BoaRunner`]).

mod clock;
mod convert;
mod host_api;
mod jobs;
mod realm;
mod runner;
mod validate;

pub use host_api::{FetchFuture, FetchHost, FetchRequest, FetchResponse, NoFetch};
pub use runner::{BoaRunner, SandboxLimits};
pub use validate::Rejection;
