//! Crucible: an agent runtime core — the model → tool calls → model loop, tool validation,
//! typed events, and the sandbox/store boundaries — written host-agnostic (DESIGN decision 1)
//! and compiled natively for tests and to wasm32 for the npm package.
#![warn(rust_2018_idioms, missing_debug_implementations)]

pub mod agent;
pub mod forge;
mod guard;
mod js_json;
pub mod model;
pub mod registry;
pub mod sandbox;
pub mod store;
pub mod tools;

#[cfg(feature = "wasm")]
mod wasm;
