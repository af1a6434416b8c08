//! The thin wasm-bindgen layer: one file per artifact (DESIGN decision 2).
#[cfg(feature = "wasm-sandbox")]
mod sandbox;
