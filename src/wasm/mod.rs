//! The thin wasm-bindgen layer (DESIGN decision 1): exported classes and the adapters that
//! turn JS objects into the core's traits. No logic of its own lives here.

#[cfg(feature = "wasm-core")]
mod core;
#[cfg(feature = "wasm-core")]
mod emergent;
#[cfg(feature = "wasm-core")]
mod interop;
