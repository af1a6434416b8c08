//! Gives the sandbox wasm artifact a larger stack: Boa's parser needs ~10 KiB of Rust stack
//! per nesting level, and the default 1 MiB stack aborts the instance on deeply nested source.

fn main() {
    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    if target_arch == "wasm32" && std::env::var_os("CARGO_FEATURE_WASM_SANDBOX").is_some() {
        println!("cargo:rustc-link-arg-cdylib=-zstack-size=8388608");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
