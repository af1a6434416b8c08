//! The thin wasm-bindgen layer (DESIGN decision 1): exported classes and the adapters that
//! turn JS objects into the core's traits, one set per artifact (DESIGN decision 2). No logic
//! of its own lives here.

#[cfg(feature = "wasm-core")]
mod core;
#[cfg(feature = "wasm-core")]
mod emergent;
#[cfg(feature = "wasm-core")]
mod interop;
#[cfg(feature = "wasm-sandbox")]
mod sandbox;
