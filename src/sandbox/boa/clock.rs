//! A monotonic millisecond clock that works natively and in wasm32-unknown-unknown (where
//! `std::time::Instant` panics).

#[cfg(all(target_arch = "wasm32", feature = "wasm"))]
pub(crate) fn now_ms() -> f64 {
    js_sys::Date::now()
}

#[cfg(not(all(target_arch = "wasm32", feature = "wasm")))]
pub(crate) fn now_ms() -> f64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_secs_f64() * 1000.0
}
