//! Link arguments of the sandbox wasm artifact only:
//! - an 8 MiB stack: Boa's parser needs ~10 KiB of Rust stack per nesting level, and the
//!   default 1 MiB stack aborts the instance on deeply nested source;
//! - an imported memory, so the Worker host supplies a `WebAssembly.Memory` whose `maximum`
//!   is the configured `memoryMB` (enforced, not nominal); the module itself declares a 16 MiB
//!   minimum (stack + data + the frozen realm) and the 4 GiB wasm32 ceiling as its maximum.

fn main() {
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if target_arch == "wasm32" && std::env::var_os("CARGO_FEATURE_WASM_SANDBOX").is_some() {
        println!("cargo:rustc-link-arg-cdylib=-zstack-size=8388608");
        println!("cargo:rustc-link-arg-cdylib=--import-memory");
        println!("cargo:rustc-link-arg-cdylib=--initial-memory=16777216");
        println!("cargo:rustc-link-arg-cdylib=--max-memory=4294967296");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
