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
  mergeHeaders,
  errorWords,
  checkProviderOptions,
  repliesWithJson,
  optionError,
  argumentsText,
  type HttpContext,
} from './http.js';
import { isRecord, type ProviderError } from '../errors.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, OpenAIOptions, ProviderOptions, Usage } from './types.js';
import { carriesNews, lazyText, loose, WireReader, type WireObject } from './wire.js';
import { appendedBytes, jsonBytes, ProviderDataBudget } from './provider-data.js';

/** Default endpoint; override `baseURL` for any compatible server (e.g. `http://127.0.0.1:8080/v1`). */
export const OPENAI_DEFAULT_BASE_URL = 'https://api.openai.com/v1';

/** The options of this provider beyond every provider's (a misspelt one is refused). */
const OPENAI_OPTIONS = Object.keys({ reasoningModel: true, reasoningEffort: true, streamUsage: true } satisfies Record<Exclude<keyof OpenAIOptions, keyof ProviderOptions>, true>);

/**
 * Creates a provider for an OpenAI-compatible `/chat/completions` endpoint.
 *
 * Some servers need back, on a past tool-call turn, what they sent with it: DeepSeek in
 * thinking mode the turn's `reasoning_content` (else it answers 400), Gemini 3 each call's
 * `extra_content` (its thought signature), OpenRouter the turn's `reasoning_details`, unchanged
 * and in order (the reasoning of Gemini 3, whose thought signatures travel there, and of
 * Anthropic's and OpenAI's reasoning models). The provider gives them with the calls as their
 * `providerData` ({@link Echo}), which the runtime keeps with the conversation, and sends them
 * back from there: a run resumed in another process, or with another provider object, still
 * has them.
 *
 * @example
 * ```ts
 * const model = openai({ model: 'gpt-4o-mini', apiKey: process.env.OPENAI_API_KEY });
 * for await (const chunk of model.stream({ messages, tools: [] })) console.log(chunk);
 * ```
 */
export function openai(options: OpenAIOptions): ModelProvider {
  checkProviderOptions('openai', options, OPENAI_OPTIONS);
  const { reasoningModel = isReasoningModel(options.model), reasoningEffort } = options;
  if (typeof reasoningModel !== 'boolean') throw optionError('openai', 'reasoningModel', 'true or false', reasoningModel);
  if (reasoningEffort != null && typeof reasoningEffort !== 'string') throw optionError('openai', 'reasoningEffort', 'a string such as "low"', reasoningEffort);
  const { streamUsage } = options;
  if (streamUsage != null && typeof streamUsage !== 'boolean') throw optionError('openai', 'streamUsage', 'true or false', streamUsage);
  const wire: WireOptions = { reasoningModel, reasoningEffort: reasoningEffort ?? undefined, streamUsage: streamUsage ?? true };
  // Local servers (llama-server, vLLM) need no key; sending an empty Bearer confuses some proxies.
  const headers = mergeHeaders(options.headers, options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : undefined);
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
    adapt: (error, sent) => {
      if (!refusesStreamOptions(error, sent)) return false;
      wire.streamUsage = false;
      return true;
    },
  });
}

/** Whether a server refused a request over its `stream_options` (Mistral: 422 naming it as an
 *  extra input; Azure AI Foundry: 400 "Extra parameters ['stream_options'] are not allowed"). */
function refusesStreamOptions(error: ProviderError, sent: unknown): boolean {
  const { status } = error;
  return (
    status !== undefined && status >= 400 && status < 500 &&
    (sent as { stream_options?: unknown }).stream_options !== undefined && /stream_options/.test(error.body ?? '')
  );
}

// ---------------------------------------------------------------------------------------------
// Request mapping

/** What {@link OpenAIOptions} change in every request. */
interface WireOptions {
  reasoningModel: boolean;
  reasoningEffort: string | undefined;
  /** Cleared once the server refused `stream_options`: it holds for the later requests too. */
  streamUsage: boolean;
}

/** A tool call's `providerData` from this provider: what a server needs back with a past
 *  call, under the wire's own names. */
interface Echo {
  /** The turn's `reasoning_content` (DeepSeek thinking mode), on the turn's last call only. */
  reasoning_content?: string;
  /** The call's `extra_content` (Gemini: `{ google: { thought_signature } }`), sent back as it came. */
  extra_content?: unknown;
  /** The turn's `reasoning_details` (OpenRouter), on the turn's last call only: its items
   *  whole, streamed pieces merged (see {@link ReasoningDetails}). */
  reasoning_details?: WireObject[];
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
  // Without this, streamed answers from OpenAI itself carry no token counts at all.
  if (streaming && wire.streamUsage) body.stream_options = { include_usage: true };
  return body;
}

function toWireMessage(message: ChatMessage): Record<string, unknown> {
  switch (message.role) {
    case 'system':
    case 'user':
      return { role: message.role, content: message.content };
    case 'assistant': {
      if (!message.toolCalls?.length) return { role: 'assistant', content: message.content };
      let reasoning: string | undefined;
      let details: WireObject[] | undefined;
      const wire: Record<string, unknown> = {
        role: 'assistant',
        // OpenAI documents `null` content for a pure tool-call turn; "" is rejected by some servers.
        content: message.content === '' ? null : message.content,
        tool_calls: message.toolCalls.map((call) => {
          // Read leniently: stored state may hold what another provider gave, or anything.
          const echo = loose(call.providerData) as Echo | undefined;
          if (typeof echo?.reasoning_content === 'string') reasoning ??= echo.reasoning_content;
          details ??= reasoningDetailsToSend(echo?.reasoning_details);
          return {
            id: call.id,
            type: 'function',
            // Servers that parse past calls when they build the prompt (vLLM) would refuse the
            // whole next turn over arguments that are not a JSON object.
            function: { name: call.name, arguments: argumentsText(call.arguments) },
            ...(echo?.extra_content != null && { extra_content: echo.extra_content }),
          };
        }),
      };
      // Only what the server sent is sent back: servers that never sent it get nothing new.
      if (reasoning !== undefined) wire.reasoning_content = reasoning;
      if (details !== undefined) wire.reasoning_details = details;
      return wire;
    }
    case 'tool':
      return { role: 'tool', tool_call_id: message.toolCallId, content: message.content };
  }
}

/** Stored `reasoning_details` as OpenRouter takes them back: a non-empty array of its
 *  `reasoning.*` items, else nothing. Anything else (another provider's data after a switch, an
 *  edited state) is not sent, and not in part either: OpenRouter wants the turn's sequence
 *  whole, so a partial one would be refused like a changed one. */
function reasoningDetailsToSend(value: unknown): WireObject[] | undefined {
  if (!Array.isArray(value) || value.length === 0) return undefined;
  return value.every(isReasoningDetail) ? value : undefined;
}

function isReasoningDetail(value: unknown): value is WireObject {
  return isRecord(value) && typeof value.type === 'string' && value.type.startsWith('reasoning.');
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
  const turn = new TurnEchoes(ctx);

  for await (const event of events) {
    if (event.data === '[DONE]') {
      terminated = true;
      break;
    }
    // Servers name a failure with the event type whatever the data holds (`{ code, details }`,
    // the Responses API's flat `{ type, code, message }`, plain text) and often close with
    // `[DONE]`: read as a chunk, it had no choices and the answer so far passed for finished.
    if (event.event === 'error') throw streamError(ctx, errorEventBody(event.data), event.data);
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
    yield* answerChunks(read, delta, 'delta', turn);
    finishReason = read.string(choice.finish_reason, 'finish_reason') || finishReason;
  }

  // A body that ends with neither `[DONE]` nor a finish reason was cut off mid-answer.
  if (!terminated && finishReason === undefined) throw protocolError(ctx, 'stream ended before the answer finished');
  yield* turn.chunks();
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
  const turn = new TurnEchoes(ctx);
  yield* answerChunks(read, message, 'message', turn);
  yield* turn.chunks();
  const usage = toUsage(read, completion.usage);
  const finishReason = read.string(choice.finish_reason, 'finish_reason') || 'stop';
  yield usage ? { type: 'finish', finishReason, usage } : { type: 'finish', finishReason };
}

/** What one answer carries that its tool calls need sent back (see {@link Echo}), gathered
 *  from its deltas or its message. A call's signature goes as the `providerData` of the very
 *  piece that brought it, so it reaches the call the core puts that piece on even when a
 *  server numbers every call alike; the turn's reasoning (`reasoning_content`,
 *  `reasoning_details`) is all known only once the answer ended (DeepSeek may stream it after
 *  a call's first piece), and goes then with the last call, which is always the latest at its
 *  index and so the one a piece naming it reaches. What is kept is counted as it comes
 *  ({@link ProviderDataBudget}): past the core's bound, the answer fails as soon as it has a
 *  call to give it to, not once it ended. The plain `reasoning` text some servers stream beside it (vLLM,
 *  OpenRouter) is progress only, and not kept. */
class TurnEchoes {
  private reasoning: string[] | undefined;
  private readonly budget: ProviderDataBudget;
  private readonly details: ReasoningDetails;
  /** The calls so far, split as the core splits them by id: a piece bringing another id than
   *  the latest call at its index starts a call of its own. */
  private readonly calls: Array<{ index: number; id?: string; extra?: unknown; extraBytes?: number }> = [];

  constructor(ctx: HttpContext) {
    this.budget = new ProviderDataBudget(ctx);
    this.details = new ReasoningDetails(this.budget);
  }

  /** Read leniently: it is no part of the answer, which a server sending something else under
   *  that name must not fail. */
  answer(answer: WireObject, streamed: boolean): void {
    if (typeof answer.reasoning_content === 'string' && this.budget.add(appendedBytes(answer.reasoning_content), '`reasoning_content`')) {
      (this.reasoning ??= []).push(answer.reasoning_content);
    }
    if (Array.isArray(answer.reasoning_details)) this.details.add(answer.reasoning_details, streamed);
    // The turn's reasoning goes with its last call, which may have come already.
    if (this.calls.length > 0) this.budget.assertKept();
  }

  call(chunk: Extract<ModelChunk, { type: 'tool_call' }>, wire: WireObject): void {
    let call = this.calls.filter((c) => c.index === chunk.index).at(-1);
    if (!call || (chunk.id && call.id && chunk.id !== call.id)) this.calls.push((call = { index: chunk.index }));
    if (chunk.id) call.id = chunk.id;
    if (wire.extra_content != null) {
      // A call's signature given again replaces the one it had, as in the core.
      const bytes = jsonBytes(wire.extra_content);
      this.budget.add(bytes - (call.extraBytes ?? 0), '`extra_content`');
      call.extra = wire.extra_content;
      call.extraBytes = bytes;
      chunk.providerData = { extra_content: call.extra } satisfies Echo;
    }
    this.budget.assertKept();
  }

  /** The piece that gives the last call the turn's reasoning, with the signature it has (a
   *  call's `providerData` is the last one given). One copy in stored state, and one is all
   *  the message sends back. */
  *chunks(): Generator<ModelChunk> {
    const last = this.calls.at(-1);
    const details = this.details.items();
    if ((this.reasoning === undefined && details === undefined) || !last) return;
    const echo: Echo = {};
    if (this.reasoning !== undefined) echo.reasoning_content = this.reasoning.join('');
    if (details !== undefined) echo.reasoning_details = details;
    if (last.extra !== undefined) echo.extra_content = last.extra;
    yield { type: 'tool_call', index: last.index, ...(last.id && { id: last.id }), argumentsDelta: '', providerData: echo };
  }
}

/**
 * A turn's OpenRouter `reasoning_details`: `{ type, id, format, index, … }` items of type
 * `reasoning.text` (`text`, `signature`), `reasoning.summary` (`summary`) or
 * `reasoning.encrypted` (`data`: Gemini's thought signatures among them), which OpenRouter
 * wants back with the turn, "unmodified", "the entire sequence of consecutive reasoning
 * blocks", not rearranged (https://openrouter.ai/docs/use-cases/reasoning-tokens, "Preserving
 * Reasoning Blocks" and "Responses API Shape"). Whole under `message.reasoning_details`;
 * streamed under `delta.reasoning_details`, built, the docs say, "by concatenating all chunks
 * in order", and `index` is the item's place in the sequence. What servers stream is one item
 * in many pieces at the same `index`: its text a few words at a time, then a text-less piece
 * with the signature (Anthropic; a signature replayed on a fragment is refused, "Invalid
 * `signature` in `thinking` block": agno-agi/agno#8794, OpenRouterTeam/ai-sdk-provider#423), or
 * OpenAI's summary a few words a piece at index 0.
 *
 * The merge rule the docs leave open is taken at its narrowest: a piece continues the item
 * with the same `index` and `type`, its `text`, `summary` and `data` appended and its other
 * fields filling those the item lacks (never overwriting one); a piece without an `index` is
 * kept as it came, as is every item of a whole message. Pieces that are not such objects
 * carry nothing that could be sent back and are left out: the field is read leniently, being
 * no part of the answer.
 */
class ReasoningDetails {
  private readonly list: WireObject[] = [];
  /** The streamed items by type and index, to find the one a piece continues. */
  private readonly byPlace = new Map<string, WireObject>();

  constructor(private readonly budget: ProviderDataBudget) {}

  add(pieces: unknown[], streamed: boolean): void {
    for (const piece of pieces) {
      if (!isReasoningDetail(piece)) continue;
      const place = streamed && typeof piece.index === 'number' ? JSON.stringify([piece.type, piece.index]) : undefined;
      const item = place === undefined ? undefined : this.byPlace.get(place);
      if (!item) {
        if (!this.budget.add(jsonBytes(piece), '`reasoning_details`')) continue;
        const started = { ...piece };
        this.list.push(started);
        if (place !== undefined) this.byPlace.set(place, started);
        continue;
      }
      for (const [key, value] of Object.entries(piece)) {
        if (value === null || value === undefined) continue;
        const had = Object.hasOwn(item, key) ? item[key] : undefined;
        const appended = APPENDED_FIELDS.has(key) && typeof value === 'string';
        if (!appended && had !== null && had !== undefined) continue;
        // A field the item lacked costs its name too: a server giving new names must not grow
        // the item unseen.
        if (!this.budget.add(appended && typeof had === 'string' ? appendedBytes(value) : jsonBytes(key) + jsonBytes(value), '`reasoning_details`')) continue;
        setField(item, key, appended ? (typeof had === 'string' ? had : '') + value : value);
      }
    }
  }

  /** The items, or none at all when the turn had none (no `reasoning_details: []` sent). */
  items(): WireObject[] | undefined {
    return this.list.length > 0 ? this.list : undefined;
  }
}

/** The fields of a reasoning item a server streams in pieces. */
const APPENDED_FIELDS = new Set(['text', 'summary', 'data']);

/** Sets a field the server named, as data: a field named `__proto__` is kept like any other
 *  instead of replacing the object's prototype. */
function setField(item: WireObject, key: string, value: unknown): void {
  Object.defineProperty(item, key, { value, writable: true, enumerable: true, configurable: true });
}

/** The text and tool-call chunks of a choice's `delta` or `message`. */
function* answerChunks(read: WireReader, answer: WireObject | undefined, where: string, turn: TurnEchoes): Generator<ModelChunk> {
  if (!answer) return;
  turn.answer(answer, where === 'delta');
  const content = contentText(read, answer.content, `${where}.content`);
  if (content) yield { type: 'text', delta: content };
  // A refusal comes in its own field instead of the content: it is the answer the user gets.
  const refusal = read.string(answer.refusal, `${where}.refusal`);
  if (refusal) yield { type: 'text', delta: refusal };
  for (const [position, entry] of read.array(answer.tool_calls, `${where}.tool_calls`).entries()) {
    const call = read.entry(entry, `${where}.tool_calls[${position}]`);
    const chunk = toToolCallChunk(read, call, position);
    turn.call(chunk, call);
    yield chunk;
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

function toToolCallChunk(read: WireReader, call: WireObject, position: number): Extract<ModelChunk, { type: 'tool_call' }> {
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
  throw streamError(ctx, chunk.error, raw);
}

/** What an `event: error` reports: its `error` when it has one, else the whole of its data
 *  (read leniently: an error event's data is the server's words, not an answer to check). */
function errorEventBody(data: string): unknown {
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    return data;
  }
  const body = loose(value);
  return body?.error ? body.error : (body ?? data);
}

/** The `ProviderError` for an error a server reported inside a 200 stream: an object with a
 *  `message` (or vLLM-style `details`), a numeric `code` as its status, or a bare string. */
function streamError(ctx: HttpContext, reported: unknown, raw: string | (() => string)): ProviderError {
  const error = loose(reported) ?? { message: String(reported) };
  const status = typeof error.code === 'number' ? error.code : undefined;
  const kind = [error.type, error.code].filter((v) => typeof v === 'string').join(' ');
  const retryable = (status !== undefined && (status === 429 || status >= 500)) || /server_error|overloaded|rate_limit/.test(kind);
  const message = errorWords(error) ?? textOf(raw).slice(0, 200);
  return streamedError(ctx, `server error in stream: ${message}`, { status, retryable, body: textOf(raw) });
}
