//! Provider-neutral model messages, tool calls, usage, and the [`Model`] trait.
//!
//! The core never speaks HTTP: a [`Model`] streams [`ModelChunk`]s (text deltas, pieces of tool
//! calls, a finish marker) and the loop assembles them. In wasm the model is a JS provider
//! object adapted in `src/wasm/`; in native tests it is a scripted test double.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

mod assemble;
pub use assemble::{AssembledResponse, ResponseAssembler, MAX_PROVIDER_DATA_BYTES, MAX_RESPONSE_BYTES, MAX_TOOL_CALLS_PER_RESPONSE};

/// Token counts for one or more model calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "wasm-core", derive(tsify::Tsify))]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    #[serde(deserialize_with = "token_count")]
    pub input_tokens: u64,
    #[serde(deserialize_with = "token_count")]
    pub output_tokens: u64,
}

/// A token count as a provider of the host's may report it: any number, read as a whole count
/// (a fraction rounded down, a negative as 0, past `u64::MAX` as `u64::MAX`). A count only
/// informs accounting: refusing the chunk it came in would lose the answer that came with it.
fn token_count<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<u64, D::Error> {
    struct Count;
    impl serde::de::Visitor<'_> for Count {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a token count")
        }
        fn visit_u64<E>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E>(self, v: i64) -> Result<u64, E> {
            Ok(v.max(0) as u64)
        }
        fn visit_f64<E>(self, v: f64) -> Result<u64, E> {
            // `as` saturates, and reads NaN as 0.
            Ok(v as u64)
        }
    }
    deserializer.deserialize_any(Count)
}

impl Usage {
    /// Adds another call's counts to this one. Saturating: a provider may report any count
    /// (a u64 at the boundary), and a sum that wrapped would report a huge run as a tiny one
    /// (or, in a build with overflow checks, panic).
    pub fn add(&mut self, other: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
    }
}

/// A tool call as the model produced it; `arguments` is the raw JSON text (possibly malformed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
    /// What the provider wants back with this call when it sends the conversation again
    /// (DeepSeek's `reasoning_content` of the turn, Gemini's thought signature). Opaque: the
    /// core stores it with the conversation (run state, session history) and hands it back in
    /// [`ModelRequest::messages`], never reading it, so it survives a restart. At most
    /// [`MAX_PROVIDER_DATA_BYTES`] of JSON per response. Absent in states stored before it
    /// existed, and left out when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_data: Option<serde_json::Value>,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "camelCase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    #[serde(rename_all = "camelCase")]
    Assistant {
        content: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    #[serde(rename_all = "camelCase")]
    Tool {
        tool_call_id: String,
        name: String,
        content: String,
        /// The call failed (`content` is the error): Anthropic's `is_error`. Absent in states
        /// stored before it existed.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        is_error: bool,
    },
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolDefinition {
    pub name: String,
    pub description: String,
    pub input_schema: serde_json::Value,
}

/// One model call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelRequest {
    pub messages: Vec<Message>,
    pub tools: Vec<ToolDefinition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Ask for a JSON answer, optionally matching a schema (constrained decoding where the
    /// provider supports it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<ResponseFormat>,
    /// Whether the model may, must or must not call a tool this turn; `None` leaves it to the
    /// provider's default (`auto`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<ToolChoice>,
}

/// Whether a turn's model call may, must or must not call a tool (the TS `ToolChoice`:
/// `'auto' | 'required' | 'none' | { tool: name }`). Providers that constrain decoding
/// (llama.cpp's server among them) turn `required` and a named tool into a grammar over the
/// tools' argument schemas, so even small models write complete, parseable calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    Auto,
    /// The model must call some tool.
    Required,
    /// The model must answer in text.
    None,
    /// The model must call this tool.
    Tool(String),
}

/// The answer format a request asks for: the TS `responseFormat` `{ jsonSchema: { name, schema } }`.
/// (The TS type also has `'json'`, any object, for callers of a provider; the core always
/// knows the schema it wants.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResponseFormat {
    /// A JSON object matching `schema`. Servers that constrain decoding to a schema (llama.cpp's
    /// server, Ollama, OpenAI) then cannot produce a missing key, a string where a number
    /// belongs, or an answer cut off mid-object by an unbounded string.
    JsonSchema {
        /// A short identifier for the schema (OpenAI requires one).
        name: String,
        /// Shared: the judge sends the same verdict schema with every review.
        schema: std::rc::Rc<serde_json::Value>,
    },
}

/// A streamed piece of a model's answer (see `npm/src/providers/types.ts`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ModelChunk {
    Text {
        delta: String,
    },
    #[serde(rename_all = "camelCase")]
    ToolCall {
        index: u32,
        #[serde(default)]
        id: Option<String>,
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        arguments_delta: String,
        /// The call's [`ToolCall::provider_data`]: the last piece of a call that carries one
        /// sets it, so a provider may send it once it knows all of it.
        #[serde(default)]
        provider_data: Option<serde_json::Value>,
    },
    #[serde(rename_all = "camelCase")]
    Finish {
        finish_reason: String,
        #[serde(default)]
        usage: Option<Usage>,
    },
}

/// Why a model call failed. `code` mirrors the TS `ProviderError` codes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
#[serde(rename_all = "camelCase")]
pub struct ModelError {
    /// `provider_http`, `provider_timeout`, `provider_network`, `provider_protocol`, `aborted`, …
    pub code: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
}

impl ModelError {
    pub fn new(code: impl Into<String>, message: impl Into<String>) -> Self {
        Self { code: code.into(), message: message.into(), status: None }
    }

    /// Whether this error means the caller aborted the run.
    pub fn is_abort(&self) -> bool {
        self.code == "aborted"
    }

    /// The error a provider of the host's own failed with, under a code the runtime defines:
    /// its code becomes the run's error code, so any other (`ECONNRESET`, `max_turns_exceeded`)
    /// would pass for something it is not. Such codes stay in the message.
    pub fn from_provider(code: Option<String>, message: String, status: Option<u16>) -> Self {
        // The `provider_*` codes of the TS `CrucibleErrorCode` (npm/src/errors.ts), and `aborted`.
        const PROVIDER_CODES: [&str; 5] = ["provider_http", "provider_timeout", "provider_network", "provider_protocol", "aborted"];
        match code {
            Some(code) if PROVIDER_CODES.contains(&code.as_str()) => Self { code, message, status },
            Some(code) => Self { code: "provider_protocol".into(), message: format!("{code}: {message}"), status },
            None => Self { code: "provider_protocol".into(), message, status },
        }
    }
}

/// Receives chunks as the model produces them. Returning is the back-pressure point.
pub trait ChunkSink {
    fn chunk(&mut self, chunk: &ModelChunk);

    /// Whether the sink wants no more chunks (it has what it needs, or the response passed a
    /// bound): a model should then stop reading and cancel the response.
    fn stopped(&self) -> bool {
        false
    }
}

/// Per-call context: which run the call belongs to, so the host can apply that run's
/// `AbortSignal` to the fetch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CallInfo {
    pub run_id: String,
}

/// A model: one streamed call per request.
///
/// `?Send` because in wasm the implementation holds JS objects; natively the loop runs on a
/// single-threaded executor too.
#[async_trait(?Send)]
pub trait Model {
    /// Stable id used for usage accounting, e.g. `openai:qwen`.
    fn id(&self) -> String;

    /// Streams one response. Every chunk is passed to `sink` as it arrives; the call returns
    /// after the stream ends, with an error if the provider failed.
    async fn stream(&self, request: &ModelRequest, call: &CallInfo, sink: &mut dyn ChunkSink) -> Result<(), ModelError>;
}

/// Why an answer ended, in one vocabulary across providers: `stop`, `length` (the token
/// limit), `content_filter`, `tool_calls`, or `other`. Providers report their own words
/// (`end_turn`, `max_tokens`, `tool_use`, …).
pub fn finish_kind(finish_reason: &str) -> &'static str {
    match finish_reason {
        "stop" | "end_turn" | "stop_sequence" | "eos" | "" => "stop",
        // Anthropic's `model_context_window_exceeded`: cut at the context window, not at
        // `max_tokens`, but cut all the same (a call in it is incomplete, not malformed).
        "length" | "max_tokens" | "model_length" | "model_context_window_exceeded" => "length",
        "content_filter" | "refusal" | "safety" => "content_filter",
        "tool_calls" | "tool_use" | "function_call" => "tool_calls",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::{finish_kind, ModelError, Usage};

    #[test]
    fn counts_near_the_top_saturate_instead_of_wrapping() {
        let mut total = Usage { input_tokens: u64::MAX - 1, output_tokens: 5 };
        total.add(Usage { input_tokens: 7, output_tokens: u64::MAX });
        assert_eq!(total, Usage { input_tokens: u64::MAX, output_tokens: u64::MAX });
    }

    #[test]
    fn any_reported_count_reads_as_a_whole_count_rather_than_failing_the_chunk() {
        let read = |v: serde_json::Value| serde_json::from_value::<Usage>(v).map(|u| (u.input_tokens, u.output_tokens));
        assert_eq!(read(serde_json::json!({ "inputTokens": 12.5, "outputTokens": 1e20 })).unwrap(), (12, u64::MAX));
        assert_eq!(read(serde_json::json!({ "inputTokens": -3, "outputTokens": 7 })).unwrap(), (0, 7));
        assert_eq!(read(serde_json::json!({ "inputTokens": u64::MAX, "outputTokens": 0 })).unwrap(), (u64::MAX, 0));
        assert!(read(serde_json::json!({ "inputTokens": "12", "outputTokens": 0 })).is_err(), "not a number at all is still refused");
    }

    #[test]
    fn finish_reasons_of_every_provider_read_as_one_vocabulary() {
        let kinds: Vec<_> =
            ["stop", "end_turn", "length", "max_tokens", "model_context_window_exceeded", "content_filter", "refusal", "tool_use", "pause_turn"]
                .map(finish_kind)
                .to_vec();
        assert_eq!(kinds, ["stop", "stop", "length", "length", "length", "content_filter", "content_filter", "tool_calls", "other"]);
    }

    #[test]
    fn a_provider_error_keeps_only_codes_the_runtime_defines() {
        let from = |code: &str| ModelError::from_provider(Some(code.into()), "m".into(), None);
        assert_eq!(from("provider_timeout").code, "provider_timeout");
        assert_eq!(from("aborted").code, "aborted");
        for foreign in ["ECONNRESET", "max_turns_exceeded", "invalid_config"] {
            let e = from(foreign);
            assert_eq!((e.code.as_str(), e.message), ("provider_protocol", format!("{foreign}: m")));
        }
        assert_eq!(ModelError::from_provider(None, "m".into(), Some(502)).code, "provider_protocol");
    }
}
