//! A session's conversation, kept within a bound. Every agent of a process shares the one wasm
//! memory, and each run copies its session's whole conversation: a session left to grow slows
//! every run of it and, once an allocation fails, breaks the core for every agent.

use serde::{Deserialize, Serialize};

use crate::model::Message;

/// The most JSON bytes of a session's conversation kept by default (8 MiB).
pub const DEFAULT_HISTORY_MAX_BYTES: u64 = 8 * 1024 * 1024;

/// How much of each session's conversation an agent keeps (`sessionHistory`). Past either
/// bound, the oldest whole exchanges (a run's input and all that followed it) are dropped when
/// a run completes; the run's own exchange is kept whole even when it alone is larger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct HistoryLimits {
    /// Most messages kept; absent: no count bound.
    pub max_messages: Option<u32>,
    /// Most bytes of the messages as JSON (default [`DEFAULT_HISTORY_MAX_BYTES`]).
    pub max_bytes: u64,
}

impl Default for HistoryLimits {
    fn default() -> Self {
        Self { max_messages: None, max_bytes: DEFAULT_HISTORY_MAX_BYTES }
    }
}

impl HistoryLimits {
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.max_bytes == 0 {
            return Err("sessionHistory.maxBytes must be at least 1".into());
        }
        if self.max_messages == Some(0) {
            return Err("sessionHistory.maxMessages must be at least 1".into());
        }
        Ok(())
    }

    fn exceeded_by(&self, messages: usize, bytes: u64) -> bool {
        bytes > self.max_bytes || self.max_messages.is_some_and(|max| messages > max as usize)
    }
}

/// A session's kept messages, each with its JSON size (measured once, when it is added), so
/// the bound is checked without serializing the conversation.
#[derive(Debug, Default)]
pub(crate) struct SessionHistory {
    messages: Vec<Message>,
    sizes: Vec<u64>,
    /// Whether each message begins an exchange (a run's input): the only places a trim may
    /// cut. Not every user message does: a structured-output retry's reminder is one, in the
    /// middle of its run's exchange.
    starts: Vec<bool>,
    bytes: u64,
    /// Messages dropped from the front so far: the kept ones start at this position of the
    /// session's whole conversation. A run records it at its start (`RunState::history_offset`),
    /// so it can tell, when it completes, which of the messages it started from are still kept.
    dropped: u64,
}

impl SessionHistory {
    pub(crate) fn messages(&self) -> &[Message] {
        &self.messages
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Adds a completed run's messages: `messages` is its whole conversation, of which the
    /// first `start_len` were the session's from position `offset` when it started (`None`: not
    /// known, from a state saved before they were recorded). When those still kept are still
    /// here, its own messages follow the session's (other runs may have completed meanwhile);
    /// otherwise (a resume after a restart) its conversation becomes the session's. Then trims
    /// to `limits`, never into the run's own messages.
    pub(crate) fn add_run(&mut self, messages: &[Message], start: Option<(usize, u64)>, limits: &HistoryLimits) {
        let (start_len, offset) = start.map_or((0, 0), |(len, offset)| (len.min(messages.len()), offset));
        let continues = start.is_some() && self.dropped >= offset && {
            let gone = usize::try_from(self.dropped - offset).unwrap_or(usize::MAX).min(start_len);
            let still_kept = &messages[gone..start_len];
            self.messages.get(..still_kept.len()) == Some(still_kept)
        };
        // Where exchanges began in messages not added here before is not recorded: each user
        // message is taken for a start (a retry's reminder may be cut before).
        let user = |_: usize, message: &Message| matches!(message, Message::User { .. });
        if !continues {
            *self = Self { dropped: offset, ..Self::default() };
            self.extend(&messages[..start_len], user);
        }
        let own_start = self.messages.len();
        // The run's own messages are one exchange: its input, then all that followed it. (With
        // no start recorded they are its whole conversation, older exchanges first.)
        let known = start.is_some();
        self.extend(&messages[start_len..], |i, message| if known { i == 0 } else { user(i, message) });
        self.trim(limits, own_start);
    }

    /// Adds `messages`; `starts(i, message)` says whether the `i`-th begins an exchange.
    fn extend(&mut self, messages: &[Message], starts: impl Fn(usize, &Message) -> bool) {
        for (i, message) in messages.iter().enumerate() {
            let size = crate::tools::json_len(message) as u64;
            self.bytes += size;
            self.sizes.push(size);
            self.starts.push(starts(i, message));
            self.messages.push(message.clone());
        }
    }

    /// Drops the fewest oldest exchanges that bring the history within `limits`, cutting only
    /// before an exchange's start at or before `keep_from`: a tool result is never left without
    /// the assistant message that called it (both are in the same exchange), and the messages
    /// from `keep_from` on stay. When no cut is enough, the last one allowed is made.
    fn trim(&mut self, limits: &HistoryLimits, keep_from: usize) {
        if !limits.exceeded_by(self.messages.len(), self.bytes) {
            return;
        }
        let mut cut = 0;
        let mut removed = 0;
        let mut removed_before = 0;
        for i in 1..=keep_from.min(self.messages.len().saturating_sub(1)) {
            removed_before += self.sizes[i - 1];
            if !self.starts[i] {
                continue;
            }
            cut = i;
            removed = removed_before;
            if !limits.exceeded_by(self.messages.len() - i, self.bytes - removed) {
                break;
            }
        }
        self.messages.drain(..cut);
        self.sizes.drain(..cut);
        self.starts.drain(..cut);
        self.bytes -= removed;
        // Saturating: the offset a run started from comes back in its state, which a caller
        // may hand back with any value.
        self.dropped = self.dropped.saturating_add(cut as u64);
    }
}
