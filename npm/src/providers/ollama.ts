/**
 * Ollama native chat provider (`POST {baseURL}/api/chat`; a `baseURL` ending in `/v1`, the
 * OpenAI-compatible endpoint's, is read as the server's root), streaming newline-delimited JSON.
 * Prefer it over Ollama's OpenAI-compatible `/v1` when you want its token counts and its
 * whole-object tool calls.
 *
 * Wire format: https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion
 *
 * Thinking (https://docs.ollama.com/capabilities/thinking): with `think` on, a thinking model's
 * reasoning comes apart from its answer, under `message.thinking`, a piece a line when streamed.
 * It is never answer text. The docs ask for a tool-call turn's thinking back with that turn:
 * "gather every chunk of `thinking`, `content`, and `tool_calls`, then return those fields
 * together with any tool results in the follow-up request"
 * (https://docs.ollama.com/capabilities/tool-calling, "Tool calling with streaming"; also
 * https://docs.ollama.com/capabilities/streaming), and the message object takes a `thinking`
 * field (docs/api.md, "Generate a chat completion"). gpt-oss most of all: its harmony format
 * keeps a tool-call turn's reasoning for the turns after it, since the model calls tools "as
 * part of its chain-of-thought" (https://cookbook.openai.com/articles/openai-harmony, "Function
 * calling"). So the thinking travels with the turn's calls as their `providerData` ({@link
 * Echo}), as the community Ollama provider for the Vercel AI SDK (ollama-ai-provider-v2) sends
 * a turn's reasoning back as `thinking`. Which past thinking the model then sees is the
 * server's template's to decide. A final answer's thinking is not kept: the docs call sending
 * it back important for tool calls in particular, and the runtime keeps nothing of an answer
 * without calls but its text.
 *
 * @module
 */

import {
  expectObject,
  protocolError,
  readJson,
  readNdjson,
  streamedError,
  functionTools,
  argumentsObject,
  postProvider,
  mergeHeaders,
  checkProviderOptions,
  optionError,
  type HttpContext,
} from './http.js';
import { isRecord } from '../errors.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, OllamaOptions, ProviderOptions } from './types.js';
import { carriesNews, lazyText, loose, WireReader } from './wire.js';
import { appendedBytes, ProviderDataBudget } from './provider-data.js';

/** Default endpoint of a local Ollama. */
export const OLLAMA_DEFAULT_BASE_URL = 'http://127.0.0.1:11434';

/** The thinking levels `think` takes besides `true` and `false`: gpt-oss's, the ones ollama-js
 *  types (https://docs.ollama.com/capabilities/thinking). */
const THINK_LEVELS: readonly unknown[] = ['low', 'medium', 'high'] satisfies Array<OllamaOptions['think']>;

/** The options of this provider beyond every provider's (a misspelt one is refused). */
const OLLAMA_OPTIONS = Object.keys({ options: true, keepAlive: true, think: true } satisfies Record<Exclude<keyof OllamaOptions, keyof ProviderOptions>, true>);

/**
 * Creates a provider for a local or remote Ollama server.
 *
 * @example
 * ```ts
 * const model = ollama({ model: 'qwen3:4b' });
 * ```
 */
export function ollama(options: OllamaOptions): ModelProvider {
  checkProviderOptions('ollama', options, OLLAMA_OPTIONS);
  const { options: modelOptions, keepAlive, think } = options;
  if (modelOptions != null && !isRecord(modelOptions)) throw optionError('ollama', 'options', 'an object such as { num_ctx: 8192 }', modelOptions);
  if (keepAlive != null && typeof keepAlive !== 'string' && typeof keepAlive !== 'number') throw optionError('ollama', 'keepAlive', 'a duration such as "10m" or a number of seconds', keepAlive);
  if (think != null && typeof think !== 'boolean' && !THINK_LEVELS.includes(think)) {
    throw optionError('ollama', 'think', `true, false or a level, ${THINK_LEVELS.map((level) => `'${level}'`).join(', ')}`, think);
  }
  const wire: WireOptions = { modelOptions: modelOptions ?? {}, keepAlive: keepAlive ?? undefined, think: think ?? undefined };
  // Ollama itself needs no key; hosted Ollama-compatible gateways take a Bearer token.
  const headers = mergeHeaders(options.headers, options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : undefined);
  // `/v1` is Ollama's OpenAI-compatible endpoint: a base URL copied from its docs reaches the
  // native API at the server's root, not a 404 at `/v1/api/chat`.
  const baseURL = options.baseURL?.replace(/\/v1\/*$/, '');
  return postProvider({
    name: 'ollama',
    options: baseURL === options.baseURL ? options : { ...options, baseURL },
    defaultBaseURL: OLLAMA_DEFAULT_BASE_URL,
    path: 'api/chat',
    headers,
    toWire: (model, request, streaming) => toWireRequest(model, request, streaming, wire),
    parse: async function* (ctx, response, streaming) {
      const lines = streaming ? readNdjson(ctx, response, 'provider') : single(await readJson(ctx, response));
      yield* parseLines(ctx, lines);
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping

/** A tool call's `providerData` from this provider: what Ollama takes back with a past call,
 *  under the wire's own name. */
interface Echo {
  /** The turn's `thinking`, whole, on the turn's last call only. */
  thinking?: string;
}

/** What {@link OllamaOptions} add to every request. */
interface WireOptions {
  modelOptions: Record<string, unknown>;
  keepAlive: string | number | undefined;
  think: OllamaOptions['think'];
}

function toWireRequest(model: string, request: ModelRequest, streaming: boolean, wire: WireOptions): Record<string, unknown> {
  const body: Record<string, unknown> = { model, messages: request.messages.map(toWireMessage), stream: streaming };
  // The chat API has no tool choice: `none` and a named tool narrow the tools sent instead;
  // `required` cannot be expressed (see `ToolChoice`).
  const choice = request.toolChoice;
  const tools = choice === 'none' ? [] : typeof choice === 'object' ? request.tools.filter((t) => t.name === choice.tool) : request.tools;
  if (tools.length > 0) {
    body.tools = functionTools(tools);
  }
  // `format` takes `"json"` or, since Ollama 0.5, a JSON Schema.
  const format = request.responseFormat;
  if (format !== undefined) body.format = format === 'json' ? 'json' : format.jsonSchema.schema;
  if (wire.keepAlive !== undefined) body.keep_alive = wire.keepAlive;
  // Absent, the model's default: Ollama reads no `think` as it did before the field existed.
  if (wire.think !== undefined) body.think = wire.think;
  const modelOptions: Record<string, unknown> = { ...wire.modelOptions };
  if (request.temperature !== undefined) modelOptions.temperature = request.temperature;
  if (request.maxTokens !== undefined) modelOptions.num_predict = request.maxTokens;
  if (Object.keys(modelOptions).length > 0) body.options = modelOptions;
  return body;
}

function toWireMessage(message: ChatMessage): Record<string, unknown> {
  switch (message.role) {
    case 'system':
    case 'user':
      return { role: message.role, content: message.content };
    case 'assistant': {
      if (!message.toolCalls?.length) return { role: 'assistant', content: message.content };
      let thinking: string | undefined;
      const wire: Record<string, unknown> = {
        role: 'assistant',
        content: message.content,
        // Ollama takes arguments as an object, not as JSON text.
        tool_calls: message.toolCalls.map((call) => {
          // Read leniently: stored state may hold what another provider gave, or anything.
          const echo = loose(call.providerData) as Echo | undefined;
          if (typeof echo?.thinking === 'string') thinking ??= echo.thinking;
          return { function: { name: call.name, arguments: argumentsObject(call.arguments) } };
        }),
      };
      // Only thinking the server sent is sent back: a turn without any gets no empty field.
      if (thinking !== undefined) wire.thinking = thinking;
      return wire;
    }
    case 'tool':
      return { role: 'tool', content: message.content, tool_name: message.name };
  }
}

// ---------------------------------------------------------------------------------------------
// Response mapping

async function* parseLines(ctx: HttpContext, lines: AsyncIterable<unknown>): AsyncGenerator<ModelChunk> {
  let callIndex = 0;
  const turn = new TurnThinking(ctx);
  for await (const value of lines) {
    // The line's text is needed only to quote it in an error: made then, not for every line.
    const raw = lazyText(value);
    const line = expectObject(ctx, value, raw);
    const read = new WireReader(ctx, raw);
    // Some servers write every absent field, `"error": null` among them, on every line.
    if (line.error) {
      throw streamedError(ctx, `server error in stream: ${typeof line.error === 'string' ? line.error : raw().slice(0, 200)}`, { retryable: false, body: raw() });
    }
    const message = read.object(line.message, 'message');
    // Lines whose message carries nothing are keep-alives (see `carriesNews`); thinking is not.
    if (carriesNews(message) || line.done) ctx.progress?.();
    // Thinking is never text, even when a line carries both.
    turn.thinking(message?.thinking);
    const content = read.string(message?.content, 'message.content');
    if (content) yield { type: 'text', delta: content };
    for (const [position, entry] of read.array(message?.tool_calls, 'message.tool_calls').entries()) {
      const call = read.entry(entry, `message.tool_calls[${position}]`);
      const fn = read.object(call.function, 'tool_calls[].function');
      const args = fn?.arguments;
      const chunk = {
        type: 'tool_call',
        index: callIndex++,
        // Ollama sends no call ids; tool results are matched by name on its side, ids on ours.
        id: read.string(call.id, 'tool_calls[].id') || generateCallId(),
        name: read.string(fn?.name, 'tool_calls[].function.name') ?? '',
        argumentsDelta: typeof args === 'string' ? args : JSON.stringify(args ?? {}),
      } satisfies ModelChunk;
      turn.call(chunk);
      yield chunk;
    }
    if (read.boolean(line.done, 'done')) {
      yield* turn.chunks();
      const finishReason = read.string(line.done_reason, 'done_reason') || 'stop';
      const [inputTokens, outputTokens] = [read.count(line.prompt_eval_count), read.count(line.eval_count)];
      if (inputTokens === undefined && outputTokens === undefined) {
        yield { type: 'finish', finishReason };
      } else {
        yield { type: 'finish', finishReason, usage: { inputTokens: inputTokens ?? 0, outputTokens: outputTokens ?? 0 } };
      }
      return;
    }
  }
  throw protocolError(ctx, 'stream ended before a `done: true` line');
}

/**
 * A turn's thinking, gathered from its lines (a piece a line, or whole in one) for its tool
 * calls to take back (see the module's notes), and given once the answer ended, with its last
 * call, by that call's id: the thinking may go on after a call. What is kept is counted as it
 * comes ({@link ProviderDataBudget}): past the core's bound, the answer fails as soon as it has
 * a call to give it to; thinking streamed past the bound on all reasoning fails it at once,
 * kept or not. The field is read leniently, being no part of the answer: a server sending
 * something else under that name must not fail it.
 */
class TurnThinking {
  private readonly pieces: string[] = [];
  private readonly budget: ProviderDataBudget;
  private last: { index: number; id: string } | undefined;

  constructor(ctx: HttpContext) {
    this.budget = new ProviderDataBudget(ctx);
  }

  thinking(value: unknown): void {
    if (typeof value !== 'string' || value === '') return;
    if (this.budget.add(appendedBytes(value), '`message.thinking`')) this.pieces.push(value);
    // The turn's thinking goes with its last call, which may have come already.
    if (this.last) this.budget.assertKept();
  }

  call(chunk: { index: number; id: string }): void {
    this.last = { index: chunk.index, id: chunk.id };
    this.budget.assertKept();
  }

  /** The piece that gives the last call the turn's thinking: one copy in stored state, and one
   *  is all the message sends back. */
  *chunks(): Generator<ModelChunk> {
    if (!this.last || this.pieces.length === 0) return;
    const echo: Echo = { thinking: this.pieces.join('') };
    yield { type: 'tool_call', index: this.last.index, id: this.last.id, argumentsDelta: '', providerData: echo };
  }
}

async function* single(value: unknown): AsyncGenerator<unknown> {
  yield value;
}

let callCounter = 0;
function generateCallId(): string {
  // `crypto.randomUUID` exists only in secure browser contexts; ids only need to be unique per run.
  callCounter += 1;
  return `ollama_call_${Date.now().toString(36)}_${callCounter}`;
}
