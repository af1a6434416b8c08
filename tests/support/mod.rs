//! Test doubles for the core: a scripted model (replays canned responses, records requests)
//! and simple tool handlers. Named as doubles; nothing here is an LLM.
#![allow(dead_code)]

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use async_trait::async_trait;
use crucible::agent::CancelFlag;
use crucible::model::{CallInfo, ChunkSink, Model, ModelChunk, ModelError, ModelRequest, Usage};
use crucible::tools::{CallContext, ToolFailure, ToolHandler};
use serde_json::Value;

/// One scripted model response.
#[derive(Debug, Clone)]
pub enum Reply {
    Text(String),
    /// Text whose answer ended for this provider finish reason (`length`, `end_turn`, …).
    TextEnding(String, String),
    /// (name, raw arguments JSON)
    Calls(Vec<(String, String)>),
    /// Calls whose answer stopped at the token limit (finish reason `length`).
    CutOff(Vec<(String, String)>),
    /// One call and the provider value it carries, given in a piece of its own after the
    /// arguments (as `openai()` gives DeepSeek's reasoning, known only once the answer ends).
    CallWithData(String, String, Value),
    Fail(ModelError),
}

pub fn text(s: &str) -> Reply {
    Reply::Text(s.to_string())
}

pub fn text_ending(s: &str, finish_reason: &str) -> Reply {
    Reply::TextEnding(s.to_string(), finish_reason.to_string())
}

pub fn call(name: &str, args: &str) -> Reply {
    Reply::Calls(vec![(name.to_string(), args.to_string())])
}

/// `list` as an answer that hit the token limit: its last call's arguments are as cut.
pub fn cut_off(list: &[(&str, &str)]) -> Reply {
    Reply::CutOff(list.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect())
}

/// A call whose provider wants `data` back with it (see [`Reply::CallWithData`]).
pub fn call_with_data(name: &str, args: &str, data: Value) -> Reply {
    Reply::CallWithData(name.to_string(), args.to_string(), data)
}

pub fn calls(list: &[(&str, &str)]) -> Reply {
    Reply::Calls(list.iter().map(|(n, a)| (n.to_string(), a.to_string())).collect())
}

/// A test double model that replays `replies` in order, streaming text in small pieces and
/// tool arguments in two halves, and records every request it got.
pub struct ScriptedModel {
    replies: RefCell<VecDeque<Reply>>,
    /// Reply used when the script runs out (None → a protocol error).
    repeat_last: Option<Reply>,
    pub requests: RefCell<Vec<ModelRequest>>,
    /// The run id of each call, in order.
    pub run_ids: RefCell<Vec<String>>,
    pub usage_per_call: Usage,
    id: String,
}

impl ScriptedModel {
    pub fn new(replies: Vec<Reply>) -> Rc<Self> {
        Self::scripted(replies.into(), None)
    }

    pub fn repeating(reply: Reply) -> Rc<Self> {
        Self::scripted(VecDeque::new(), Some(reply))
    }

    /// [`ScriptedModel::new`] as the model `id`, reporting `usage` with each answer (a judge on
    /// another provider, whose tokens are billed apart from the agent's model).
    pub fn identified(replies: Vec<Reply>, id: &str, usage: Usage) -> Rc<Self> {
        Rc::new(Self { id: id.into(), usage_per_call: usage, ..Self::script(replies.into(), None) })
    }

    fn scripted(replies: VecDeque<Reply>, repeat_last: Option<Reply>) -> Rc<Self> {
        Rc::new(Self::script(replies, repeat_last))
    }

    fn script(replies: VecDeque<Reply>, repeat_last: Option<Reply>) -> Self {
        Self {
            replies: RefCell::new(replies),
            repeat_last,
            requests: RefCell::new(vec![]),
            run_ids: RefCell::new(vec![]),
            usage_per_call: Usage { input_tokens: 10, output_tokens: 5 },
            id: "scripted:test".into(),
        }
    }
}

impl ScriptedModel {
    /// Streams `text` four characters at a time, yielding between pieces.
    async fn stream_text(&self, text: &str, finish_reason: &str, sink: &mut dyn ChunkSink) {
        let chars: Vec<char> = text.chars().collect();
        for piece in chars.chunks(4) {
            sink.chunk(&ModelChunk::Text { delta: piece.iter().collect() });
            YieldOnce::default().await;
        }
        sink.chunk(&ModelChunk::Finish { finish_reason: finish_reason.into(), usage: Some(self.usage_per_call) });
    }

    /// Streams `list` as tool calls, each call's arguments in two halves.
    fn stream_calls(&self, list: &[(String, String)], finish_reason: &str, sink: &mut dyn ChunkSink) {
        self.stream_calls_with(list, None, finish_reason, sink);
    }

    /// [`Self::stream_calls`], then the first call's provider value `data` in a piece of its own.
    fn stream_calls_with(&self, list: &[(String, String)], data: Option<Value>, finish_reason: &str, sink: &mut dyn ChunkSink) {
        for (i, (name, args)) in list.iter().enumerate() {
            let mid = args.len() / 2;
            let mid = (0..=mid).rev().find(|m| args.is_char_boundary(*m)).unwrap_or(0);
            sink.chunk(&ModelChunk::ToolCall {
                index: i as u32,
                id: Some(format!("call_{i}")),
                name: Some(name.clone()),
                arguments_delta: args[..mid].to_string(),
                provider_data: None,
            });
            sink.chunk(&ModelChunk::ToolCall { index: i as u32, id: None, name: None, arguments_delta: args[mid..].to_string(), provider_data: None });
        }
        if let Some(data) = data {
            sink.chunk(&ModelChunk::ToolCall { index: 0, id: None, name: None, arguments_delta: String::new(), provider_data: Some(data) });
        }
        sink.chunk(&ModelChunk::Finish { finish_reason: finish_reason.into(), usage: Some(self.usage_per_call) });
    }
}

#[async_trait(?Send)]
impl Model for ScriptedModel {
    fn id(&self) -> String {
        self.id.clone()
    }

    async fn stream(&self, request: &ModelRequest, call: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError> {
        self.requests.borrow_mut().push(request.clone());
        self.run_ids.borrow_mut().push(call.run_id.clone());
        let reply = self.replies.borrow_mut().pop_front().or_else(|| self.repeat_last.clone());
        let Some(reply) = reply else {
            return Err(ModelError::new("provider_protocol", "scripted model ran out of replies"));
        };
        match reply {
            Reply::Text(t) => self.stream_text(&t, "stop", sink).await,
            Reply::TextEnding(t, finish_reason) => self.stream_text(&t, &finish_reason, sink).await,
            Reply::Calls(list) => self.stream_calls(&list, "tool_calls", sink),
            Reply::CutOff(list) => self.stream_calls(&list, "length", sink),
            Reply::CallWithData(name, args, data) => self.stream_calls_with(&[(name, args)], Some(data), "tool_calls", sink),
            Reply::Fail(e) => return Err(e),
        }
        Ok(())
    }
}

/// A future that returns Pending once (waking itself), so concurrent work interleaves.
#[derive(Default)]
pub struct YieldOnce(bool);

impl Future for YieldOnce {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.0 {
            Poll::Ready(())
        } else {
            self.0 = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }
}

/// A handler computing its result with a closure after yielding `yields` times; tracks how
/// many calls are in flight at once.
pub struct FnTool {
    pub f: Box<dyn Fn(Value) -> Result<Value, ToolFailure>>,
    pub yields: Box<dyn Fn(&Value) -> usize>,
    pub in_flight: Cell<usize>,
    pub max_in_flight: Cell<usize>,
    pub calls: Cell<usize>,
    pub finished_order: RefCell<Vec<String>>,
    /// The run id of each call, in order.
    pub run_ids: RefCell<Vec<String>>,
}

impl FnTool {
    pub fn new(f: impl Fn(Value) -> Result<Value, ToolFailure> + 'static) -> Rc<Self> {
        Self::with_delay(f, |_| 0)
    }

    pub fn with_delay(f: impl Fn(Value) -> Result<Value, ToolFailure> + 'static, yields: impl Fn(&Value) -> usize + 'static) -> Rc<Self> {
        Rc::new(Self {
            f: Box::new(f),
            yields: Box::new(yields),
            in_flight: Cell::new(0),
            max_in_flight: Cell::new(0),
            calls: Cell::new(0),
            finished_order: RefCell::new(vec![]),
            run_ids: RefCell::new(vec![]),
        })
    }
}

#[async_trait(?Send)]
impl ToolHandler for FnTool {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        self.calls.set(self.calls.get() + 1);
        self.run_ids.borrow_mut().push(ctx.run_id.clone());
        self.in_flight.set(self.in_flight.get() + 1);
        self.max_in_flight.set(self.max_in_flight.get().max(self.in_flight.get()));
        for _ in 0..(self.yields)(&args) {
            YieldOnce::default().await;
        }
        self.in_flight.set(self.in_flight.get() - 1);
        self.finished_order.borrow_mut().push(ctx.call_id.clone());
        (self.f)(args)
    }
}

/// Wraps a handler so calls whose arguments satisfy `predicate` need human approval.
pub struct NeedsApproval {
    pub inner: Rc<FnTool>,
    pub predicate: Box<dyn Fn(&Value) -> bool>,
}

#[async_trait(?Send)]
impl ToolHandler for NeedsApproval {
    async fn call(&self, args: Value, ctx: &CallContext) -> Result<Value, ToolFailure> {
        self.inner.call(args, ctx).await
    }

    async fn needs_approval(&self, args: &Value) -> bool {
        (self.predicate)(args)
    }
}
pub mod emergent;

#[cfg(feature = "sandbox")]
pub mod sandbox;
#[cfg(feature = "sandbox")]
#[allow(unused_imports)] // each test binary uses a different part of the support module
pub use sandbox::*;

/// What [`AbortedMidAnswer`] does once it has seen the abort.
pub enum AfterAbort {
    /// Ends as if the answer were done (a provider that returns on `signal.aborted`).
    EndQuietly,
    /// Streams on for ever (a provider that ignores the signal).
    Hang,
    /// Fails with its own error (`fetch`'s `AbortError` read as another failure).
    Fail(ModelError),
}

/// A test double: a provider of the host's own that starts answering, sees the run aborted
/// (it cancels `flag` itself, as the host would) and then does what `then` says.
pub struct AbortedMidAnswer {
    pub flag: Rc<CancelFlag>,
    pub then: AfterAbort,
}

#[async_trait(?Send)]
impl Model for AbortedMidAnswer {
    fn id(&self) -> String {
        "double:aborted-mid-answer".into()
    }

    async fn stream(&self, _: &ModelRequest, _: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError> {
        sink.chunk(&ModelChunk::Text { delta: "partial ans".into() });
        self.flag.cancel();
        // Ending or failing in the same poll as the cancel: the loop must then tell the abort
        // from what the provider returned (a JS provider settles before the cancel is seen).
        match &self.then {
            AfterAbort::EndQuietly => Ok(()),
            AfterAbort::Hang => futures::future::pending().await,
            AfterAbort::Fail(error) => Err(error.clone()),
        }
    }
}
