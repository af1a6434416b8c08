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

/// Work going on per session (an agent's runs, a registry's forges) and whether its session
/// ended meanwhile: work that finishes after its session ended must not bring the session back.
#[derive(Default)]
pub(crate) struct SessionWork(std::rc::Rc<std::cell::RefCell<WorkGoing>>);

#[derive(Default)]
struct WorkGoing {
    next: u64,
    /// By ticket: the session, and whether it ended.
    going: std::collections::HashMap<u64, (String, bool)>,
}

impl SessionWork {
    /// Counts work of `session` as going until the ticket is dropped, however it ends.
    pub(crate) fn begin(&self, session: &str) -> SessionTicket {
        let mut work = self.0.borrow_mut();
        let id = work.next;
        work.next += 1;
        work.going.insert(id, (session.to_string(), false));
        SessionTicket { work: std::rc::Rc::downgrade(&self.0), id }
    }

    /// `session` ended: its work going now will find so.
    pub(crate) fn end(&self, session: &str) {
        for (s, ended) in self.0.borrow_mut().going.values_mut() {
            if s == session {
                *ended = true;
            }
        }
    }
}

/// One piece of work of [`SessionWork`].
pub(crate) struct SessionTicket {
    work: std::rc::Weak<std::cell::RefCell<WorkGoing>>,
    id: u64,
}

impl SessionTicket {
    /// Whether the session ended while this work was going.
    pub(crate) fn session_ended(&self) -> bool {
        self.work.upgrade().is_some_and(|work| work.borrow().going.get(&self.id).is_some_and(|(_, ended)| *ended))
    }
}

impl Drop for SessionTicket {
    fn drop(&mut self) {
        if let Some(work) = self.work.upgrade() {
            work.borrow_mut().going.remove(&self.id);
        }
    }
}

/// Tickets kept past the work that took them, by id, for work that goes on later (a run left
/// resumable goes on when resumed). The oldest are dropped first past `cap`.
pub(crate) struct KeptTickets {
    cap: usize,
    next: u64,
    /// By id: when it was kept, and the ticket.
    kept: std::collections::HashMap<String, (u64, SessionTicket)>,
    /// (when, id) in the order kept; entries whose id was taken (or kept again) since are
    /// skipped when the oldest goes.
    order: std::collections::VecDeque<(u64, String)>,
}

impl KeptTickets {
    pub(crate) fn new(cap: usize) -> Self {
        Self { cap, next: 0, kept: Default::default(), order: Default::default() }
    }

    pub(crate) fn keep(&mut self, id: String, ticket: SessionTicket) {
        let when = self.next;
        self.next += 1;
        self.kept.insert(id.clone(), (when, ticket));
        self.order.push_back((when, id));
        while self.kept.len() > self.cap {
            let Some((when, oldest)) = self.order.pop_front() else { break };
            if self.kept.get(&oldest).is_some_and(|(kept_when, _)| *kept_when == when) {
                self.kept.remove(&oldest);
            }
        }
        // Entries of taken ids stay in `order` until the oldest go: dropped once they pile up.
        if self.order.len() > 2 * self.cap {
            let kept = &self.kept;
            self.order.retain(|(when, id)| kept.get(id).is_some_and(|(kept_when, _)| kept_when == when));
        }
    }

    /// The ticket kept under `id` (looked up on every run's start: most have none).
    pub(crate) fn take(&mut self, id: &str) -> Option<SessionTicket> {
        self.kept.remove(id).map(|(_, ticket)| ticket)
    }
}

#[cfg(test)]
mod tests {
    use super::{KeptTickets, SessionWork};

    #[test]
    fn kept_tickets_drop_the_oldest_past_their_cap_and_a_ticket_kept_again_counts_as_new() {
        let work = SessionWork::default();
        let mut kept = KeptTickets::new(2);
        kept.keep("a".into(), work.begin("s"));
        kept.keep("b".into(), work.begin("s"));
        assert!(kept.take("a").is_some());
        kept.keep("c".into(), work.begin("s"));
        kept.keep("a".into(), work.begin("s"));
        kept.keep("d".into(), work.begin("s"));
        assert!(kept.take("b").is_none() && kept.take("c").is_none(), "the oldest went first");
        assert!(kept.take("a").is_some() && kept.take("d").is_some(), "a, kept again, is among the newest");
    }
}
