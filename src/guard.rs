//! A drop guard: what must happen if the scope holding it ends early (a lock to release, a JS
//! operation the core stopped waiting for to close or cancel), unless it was disarmed.

/// Runs its action when dropped, unless [`OnDrop::disarm`] was called.
pub(crate) struct OnDrop(Option<Box<dyn FnOnce()>>);

impl OnDrop {
    pub(crate) fn new(action: impl FnOnce() + 'static) -> Self {
        Self(Some(Box::new(action)))
    }

    /// A guard with nothing to do.
    #[cfg_attr(not(feature = "wasm-core"), allow(dead_code))]
    pub(crate) fn none() -> Self {
        Self(None)
    }

    /// The action is no longer needed (the operation settled).
    #[cfg_attr(not(feature = "wasm-core"), allow(dead_code))]
    pub(crate) fn disarm(&mut self) {
        self.0 = None;
    }

    pub(crate) fn armed(&self) -> bool {
        self.0.is_some()
    }
}

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(action) = self.0.take() {
            action();
        }
    }
}
