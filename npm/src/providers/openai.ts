/**
 * OpenAI-compatible Chat Completions provider (`POST {baseURL}/chat/completions`). Speaks to
 * OpenAI itself and to the servers that copy its wire format: llama-server, vLLM, LM Studio,
 * Ollama's `/v1`, OpenRouter.
 *
 * Wire format: https://platform.openai.com/docs/api-reference/chat
 *
 * @module
 */

import type { EventSourceMessage } from 'eventsource-parser';
import {
  expectObject,
  parseJson,
  protocolError,
  readJson,
  readSse,
  streamedError,
  textOf,
  functionTools,
  postProvider,
  checkProviderOptions,
  repliesWithJson,
  optionError,
  argumentsText,
  type HttpContext,
} from './http.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, OpenAIOptions, Usage } from './types.js';
import { carriesNews, lazyText, loose, WireReader, type WireObject } from './wire.js';

/** Default endpoint; override `baseURL` for any compatible server (e.g. `http://127.0.0.1:8080/v1`). */
export const OPENAI_DEFAULT_BASE_URL = 'https://api.openai.com/v1';

/**
 * Creates a provider for an OpenAI-compatible `/chat/completions` endpoint.
 *
 * @example
 * ```ts
 * const model = openai({ model: 'gpt-4o-mini', apiKey: process.env.OPENAI_API_KEY });
 * for await (const chunk of model.stream({ messages, tools: [] })) console.log(chunk);
 * ```
 */
export function openai(options: OpenAIOptions): ModelProvider {
  checkProviderOptions('openai', options);
  const { reasoningModel = isReasoningModel(options.model), reasoningEffort } = options;
  if (typeof reasoningModel !== 'boolean') throw optionError('openai', 'reasoningModel', 'true or false', reasoningModel);
  if (reasoningEffort != null && typeof reasoningEffort !== 'string') throw optionError('openai', 'reasoningEffort', 'a string such as "low"', reasoningEffort);
  const wire: WireOptions = { reasoningModel, reasoningEffort: reasoningEffort ?? undefined };
  const headers: Record<string, string> = { ...options.headers };
  // Local servers (llama-server, vLLM) need no key; sending an empty Bearer confuses some proxies.
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  return postProvider({
    name: 'openai',
    options,
    defaultBaseURL: OPENAI_DEFAULT_BASE_URL,
    path: 'chat/completions',
    headers,
    toWire: (model, request, streaming) => toWireRequest(model, request, streaming, wire),
    parse: async function* (ctx, response, streaming) {
      // A server that ignores `stream` (or answers an error as plain JSON with status 200)
      // sends one JSON body: read as events it would be an empty stream, its message lost.
      if (streaming && !repliesWithJson(response)) yield* parseStream(ctx, readSse(ctx, response, 'provider'));
      else yield* parseCompletion(ctx, await readJson(ctx, response));
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping

/** What {@link OpenAIOptions} change in every request. */
interface WireOptions {
  reasoningModel: boolean;
  reasoningEffort: string | undefined;
}

/** OpenAI's reasoning families by model name (`o1`, `o3-mini`, `o4-mini`, `gpt-5`, `gpt-5-nano`, …). */
function isReasoningModel(model: unknown): boolean {
  return typeof model === 'string' && /^(o[1-9]|gpt-5)(\b|-|$)/i.test(model);
}

function toWireRequest(model: string, request: ModelRequest, streaming: boolean, wire: WireOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { model, messages: request.messages.map(toWireMessage) };
  // Some servers reject an empty `tools` array, and it means the same as no tools.
  if (request.tools.length > 0) {
    body.tools = functionTools(request.tools);
    if (request.toolChoice !== undefined) {
      const choice = request.toolChoice;
      body.tool_choice = typeof choice === 'string' ? choice : { type: 'function', function: { name: choice.tool } };
    }
  }
  // Reasoning models refuse both `max_tokens` and a temperature other than their default.
  if (request.temperature !== undefined && !wire.reasoningModel) body.temperature = request.temperature;
  if (request.maxTokens !== undefined) body[wire.reasoningModel ? 'max_completion_tokens' : 'max_tokens'] = request.maxTokens;
  if (wire.reasoningEffort !== undefined) body.reasoning_effort = wire.reasoningEffort;
  // The structured-output form, for plain JSON with an open object schema: servers that ignore
  // the older `json_object` switch (llama-server builds among them) do constrain decoding for it.
  const format = request.responseFormat;
  if (format !== undefined) {
    body.response_format = { type: 'json_schema', json_schema: format === 'json' ? { name: 'response', schema: { type: 'object' } } : format.jsonSchema };
  }
  body.stream = streaming;
  // Without this, streamed answers carry no token counts at all.
  if (streaming) body.stream_options = { include_usage: true };
  return body;
}

function toWireMessage(message: ChatMessage): Record<string, unknown> {
  switch (message.role) {
    case 'system':
    case 'user':
      return { role: message.role, content: message.content };
    case 'assistant':
      if (!message.toolCalls?.length) return { role: 'assistant', content: message.content };
      return {
        role: 'assistant',
        // OpenAI documents `null` content for a pure tool-call turn; "" is rejected by some servers.
        content: message.content === '' ? null : message.content,
        tool_calls: message.toolCalls.map((call) => ({
          id: call.id,
          type: 'function',
          // Servers that parse past calls when they build the prompt (vLLM) would refuse the
          // whole next turn over arguments that are not a JSON object.
          function: { name: call.name, arguments: argumentsText(call.arguments) },
        })),
      };
    case 'tool':
      return { role: 'tool', tool_call_id: message.toolCallId, content: message.content };
  }
}

// ---------------------------------------------------------------------------------------------
// Response mapping

/**
 * One chunk (streamed) or the completion (not streamed). Both carry `choices[0]`, with the
 * answer so far under `delta` or the whole answer under `message`, and optionally `usage` or
 * an `error` reported with status 200.
 */
async function* parseStream(ctx: HttpContext, events: AsyncIterable<EventSourceMessage>): AsyncGenerator<ModelChunk> {
  let finishReason: string | undefined;
  let usage: Usage | undefined;
  let terminated = false;

  for await (const event of events) {
    if (event.data === '[DONE]') {
      terminated = true;
      break;
    }
    const chunk = expectObject(ctx, parseJson(ctx, event.data), event.data);
    const read = new WireReader(ctx, event.data);
    throwIfError(ctx, chunk, event.data);
    const chunkUsage = toUsage(read, chunk.usage);
    usage = chunkUsage ?? usage;
    // The usage-only chunk that `include_usage` adds has `choices: []`.
    const choice = read.object(read.array(chunk.choices, 'choices')[0], 'choices[0]');
    const delta = read.object(choice?.delta, 'choices[0].delta');
    if (chunkUsage || carriesNews(delta) || choice?.finish_reason) ctx.progress?.();
    if (!choice) continue;
    yield* answerChunks(read, delta, 'delta');
    finishReason = read.string(choice.finish_reason, 'finish_reason') || finishReason;
  }

  // A body that ends with neither `[DONE]` nor a finish reason was cut off mid-answer.
  if (!terminated && finishReason === undefined) throw protocolError(ctx, 'stream ended before the answer finished');
  yield usage ? { type: 'finish', finishReason: finishReason ?? 'stop', usage } : { type: 'finish', finishReason: finishReason ?? 'stop' };
}

async function* parseCompletion(ctx: HttpContext, json: unknown): AsyncGenerator<ModelChunk> {
  // Quoted only by an error: made then, not for every reply.
  const raw = lazyText(json);
  const completion = expectObject(ctx, json, raw);
  const read = new WireReader(ctx, raw);
  throwIfError(ctx, completion, raw);
  const choice = read.object(read.array(completion.choices, 'choices')[0], 'choices[0]');
  const message = read.object(choice?.message, 'choices[0].message');
  if (!choice || !message) throw protocolError(ctx, 'completion has no `choices[0].message`', undefined, raw());
  yield* answerChunks(read, message, 'message');
  const usage = toUsage(read, completion.usage);
  const finishReason = read.string(choice.finish_reason, 'finish_reason') || 'stop';
  yield usage ? { type: 'finish', finishReason, usage } : { type: 'finish', finishReason };
}

/** The text and tool-call chunks of a choice's `delta` or `message`. */
function* answerChunks(read: WireReader, answer: WireObject | undefined, where: string): Generator<ModelChunk> {
  if (!answer) return;
  const content = contentText(read, answer.content, `${where}.content`);
  if (content) yield { type: 'text', delta: content };
  // A refusal comes in its own field instead of the content: it is the answer the user gets.
  const refusal = read.string(answer.refusal, `${where}.refusal`);
  if (refusal) yield { type: 'text', delta: refusal };
  for (const [position, call] of read.array(answer.tool_calls, `${where}.tool_calls`).entries()) {
    yield toToolCallChunk(read, read.entry(call, `${where}.tool_calls[${position}]`), position);
  }
}

/** A message's text: a string, or text parts (`[{ type: 'text', text }]`), which some
 *  compatible servers answer with as requests may be written; other parts carry no text. */
function contentText(read: WireReader, content: unknown, where: string): string | undefined {
  if (!Array.isArray(content)) return read.string(content, where);
  return content
    .map((part, i) => {
      const entry = read.entry(part, `${where}[${i}]`);
      return entry.type === 'text' ? (read.string(entry.text, `${where}[${i}].text`) ?? '') : '';
    })
    .join('');
}

function toToolCallChunk(read: WireReader, call: WireObject, position: number): ModelChunk {
  const fn = read.object(call.function, 'tool_calls[].function');
  // JSON text per the spec; some compatible servers send the object itself.
  const args = fn?.arguments;
  const chunk: Extract<ModelChunk, { type: 'tool_call' }> = {
    type: 'tool_call',
    // `index` is in the spec, but some compatible servers leave it out of single-call deltas.
    index: read.index(call.index, 'tool_calls[].index') ?? position,
    argumentsDelta: typeof args === 'object' && args !== null ? JSON.stringify(args) : (read.string(args, 'tool_calls[].function.arguments') ?? ''),
  };
  const id = read.string(call.id, 'tool_calls[].id');
  const name = read.string(fn?.name, 'tool_calls[].function.name');
  if (id) chunk.id = id;
  if (name) chunk.name = name;
  return chunk;
}

function toUsage(read: WireReader, value: unknown): Usage | undefined {
  const usage = loose(value);
  if (!usage) return undefined;
  return { inputTokens: read.count(usage.prompt_tokens) ?? 0, outputTokens: read.count(usage.completion_tokens) ?? 0 };
}

function throwIfError(ctx: HttpContext, chunk: WireObject, raw: string | (() => string)): void {
  // Some servers send `"error": null` (or another falsy value) in every chunk.
  if (!chunk.error) return;
  const error = typeof chunk.error === 'object' ? (chunk.error as WireObject) : { message: String(chunk.error) };
  const status = typeof error.code === 'number' ? error.code : undefined;
  const type = typeof error.type === 'string' ? error.type : '';
  const retryable = (status !== undefined && (status === 429 || status >= 500)) || /server_error|overloaded|rate_limit/.test(type);
  const message = typeof error.message === 'string' ? error.message : textOf(raw).slice(0, 200);
  throw streamedError(ctx, `server error in stream: ${message}`, { status, retryable, body: textOf(raw) });
}
