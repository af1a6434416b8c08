//! Assembles streamed [`ModelChunk`]s into text and complete tool calls.
//!
//! Providers stream tool calls as indexed pieces (OpenAI `tool_calls[i]` deltas, Anthropic
//! `input_json_delta`s); the first piece of a call carries its id and name. Pieces of different
//! calls may interleave.
//!
//! A response is bounded ([`MAX_TOOL_CALLS_PER_RESPONSE`], [`MAX_RESPONSE_BYTES`],
//! [`MAX_PROVIDER_DATA_BYTES`]): the
//! endpoint may be broken or hostile, and this instance's memory, which never shrinks, is
//! shared by every agent of the process. Past a bound the assembler stops taking chunks and the
//! response fails as `provider_protocol`.

use std::borrow::Cow;

use super::{ModelChunk, ModelError, ToolCall, Usage};
use crate::js_json::well_formed;
use crate::tools::json_len;

/// Most tool calls one response may carry (a step runs them all; `maxSteps` bounds a run).
pub const MAX_TOOL_CALLS_PER_RESPONSE: usize = 128;

/// Most bytes of text, tool names and tool arguments one response may stream.
pub const MAX_RESPONSE_BYTES: usize = 8 << 20;

/// Most bytes of JSON the [`ToolCall::provider_data`] of one response may hold together. It
/// is stored with the conversation and sent with every later turn, so a hostile server must not
/// be able to bloat stored state; above a long reasoning (DeepSeek's `reasoning_content` runs
/// to some tens of KB) and a signature per call (Gemini's, a few hundred bytes). A response
/// past it fails as `provider_protocol` rather than losing the data: the servers that send it
/// refuse the next turn without it, with a 400 that would not name the cause.
pub const MAX_PROVIDER_DATA_BYTES: usize = 512 << 10;

/// What one model response amounted to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AssembledResponse {
    pub text: String,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
}

/// Folds chunks into an [`AssembledResponse`].
#[derive(Debug, Default)]
pub struct ResponseAssembler {
    response: AssembledResponse,
    // (provider index, call) in first-seen order; at most MAX_TOOL_CALLS_PER_RESPONSE, so
    // finding the latest call at an index is a short scan.
    calls: Vec<(u32, ToolCall)>,
    generated_ids: u32,
    bytes: usize,
    /// JSON bytes of the calls' provider data as kept (see [`MAX_PROVIDER_DATA_BYTES`]).
    provider_bytes: usize,
    /// Set once a bound was passed: chunks are then ignored.
    overflow: Option<String>,
}

impl ResponseAssembler {
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether a bound was passed (the rest of the response is not worth reading).
    pub fn overflowed(&self) -> bool {
        self.overflow.is_some()
    }

    pub fn push(&mut self, chunk: &ModelChunk) {
        if self.overflow.is_some() {
            return;
        }
        let size = match chunk {
            ModelChunk::Text { delta } => delta.len(),
            ModelChunk::ToolCall { id, name, arguments_delta, .. } => {
                id.as_ref().map_or(0, String::len) + name.as_ref().map_or(0, String::len) + arguments_delta.len()
            }
            ModelChunk::Finish { .. } => 0,
        };
        self.bytes += size;
        if self.bytes > MAX_RESPONSE_BYTES {
            self.overflow = Some(format!("the model's response streamed more than {MAX_RESPONSE_BYTES} bytes of text and tool calls"));
            return;
        }
        match chunk {
            ModelChunk::Text { delta } => self.response.text.push_str(delta),
            ModelChunk::ToolCall { index, id, name, arguments_delta, provider_data } => {
                let id = id.as_deref().filter(|s| !s.is_empty());
                let name = name.as_deref().filter(|s| !s.is_empty());
                // Pieces go to the latest call at their index, unless they bring another id: some
                // servers number every call 0 (Ollama's OpenAI-compatible endpoint) or give no
                // index at all, and only the new id tells a second call from the first. Without
                // ids, a name (another, or the same one with more arguments) after complete
                // arguments starts the next call: nothing can be added to complete JSON.
                let continues = |call: &ToolCall| {
                    id.is_none_or(|id| call.id.is_empty() || call.id == id)
                        && name.is_none_or(|name| {
                            call.name.is_empty()
                                || (call.name == name && (id.is_some() || arguments_delta.trim().is_empty()))
                                || !complete_json(&call.arguments)
                        })
                };
                let pos = match self.calls.iter().rposition(|(i, _)| i == index) {
                    Some(pos) if continues(&self.calls[pos].1) => Some(pos),
                    // A nameless piece naming an earlier call at its index belongs to it: a
                    // provider gives a call's provider data once the answer ended, by id, and
                    // when its server numbered every call alike that call is not the latest.
                    _ if name.is_none() => id.and_then(|id| self.calls.iter().rposition(|(i, call)| i == index && call.id == id)),
                    _ => None,
                };
                let pos = match pos {
                    Some(pos) => pos,
                    None => {
                        if self.calls.len() == MAX_TOOL_CALLS_PER_RESPONSE {
                            self.overflow = Some(format!("the model's response has more than {MAX_TOOL_CALLS_PER_RESPONSE} tool calls"));
                            return;
                        }
                        self.calls.push((*index, ToolCall { id: String::new(), name: String::new(), arguments: String::new(), provider_data: None }));
                        self.calls.len() - 1
                    }
                };
                let call = &mut self.calls[pos].1;
                if let Some(id) = id {
                    call.id = id.to_string();
                }
                // Some servers repeat the whole name in every piece (MiniMax on NVIDIA NIM among
                // them); OpenAI's sends it once. A piece naming the call again adds nothing.
                if let Some(name) = name.filter(|name| call.name != *name) {
                    call.name.push_str(name);
                }
                call.arguments.push_str(arguments_delta);
                if let Some(data) = provider_data {
                    // Counted as kept, not as streamed: a provider may give a call's value again
                    // with every piece as it grows, and only the last one given stays.
                    self.provider_bytes = self.provider_bytes - call.provider_data.as_ref().map_or(0, json_len) + json_len(data);
                    if self.provider_bytes > MAX_PROVIDER_DATA_BYTES {
                        self.overflow = Some(format!(
                            "the model's response gave its tool calls {} bytes of provider data to send back; at most {MAX_PROVIDER_DATA_BYTES} are kept",
                            self.provider_bytes
                        ));
                        return;
                    }
                    call.provider_data = Some(data.clone());
                }
            }
            ModelChunk::Finish { finish_reason, usage } => {
                self.response.finish_reason = Some(finish_reason.clone());
                if usage.is_some() {
                    self.response.usage = *usage;
                }
            }
        }
    }

    /// Finishes assembly. Calls without an id (some servers omit it) get a generated one, and
    /// a call repeating an earlier call's id gets a fresh one, so every tool result (and every
    /// approval decision, which names its call) matches exactly one call. A response that
    /// passed a bound is a `provider_protocol` error.
    pub fn finish(mut self, id_prefix: &str) -> Result<AssembledResponse, ModelError> {
        if let Some(reason) = self.overflow {
            return Err(ModelError::new("provider_protocol", reason));
        }
        for (_, mut call) in self.calls.drain(..) {
            // At most 128 calls: comparing with those already taken beats a set.
            while call.id.is_empty() || self.response.tool_calls.iter().any(|taken| taken.id == call.id) {
                self.generated_ids += 1;
                call.id = format!("{id_prefix}-{}", self.generated_ids);
            }
            if call.arguments.trim().is_empty() {
                call.arguments = "{}".to_string();
            }
            // A lone surrogate escape (`"\ud83d"`, a model's text cut inside an emoji) reads as
            // U+FFFD, as anywhere else in the runtime, instead of failing every parse of the call.
            if let Cow::Owned(fixed) = well_formed(&call.arguments) {
                call.arguments = fixed;
            }
            self.response.tool_calls.push(call);
        }
        Ok(self.response)
    }
}

/// Whether `arguments` already are a whole JSON value (a call's last piece came).
fn complete_json(arguments: &str) -> bool {
    !arguments.trim().is_empty() && serde_json::from_str::<serde::de::IgnoredAny>(&well_formed(arguments)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The assembled calls as (name, arguments).
    fn names_and_arguments(assembler: ResponseAssembler) -> Vec<String> {
        assembler.finish("call").unwrap().tool_calls.into_iter().map(|c| format!("{} {}", c.name, c.arguments)).collect()
    }

    fn piece(index: u32, id: Option<&str>, name: Option<&str>, args: &str) -> ModelChunk {
        ModelChunk::ToolCall { index, id: id.map(str::to_string), name: name.map(str::to_string), arguments_delta: args.to_string(), provider_data: None }
    }

    #[test]
    fn interleaved_tool_call_pieces_assemble_by_index() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("c0"), Some("get_weather"), "{\"ci"));
        a.push(&piece(1, Some("c1"), Some("get_time"), "{}"));
        a.push(&piece(0, None, None, "ty\":\"Oslo\"}"));
        a.push(&ModelChunk::Finish { finish_reason: "tool_calls".into(), usage: Some(Usage { input_tokens: 3, output_tokens: 4 }) });
        let r = a.finish("call").unwrap();
        assert_eq!(r.tool_calls.len(), 2);
        assert_eq!(r.tool_calls[0].arguments, "{\"city\":\"Oslo\"}");
        assert_eq!(r.tool_calls[1].name, "get_time");
        assert_eq!(r.usage, Some(Usage { input_tokens: 3, output_tokens: 4 }));
    }

    #[test]
    fn missing_ids_and_empty_arguments_are_filled_in() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, None, Some("now"), ""));
        let r = a.finish("run1-s1").unwrap();
        assert_eq!(r.tool_calls[0].id, "run1-s1-1");
        assert_eq!(r.tool_calls[0].arguments, "{}");
    }

    #[test]
    fn calls_that_share_an_index_are_told_apart_by_their_ids() {
        // Two complete calls, both numbered 0 (as Ollama's OpenAI-compatible endpoint sends them).
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("a"), Some("get_weather"), "{\"city\":"));
        a.push(&piece(0, None, None, "\"Oslo\"}"));
        a.push(&piece(0, Some("b"), Some("get_time"), "{}"));
        let r = a.finish("call").unwrap();
        let calls: Vec<_> = r.tool_calls.iter().map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str())).collect();
        assert_eq!(calls, [("a", "get_weather", "{\"city\":\"Oslo\"}"), ("b", "get_time", "{}")]);
    }

    #[test]
    fn a_name_repeated_in_every_piece_is_taken_once() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("a"), Some("get_weather"), "{\"city\":"));
        a.push(&piece(0, Some("a"), Some("get_weather"), "\"Oslo\"}"));
        // A name that arrives in fragments still joins up.
        a.push(&piece(1, Some("b"), Some("get_"), ""));
        a.push(&piece(1, None, Some("time"), "{}"));
        assert_eq!(names_and_arguments(a), [r#"get_weather {"city":"Oslo"}"#, "get_time {}"]);
    }

    #[test]
    fn calls_without_index_or_id_are_told_apart_by_their_names() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some(""), Some("get_weather"), "{\"city\":\"Oslo\"}"));
        a.push(&piece(0, Some(""), Some("get_time"), "{}"));
        assert_eq!(names_and_arguments(a), [r#"get_weather {"city":"Oslo"}"#, "get_time {}"]);
    }

    #[test]
    fn calls_of_one_name_without_index_or_id_are_told_apart_once_the_first_is_complete() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, None, Some("get_weather"), "{\"city\":"));
        a.push(&piece(0, None, Some("get_weather"), "\"Oslo\"}"));
        a.push(&piece(0, None, Some("get_weather"), ""));
        a.push(&piece(0, None, Some("get_weather"), "{\"city\":\"Lima\"}"));
        assert_eq!(names_and_arguments(a), [r#"get_weather {"city":"Oslo"}"#, r#"get_weather {"city":"Lima"}"#]);
    }

    #[test]
    fn a_lone_surrogate_escape_in_arguments_is_written_as_a_replacement_character() {
        // The model's text cut inside an emoji: complete JSON for JS, which the call parses as.
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, None, Some("echo"), r#"{"s":"\ud83d"}"#));
        a.push(&piece(0, None, Some("echo"), r#"{"s":"\ud83d\ude00 \ude00"}"#));
        assert_eq!(names_and_arguments(a), [r#"echo {"s":"\ufffd"}"#, r#"echo {"s":"\ud83d\ude00 \ufffd"}"#]);
    }

    #[test]
    fn a_response_past_its_bounds_is_a_protocol_error_and_stops_growing() {
        let mut many = ResponseAssembler::new();
        for i in 0..100_000u32 {
            many.push(&piece(i, None, Some("t"), "{}"));
        }
        assert_eq!(many.calls.len(), MAX_TOOL_CALLS_PER_RESPONSE);
        assert!(many.overflowed());
        let err = many.finish("r").unwrap_err();
        assert_eq!(err.code, "provider_protocol");
        assert!(err.message.contains("more than 128 tool calls"), "{}", err.message);

        let mut long = ResponseAssembler::new();
        let delta = "x".repeat(1 << 20);
        for _ in 0..20 {
            long.push(&ModelChunk::Text { delta: delta.clone() });
        }
        assert_eq!(long.response.text.len(), 8 << 20, "nothing past the bound is kept");
        assert!(long.finish("r").unwrap_err().message.contains("more than 8388608 bytes"));
    }

    #[test]
    fn a_calls_provider_data_is_the_last_one_its_pieces_gave_and_is_kept_with_it() {
        let mut a = ResponseAssembler::new();
        let with = |index, id: Option<&str>, data| ModelChunk::ToolCall {
            index,
            id: id.map(str::to_string),
            name: None,
            arguments_delta: String::new(),
            provider_data: Some(data),
        };
        a.push(&piece(0, Some("a"), Some("get_weather"), "{}"));
        a.push(&with(0, None, serde_json::json!({ "extra_content": "partial" })));
        a.push(&piece(1, Some("b"), Some("get_time"), "{}"));
        // Given once the answer ended, naming its call by id.
        a.push(&with(0, Some("a"), serde_json::json!({ "extra_content": "sig", "reasoning_content": "think" })));
        let data: Vec<_> = a.finish("call").unwrap().tool_calls.into_iter().map(|c| c.provider_data).collect();
        assert_eq!(data, [Some(serde_json::json!({ "extra_content": "sig", "reasoning_content": "think" })), None]);
    }

    #[test]
    fn provider_data_past_its_bound_fails_the_response_instead_of_being_stored() {
        let sized = |bytes: usize| {
            let mut a = ResponseAssembler::new();
            // Two calls of half the data each: the bound is on the response, not on a call.
            for index in 0..2 {
                a.push(&ModelChunk::ToolCall {
                    index,
                    id: Some(format!("c{index}")),
                    name: Some("t".into()),
                    arguments_delta: "{}".into(),
                    provider_data: Some(serde_json::Value::String("x".repeat(bytes / 2 - 2))),
                });
            }
            a.finish("call")
        };
        assert!(sized(MAX_PROVIDER_DATA_BYTES).is_ok(), "exactly at the bound (each value's JSON has its two quotes)");
        let err = sized(MAX_PROVIDER_DATA_BYTES + 2).unwrap_err();
        assert_eq!(err.code, "provider_protocol");
        assert!(err.message.contains("524290 bytes of provider data") && err.message.contains("at most 524288"), "{}", err.message);
    }

    #[test]
    fn provider_data_given_again_with_every_piece_counts_once_toward_the_bounds() {
        // A provider giving a call's value again as it grows: 200 pieces of up to 100 KB stream
        // some 10 MB of it, past the 8 MiB of a response, but only the last one given is kept.
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("a"), Some("get_weather"), "{}"));
        for n in 1..=200 {
            a.push(&ModelChunk::ToolCall {
                index: 0,
                id: None,
                name: None,
                arguments_delta: String::new(),
                provider_data: Some(serde_json::Value::String("x".repeat(n * 500))),
            });
        }
        let calls = a.finish("r").unwrap().tool_calls;
        assert_eq!(calls[0].provider_data, Some(serde_json::Value::String("x".repeat(100_000))));
    }

    #[test]
    fn provider_data_naming_an_earlier_call_at_a_shared_index_goes_to_that_call_and_starts_none() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("a"), Some("get_weather"), "{}"));
        a.push(&piece(0, Some("b"), Some("get_time"), "{}"));
        a.push(&ModelChunk::ToolCall {
            index: 0,
            id: Some("a".into()),
            name: None,
            arguments_delta: String::new(),
            provider_data: Some(serde_json::json!("sig-a")),
        });
        let calls: Vec<_> = a.finish("r").unwrap().tool_calls.into_iter().map(|c| (c.id, c.name, c.provider_data)).collect();
        assert_eq!(calls, [("a".to_string(), "get_weather".to_string(), Some(serde_json::json!("sig-a"))), ("b".to_string(), "get_time".to_string(), None)]);
    }

    #[test]
    fn a_repeated_call_id_is_replaced_so_each_call_has_its_own() {
        let mut a = ResponseAssembler::new();
        a.push(&piece(0, Some("c"), Some("refund"), "{\"amount\":1}"));
        a.push(&piece(1, Some("c"), Some("refund"), "{\"amount\":2}"));
        let r = a.finish("run1-s1").unwrap();
        assert_eq!(r.tool_calls.iter().map(|c| c.id.as_str()).collect::<Vec<_>>(), ["c", "run1-s1-1"]);
    }
}
