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

/// Most other epochs a session remembers what it took from (`SessionHistory::absorbed`).
const MAX_ABSORBED_EPOCHS: usize = 16;

/// Where a run started in its session's conversation, as recorded in its state: the first
/// `len` of its messages were the session's from position `offset` of the conversation counted
/// by the agent instance `epoch` (`None` in states saved before it was recorded).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunStart<'a> {
    pub(crate) len: usize,
    pub(crate) offset: u64,
    pub(crate) epoch: Option<&'a str>,
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
    /// Positions are counted by one agent instance (its epoch): a process that restarts counts
    /// afresh, so an offset recorded by another epoch says nothing about these messages.
    dropped: u64,
    /// For each other epoch whose runs completed here (resumed after a restart): the position
    /// of that epoch's conversation up to which its messages were added, so a second of its
    /// runs adds only those the first did not bring. At most [`MAX_ABSORBED_EPOCHS`], oldest
    /// first: epochs come from run states, and a long-lived session sees one per restart.
    absorbed: Vec<(String, u64)>,
}

impl SessionHistory {
    pub(crate) fn messages(&self) -> &[Message] {
        &self.messages
    }

    pub(crate) fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Adds a completed run's messages: `messages` is its whole conversation, of which the
    /// first `start.len` were the session's when it started (`None`: not known, from a state
    /// saved before they were recorded: its conversation becomes the session's). `epoch` is
    /// this agent instance's.
    ///
    /// A run started by this epoch continues the session: when the messages it started from
    /// that are still kept are still here, its own follow the session's (other runs may have
    /// completed meanwhile); otherwise (a state handed back that does not fit) its
    /// conversation becomes the session's. A run started by another epoch (before a restart)
    /// cannot be placed by position: what this session holds stays, and the run's conversation
    /// follows it, without the messages of its epoch that an earlier such run brought nor the
    /// leading ones this session holds already (see `held_prefix`). Then
    /// trims to `limits`, never into the run's own messages.
    pub(crate) fn add_run(&mut self, messages: &[Message], start: Option<RunStart<'_>>, epoch: &str, limits: &HistoryLimits) {
        let (start_len, offset) = start.map_or((0, 0), |s| (s.len.min(messages.len()), s.offset));
        // Where exchanges began in messages not added here before is not recorded: each user
        // message is taken for a start (a retry's reminder may be cut before).
        let user = |_: usize, message: &Message| matches!(message, Message::User { .. });
        match start {
            Some(RunStart { epoch: Some(own), .. }) if own == epoch => {
                let continues = self.dropped >= offset && {
                    let gone = usize::try_from(self.dropped - offset).unwrap_or(usize::MAX).min(start_len);
                    let still_kept = &messages[gone..start_len];
                    self.messages.get(..still_kept.len()) == Some(still_kept)
                };
                if !continues {
                    *self = Self { dropped: offset, ..Self::default() };
                    self.extend(&messages[..start_len], user);
                }
            }
            Some(RunStart { epoch: other, .. }) => {
                // A state saved before epochs were recorded does not say which process counted
                // its positions (two processes' runs each start at 0): only what this session
                // holds already tells what another such run brought.
                let brought = other.map_or(0, |other| {
                    let end = offset.saturating_add(start_len as u64);
                    match self.absorbed.iter_mut().find(|(e, _)| e == other) {
                        Some((_, to)) => std::mem::replace(to, end.max(*to)),
                        None => {
                            // Each restart (and each state handed back) may name another: the
                            // oldest is forgotten first, and a late run of its epoch is left to
                            // `held_prefix` below.
                            if self.absorbed.len() == MAX_ABSORBED_EPOCHS {
                                self.absorbed.remove(0);
                            }
                            self.absorbed.push((other.to_string(), end));
                            0
                        }
                    }
                });
                let skip = usize::try_from(brought.saturating_sub(offset)).unwrap_or(usize::MAX).min(start_len);
                let skip = skip + self.held_prefix(&messages[skip..start_len]);
                self.extend(&messages[skip..start_len], user);
            }
            None => *self = Self::default(),
        }
        let own_start = self.messages.len();
        // The run's own messages are one exchange: its input, then all that followed it. (With
        // no start recorded they are its whole conversation, older exchanges first.)
        let known = start.is_some();
        self.extend(&messages[start_len..], |i, message| if known { i == 0 } else { user(i, message) });
        self.trim(limits, own_start);
    }

    /// How many leading messages of `run` this session holds in a row from the start of one of
    /// its exchanges. A run handed over by another agent instance on the same store (a second
    /// tab resuming it) started from a conversation both sessions hold, and positions counted
    /// by the other instance cannot tell which part: without this it came twice. Only whole
    /// exchanges count: a match that stops inside one (the same input and call, another result:
    /// a session that ran the same input again after a restart) holds none of that exchange, or
    /// its tool results would follow the session's call, without their own.
    fn held_prefix(&self, run: &[Message]) -> usize {
        let Some(first) = run.first() else { return 0 };
        (0..self.messages.len())
            .filter(|&i| self.starts[i] && self.messages[i] == *first)
            .map(|i| {
                let matched = self.messages[i..].iter().zip(run).take_while(|(held, brought)| held == brought).count();
                (0..=matched).rev().find(|&k| i + k == self.messages.len() || self.starts[i + k]).unwrap_or(0)
            })
            .max()
            .unwrap_or(0)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ToolCall;

    fn call(id: &str) -> Message {
        Message::Assistant {
            content: String::new(),
            tool_calls: vec![ToolCall { id: id.into(), name: "get_time".into(), arguments: "{}".into(), provider_data: None }],
        }
    }

    fn result(id: &str, content: &str) -> Message {
        Message::Tool { tool_call_id: id.into(), name: "get_time".into(), content: content.into(), is_error: false }
    }

    #[test]
    fn a_run_of_another_epoch_that_matches_the_session_inside_an_exchange_brings_that_exchange_whole() {
        let limits = HistoryLimits::default();
        let mut history = SessionHistory::default();
        // Since the restart the session ran the same input: same call id (numbered per answer),
        // another result.
        let now = [
            Message::User { content: "what time is it?".into() },
            call("call_0"),
            result("call_0", "{\"t\":2}"),
            Message::Assistant { content: "2".into(), tool_calls: vec![] },
        ];
        history.add_run(&now, Some(RunStart { len: 0, offset: 0, epoch: Some("this") }), "this", &limits);
        // A run paused before the restart started from that input's first answer.
        let before = [
            Message::User { content: "what time is it?".into() },
            call("call_0"),
            result("call_0", "{\"t\":1}"),
            Message::Assistant { content: "1".into(), tool_calls: vec![] },
        ];
        let run: Vec<Message> = before.iter().cloned().chain([Message::User { content: "refund".into() }]).collect();
        history.add_run(&run, Some(RunStart { len: before.len(), offset: 0, epoch: Some("before-restart") }), "this", &limits);
        let held = history.messages();
        for (i, message) in held.iter().enumerate() {
            if let Message::Tool { tool_call_id, .. } = message {
                assert!(
                    matches!(&held[i - 1], Message::Assistant { tool_calls, .. } if tool_calls.iter().any(|c| c.id == *tool_call_id))
                        || matches!(&held[i - 1], Message::Tool { .. }),
                    "a result right after its call: {held:?}"
                );
            }
        }
        assert_eq!(held.len(), now.len() + run.len(), "the earlier exchange comes whole, after the session's");
    }

    #[test]
    fn a_session_remembers_a_bounded_number_of_other_epochs() {
        let mut history = SessionHistory::default();
        let limits = HistoryLimits::default();
        for n in 0..(MAX_ABSORBED_EPOCHS * 4) {
            let run = [Message::User { content: format!("before {n}") }, Message::User { content: format!("run {n}") }];
            let epoch = format!("process-{n}");
            history.add_run(&run, Some(RunStart { len: 1, offset: 0, epoch: Some(&epoch) }), "this", &limits);
        }
        assert_eq!(history.absorbed.len(), MAX_ABSORBED_EPOCHS);
        assert_eq!(history.absorbed[0].0, format!("process-{}", MAX_ABSORBED_EPOCHS * 3), "the oldest are forgotten");
        assert_eq!(history.messages().len(), MAX_ABSORBED_EPOCHS * 4 * 2, "every run brought its conversation");
    }
}
