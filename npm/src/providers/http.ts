/**
 * The one place where providers touch the network: a JSON POST with a per-attempt timeout,
 * retries with exponential backoff and jitter, and the mapping of every failure to a
 * `ProviderError` or `AbortError`. Wire-format parsing stays in the provider files; the
 * stream readers here (SSE, NDJSON, whole JSON) only turn bytes into messages.
 *
 * Retrying is done around a whole *attempt* (request + parsing) rather than around `fetch`
 * alone, so an error that shows up in the body before anything was yielded (an `overloaded`
 * event as the first SSE message, a connection reset before the first byte) is retried too.
 * Once a chunk reached the consumer, a retry would duplicate output, so errors then propagate.
 *
 * @module
 */

import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { AbortError, CrucibleError, describeValue, isRecord, MAX_TIMER_MS, ProviderError, unknownOptionsError } from '../errors.js';
import { linkSignals } from '../signals.js';
import type { ModelChunk, ModelProvider, ModelRequest, ProviderOptions, RetryOptions, ToolDefinition } from './types.js';

/** Bytes of an error body kept on `ProviderError.body`; enough to read a server's message. */
const BODY_EXCERPT_LIMIT = 2048;
const DEFAULT_TIMEOUT_MS = 120_000;
const DEFAULT_RETRY: Required<RetryOptions> = { maxRetries: 2, initialDelayMs: 500, maxDelayMs: 8000 };

/** Resolved transport settings shared by one provider instance. */
export interface HttpContext {
  /** Provider id stamped on every error, e.g. `openai:gpt-4o-mini`. */
  readonly provider: string;
  readonly fetch: typeof globalThis.fetch;
  readonly timeoutMs: number;
  readonly retry: Required<RetryOptions>;
  /** Called whenever the response makes progress: an event or line with data, a piece of a
   *  whole body that is not blank (see {@link withRetry}'s stall timer). */
  readonly progress?: () => void;
}

/** The options every provider factory takes (`ProviderOptions`). */
const PROVIDER_OPTIONS = Object.keys({
  model: true, baseURL: true, apiKey: true, headers: true, timeoutMs: true, retry: true, stream: true, fetch: true, extraBody: true,
} satisfies Record<keyof ProviderOptions, true>);

/** What other SDKs (and createAgent) call some of them, and options that belong elsewhere. */
const PROVIDER_OPTION_ALIASES: Readonly<Record<string, string>> = {
  baseUrl: 'baseURL', base_url: 'baseURL', url: 'baseURL', host: 'baseURL', endpoint: 'baseURL',
  api_key: 'apiKey', apikey: 'apiKey', key: 'apiKey',
  timeout: 'timeoutMs', retries: 'retry: { maxRetries }', maxRetries: 'retry: { maxRetries }',
  maxTokens: "createAgent's maxTokens", max_tokens: "createAgent's maxTokens", temperature: "createAgent's temperature",
};

/** The `invalid_config` error for a provider factory's option `name` that is not `expected`. */
export function optionError(provider: string, name: string, expected: string, got: unknown): CrucibleError {
  return new CrucibleError('invalid_config', `${provider}(): \`${name}\` must be ${expected} (got ${describeValue(got)})`);
}

/**
 * Checks a provider factory's options before anything reads them, so a mistake surfaces as
 * `invalid_config` when the provider is created, not as a `TypeError`, a request to the wrong
 * server or a retry loop that never ends. `null` counts as not given, as the defaults treat it.
 */
export function checkProviderOptions(provider: string, options: unknown, own: readonly string[]): asserts options is ProviderOptions {
  const where = `${provider}()`;
  if (!isRecord(options)) {
    throw new CrucibleError('invalid_config', `${where} needs an options object, e.g. ${provider}({ model: 'name-of-the-model' }) (got ${describeValue(options)})`);
  }
  // A misspelt option would be dropped: `base_url` sent the prompt to the default server.
  const unknown = unknownOptionsError(options, [...PROVIDER_OPTIONS, ...own], where, PROVIDER_OPTION_ALIASES);
  if (unknown) throw unknown;
  const { model, baseURL, apiKey, headers, stream, fetch, timeoutMs, retry, extraBody } = options;
  if (typeof model !== 'string' || model.trim() === '') {
    throw optionError(provider, 'model', 'a non-empty string naming the model', model);
  }
  if (baseURL != null) checkBaseURL(where, baseURL);
  if (apiKey != null && typeof apiKey !== 'string') {
    throw optionError(provider, 'apiKey', 'a string', apiKey);
  }
  if (headers != null && !isRecord(headers)) {
    throw optionError(provider, 'headers', 'an object of header names to values', headers);
  }
  if (extraBody != null && !isRecord(extraBody)) {
    throw optionError(provider, 'extraBody', 'an object of request body fields, such as { seed: 7 }', extraBody);
  }
  if (stream != null && typeof stream !== 'boolean') {
    throw optionError(provider, 'stream', 'true or false', stream);
  }
  if (fetch != null && typeof fetch !== 'function') {
    throw optionError(provider, 'fetch', 'a function', fetch);
  }
  if (timeoutMs != null && !(typeof timeoutMs === 'number' && timeoutMs > 0 && timeoutMs <= MAX_TIMER_MS)) {
    throw optionError(provider, 'timeoutMs', `a number of milliseconds above 0 and at most ${MAX_TIMER_MS}`, timeoutMs);
  }
  if (retry != null) {
    if (!isRecord(retry)) {
      throw optionError(provider, 'retry', 'an object such as { maxRetries: 2 }', retry);
    }
    const { maxRetries, initialDelayMs, maxDelayMs } = retry;
    if (maxRetries != null && !(Number.isInteger(maxRetries) && (maxRetries as number) >= 0)) {
      throw optionError(provider, 'retry.maxRetries', 'a whole number, 0 or more', maxRetries);
    }
    for (const [key, value] of [['initialDelayMs', initialDelayMs], ['maxDelayMs', maxDelayMs]] as const) {
      if (value != null && !(typeof value === 'number' && value >= 0 && value <= MAX_TIMER_MS)) {
        throw optionError(provider, `retry.${key}`, `a number of milliseconds from 0 to ${MAX_TIMER_MS}`, value);
      }
    }
  }
}

/** A base URL must be absolute http(s): a relative one would be resolved against the page. */
function checkBaseURL(where: string, baseURL: unknown): void {
  const problem = `${where}: \`baseURL\` must be an absolute http:// or https:// URL such as http://127.0.0.1:8080/v1`;
  if (typeof baseURL !== 'string') throw new CrucibleError('invalid_config', `${problem} (got ${describeValue(baseURL)})`);
  let url: URL;
  try {
    url = new URL(baseURL);
  } catch (cause) {
    throw new CrucibleError('invalid_config', `${problem} (got ${JSON.stringify(baseURL)})`, { cause });
  }
  if (url.protocol !== 'http:' && url.protocol !== 'https:') {
    throw new CrucibleError('invalid_config', `${problem} (got ${JSON.stringify(baseURL)})`);
  }
}

/** Fills the transport defaults from the user's options (checked by {@link checkProviderOptions}). */
export function httpContext(provider: string, options: ProviderOptions): HttpContext {
  if (typeof (options.fetch ?? globalThis.fetch) !== 'function') {
    throw new CrucibleError('invalid_config', 'No fetch implementation: pass `fetch` in the provider options');
  }
  const retry = { ...DEFAULT_RETRY, ...definedOnly(options.retry ?? {}) };
  return {
    provider,
    // Calling a detached `globalThis.fetch` throws "Illegal invocation" in browsers.
    fetch: options.fetch ?? ((input, init) => globalThis.fetch(input, init)),
    timeoutMs: Math.ceil(options.timeoutMs ?? DEFAULT_TIMEOUT_MS),
    retry,
  };
}

/** What distinguishes one fetch provider from another; the rest is {@link postProvider}. */
export interface ProviderSpec {
  /** Provider name, the first half of the id (`openai` → `openai:<model>`). */
  name: string;
  options: ProviderOptions;
  defaultBaseURL: string;
  /** Endpoint path under the base URL. */
  path: string;
  headers: Record<string, string>;
  toWire(model: string, request: ModelRequest, streaming: boolean): unknown;
  /** Turns the HTTP response (streamed or whole) into chunks. */
  parse(ctx: HttpContext, response: Response, streaming: boolean): AsyncIterable<ModelChunk>;
  /**
   * Told that the server refused `sent` with a non-2xx answer; returns true when the provider
   * now writes its requests without what was refused (an optional field some servers do not
   * take), so the request is written and sent once more, within the same attempt.
   */
  adapt?(error: ProviderError, sent: unknown): boolean;
}

/** A provider that POSTs one JSON request per call, retried per its policy, then parsed. */
export function postProvider(spec: ProviderSpec): ModelProvider {
  const id = `${spec.name}:${spec.options.model}`;
  const ctx = httpContext(id, spec.options);
  const url = joinUrl(spec.options.baseURL ?? spec.defaultBaseURL, spec.path);
  const streaming = spec.options.stream ?? true;
  const extraBody = spec.options.extraBody;
  const toWire = (request: ModelRequest): unknown => {
    const wire = spec.toWire(spec.options.model, request, streaming);
    return extraBody ? { ...(wire as object), ...extraBody } : wire;
  };
  return {
    id,
    stream(request, callOptions) {
      let body = toWire(request);
      let adapted = false;
      return withRetry(ctx, callOptions?.signal, async function* (signal, progress) {
        let response: Response;
        try {
          response = await postJson(ctx, url, spec.headers, body, signal);
        } catch (error) {
          // Once per call: a server that refuses the rewritten request too has another problem.
          if (adapted || !(error instanceof ProviderError) || !spec.adapt?.(error, body)) throw error;
          adapted = true;
          body = toWire(request);
          response = await postJson(ctx, url, spec.headers, body, signal);
        }
        yield* spec.parse({ ...ctx, progress }, response, streaming);
      });
    },
  };
}

/**
 * Request headers from `layers`, a later layer's value winning, with names compared without
 * case as HTTP compares them: `fetch` joins two spellings of one name into one comma-separated
 * value (`Content-Type` from the user's `headers` and the provider's `content-type` went out
 * as `application/json, application/json`, which servers that read the content type strictly
 * refuse, and two keys as `Bearer a, Bearer b`). A `null` or `undefined` value leaves the
 * header out, as unset options are treated, rather than sending the text "undefined".
 */
export function mergeHeaders(...layers: Array<Readonly<Record<string, unknown>> | undefined>): Record<string, string> {
  const merged: Record<string, string> = {};
  for (const layer of layers) {
    for (const [name, value] of Object.entries(layer ?? {})) {
      const key = name.toLowerCase();
      delete merged[key];
      if (value != null) merged[key] = String(value);
    }
  }
  return merged;
}

/** Tools in the OpenAI `function` shape (OpenAI-compatible servers and Ollama). */
export function functionTools(tools: ToolDefinition[]): unknown[] {
  return tools.map((tool) => ({ type: 'function', function: { name: tool.name, description: tool.description, parameters: tool.inputSchema } }));
}

/** The JSON object `text` holds, or `undefined` when it holds something else or no JSON. */
function jsonObject(text: string): Record<string, unknown> | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return isRecord(value) ? value : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Tool-call arguments as an object, for wire formats that need one (Anthropic `tool_use.input`,
 * Ollama `tool_calls[].function.arguments`). Arguments that were not valid JSON were already
 * answered with an error result by the core; the history must still be sendable, so they
 * become `{}` rather than failing the whole conversation.
 */
export function argumentsObject(text: string): Record<string, unknown> {
  return jsonObject(text) ?? {};
}

/** Tool-call arguments as JSON text for wire formats that carry text (OpenAI): the model's own
 *  text when it is a JSON object, else `{}`, for the reason given at {@link argumentsObject}. */
export function argumentsText(text: string): string {
  return jsonObject(text) === undefined ? '{}' : text;
}

/**
 * Joins a base URL and an endpoint path without doubling or dropping the slash between them.
 * A query on the base URL stays the query, after the whole path: Azure OpenAI's classic
 * endpoint is `…/openai/deployments/<name>?api-version=…`. A fragment, which is never sent, is
 * left out.
 */
export function joinUrl(baseURL: string, path: string): string {
  const [, base = '', query = ''] = /^([^?#]*)(\?[^#]*)?/.exec(baseURL) ?? [];
  return `${base.replace(/\/+$/, '')}/${path.replace(/^\/+/, '')}${query}`;
}

/**
 * Runs `attempt` with a fresh timeout signal, retrying retryable failures while no item has
 * been yielded yet. Failures come out mapped: `AbortError` when the caller aborted,
 * `provider_timeout` when the attempt's timeout fired, otherwise the `ProviderError` raised
 * by the attempt (raw network errors become `provider_network`). One that comes after an item
 * was yielded is not `retryable`, whatever the server said: the caller already has part of
 * the answer, and a retry would deliver it again. The timeout measures a
 * stall, not the whole answer: it restarts whenever the attempt reports `progress` (every
 * event with data: a reasoning model's thinking yields no item but is progress; keep-alives
 * are not) and with every item, so a local model writing for minutes is not cut off. A
 * timeout is not retried: a stalled server rarely recovers within it.
 */
export async function* withRetry<T>(
  ctx: HttpContext,
  callerSignal: AbortSignal | undefined,
  attempt: (signal: AbortSignal, progress: () => void) => AsyncIterable<T>,
): AsyncGenerator<T, void, undefined> {
  for (let attemptNo = 0; ; attemptNo++) {
    if (callerSignal?.aborted) throw abortError(callerSignal);
    const stall = stallTimer(ctx.timeoutMs);
    const linked = callerSignal ? linkSignals(callerSignal, stall.signal) : undefined;
    const signal = linked?.signal ?? stall.signal;
    let yielded = false;
    try {
      for await (const item of attempt(signal, stall.restart)) {
        yielded = true;
        // Paused while the consumer holds the item: its own time is not the server's stall.
        stall.stop();
        yield item;
        stall.restart();
      }
      return;
    } catch (raw) {
      const error = classify(ctx, raw, callerSignal, stall.signal);
      if (yielded) throw notRetryable(error);
      // A server that asks for a longer wait than `maxDelayMs` would answer an earlier retry
      // the same way (and count it against the limit): its error, with `retryAfterMs`, comes now.
      const canRetry =
        error instanceof ProviderError &&
        error.retryable &&
        error.code !== 'provider_timeout' &&
        (error.retryAfterMs ?? 0) <= ctx.retry.maxDelayMs;
      if (!canRetry || attemptNo >= ctx.retry.maxRetries) throw error;
      await sleep(backoffMs(ctx.retry, attemptNo, error.retryAfterMs), callerSignal);
    } finally {
      linked?.unlink();
      stall.end();
    }
  }
}

/** `error` with `retryable` off: what a failure after part of the answer streamed is. */
function notRetryable(error: unknown): unknown {
  if (!(error instanceof ProviderError) || !error.retryable) return error;
  const { provider, status, body, retryAfterMs } = error;
  const code = error.code as ConstructorParameters<typeof ProviderError>[0];
  const copy = new ProviderError(code, error.message, { provider, status, retryable: false, body, retryAfterMs, cause: error.cause });
  copy.stack = error.stack;
  return copy;
}

/**
 * POSTs `body` as JSON and returns the response once its status is 2xx. Non-2xx answers
 * become `provider_http` errors carrying the status and a bounded body excerpt; 429 and 5xx
 * are marked retryable and remember their `Retry-After`.
 */
export async function postJson(
  ctx: HttpContext,
  url: string,
  headers: Record<string, string>,
  body: unknown,
  signal: AbortSignal,
): Promise<Response> {
  let response: Response;
  try {
    response = await ctx.fetch(url, {
      method: 'POST',
      headers: mergeHeaders({ 'content-type': 'application/json' }, headers),
      body: JSON.stringify(body),
      signal,
    });
  } catch (cause) {
    throw networkError(ctx, cause);
  }
  if (response.ok) return response;

  const excerpt = await readExcerpt(response);
  const retryable = isRetryable(response, excerpt);
  // `retry-after-ms` (OpenAI's and Azure's) is the finer of the two where both are sent.
  const retryAfterMs = parseRetryAfterMs(response.headers.get('retry-after-ms')) ?? parseRetryAfter(response.headers.get('retry-after'));
  const asked = retryAfterMs === undefined ? '' : ` (the server asks to retry after ${Math.ceil(retryAfterMs / 1000)} s)`;
  // The server's own words when its body says them (a context-length message runs past 200
  // characters of JSON syntax), else the start of the body; `body` keeps the excerpt whole.
  const said = reportedMessage(excerpt) ?? excerpt.slice(0, 200);
  // A 404 is most often a base URL with a path too many or too few: say which URL was asked,
  // its whole path (the query, which may carry a key, comes after it and is left out).
  const where = response.status === 404 ? ` at ${url.split('?')[0]}` : '';
  throw new ProviderError('provider_http', `${ctx.provider}: HTTP ${response.status}${where}${asked}${said ? `: ${said}` : ''}`, {
    provider: ctx.provider,
    status: response.status,
    retryable,
    body: excerpt,
    retryAfterMs,
  });
}

/** Whether an error answer is worth another try, as the official OpenAI and Anthropic SDKs
 *  decide: the server's `x-should-retry` when it says, else 408 (request timeout), 409 (lock
 *  conflict), 429 and 5xx. OpenAI answers an exhausted quota (a billing matter) with 429 too:
 *  waiting cannot help that one. */
function isRetryable(response: Response, excerpt: string): boolean {
  const told = response.headers.get('x-should-retry');
  if (told === 'true' || told === 'false') return told === 'true';
  const status = response.status;
  return status === 408 || status === 409 || (status === 429 && !/"insufficient_quota"/.test(excerpt)) || status >= 500;
}

/** A `retry-after-ms` header's wait; `undefined` when absent or not a number. */
function parseRetryAfterMs(value: string | null): number | undefined {
  if (value === null || value.trim() === '') return undefined;
  const ms = Number(value.trim());
  return Number.isFinite(ms) && ms >= 0 ? Math.round(ms) : undefined;
}

/** The message of an error body in the shapes providers answer with: `{ error: { message } }`
 *  (OpenAI, Anthropic and most compatible servers), `{ error: "..." }` (Ollama), `{ message }`,
 *  `{ detail }` (FastAPI, vLLM), a one-element array of those (Gemini); at most 1,000 characters. */
export function reportedMessage(body: string): string | undefined {
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return undefined;
  }
  const top = Array.isArray(value) && value.length === 1 ? value[0] : value;
  const error = top !== null && typeof top === 'object' ? (top as Record<string, unknown>) : undefined;
  const inner = error?.error !== null && typeof error?.error === 'object' ? (error.error as Record<string, unknown>) : error;
  const bare = typeof error?.error === 'string' && error.error.trim() !== '' ? error.error : undefined;
  return (errorWords(inner) ?? bare ?? errorWords(error))?.slice(0, 1000);
}

/** The words of a server's error object: its `message`, else vLLM's `details` or FastAPI's
 *  `detail`; `undefined` when none is a non-blank string. */
export function errorWords(error: Readonly<Record<string, unknown>> | undefined): string | undefined {
  return [error?.message, error?.details, error?.detail].find((v): v is string => typeof v === 'string' && v.trim() !== '');
}

/**
 * Longest single unit read from a server, in characters: a whole JSON body, one SSE event, one
 * NDJSON line. Past it the server is broken or hostile (`provider_protocol`) rather than left
 * to fill memory; the core bounds a streamed response as a whole (8 MiB of text and calls).
 */
export const MAX_UNIT_CHARS = 16 * 2 ** 20;

function tooLong(ctx: HttpContext, what: string): ProviderError {
  return protocolError(ctx, `${what} is longer than ${MAX_UNIT_CHARS} characters`);
}

/** Reads a whole JSON body (non-streaming mode); malformed JSON is `provider_protocol`. */
export async function readJson(ctx: HttpContext, response: Response): Promise<unknown> {
  let text = '';
  for await (const piece of readText(ctx, response)) {
    text += piece;
    if (text.length > MAX_UNIT_CHARS) throw tooLong(ctx, 'the response body');
    if (piece.trim() !== '') ctx.progress?.();
  }
  return parseJson(ctx, text);
}

/** Whether a response says its body is one JSON document (`application/json`), not a stream. */
export function repliesWithJson(response: Response): boolean {
  return /^application\/json\b/i.test(response.headers.get('content-type') ?? '');
}

/** Who tells a stream's progress: the reader, for every piece with data, or the provider that
 *  parses the pieces, for those that carry part of the answer (see `carriesNews`). */
export type ProgressBy = 'reader' | 'provider';

/** Yields the Server-Sent Events of a response body, parsed by `eventsource-parser`. Events
 *  with no data are keep-alives some gateways send (`data:` and a blank line): skipped. */
export async function* readSse(ctx: HttpContext, response: Response, progressBy: ProgressBy = 'reader'): AsyncGenerator<EventSourceMessage> {
  // A web page (a web UI or a proxy's login page at the API's address) read as events is an
  // empty stream, reported as an answer cut short. Only HTML is refused: servers send event
  // streams as text/plain, or with no content type at all.
  const contentType = response.headers.get('content-type') ?? '';
  if (/^text\/html\b/i.test(contentType)) {
    const excerpt = await readExcerpt(response);
    throw protocolError(ctx, `expected an event stream, got ${contentType}: ${excerpt.slice(0, 120)}`, undefined, excerpt);
  }
  const pending: EventSourceMessage[] = [];
  let overflowed = false;
  /** Whether the body held an event or a comment: an event stream, if perhaps one cut short. */
  let spoken = false;
  const parser = createParser({
    maxBufferSize: MAX_UNIT_CHARS,
    // Events with data are progress, reasoning deltas among them (they yield no chunk); a
    // gateway's keep-alives are not, or one pinging for a hung model would never time out:
    // neither are Anthropic's `ping` events, which carry data (`{"type": "ping"}`) and mean
    // only that the connection is open.
    onEvent: (event) => {
      spoken = true;
      // The parser's bound counts what it buffered before the read that completes a line, so
      // an event can pass it by up to one read: the event itself is held to the bound here.
      // Nothing after it is read (a `[DONE]` in the same read would end the stream before the
      // error is thrown, and the event would be dropped silently).
      if (overflowed || event.data.length > MAX_UNIT_CHARS) {
        overflowed = true;
        return;
      }
      if (event.data.trim() === '') return;
      if (progressBy === 'reader' && event.event !== 'ping') ctx.progress?.();
      pending.push(event);
    },
    // Some llama.cpp builds report a failure mid-stream as an `error: {…}` line, a field SSE
    // does not define, and then send `data: [DONE]`. Dropped, the answer so far would pass for
    // a complete one; it becomes an `error` event in the shape Anthropic and OpenAI-compatible
    // servers use, which the providers turn into a ProviderError.
    onError: (error) => {
      if (error.type === 'unknown-field' && error.field === 'error') {
        pending.push({ event: 'error', data: JSON.stringify({ type: 'error', error: errorFieldValue(error.value ?? '') }), id: undefined });
      }
      if (error.type === 'max-buffer-size-exceeded') overflowed = true;
    },
    // A keep-alive: the server speaks the format, and an answer it never sent is one cut short.
    onComment: () => {
      spoken = true;
    },
  });
  // The start of the body, kept until an event comes: a body with none (plain text, a JSON
  // error with status 200) is quoted, not reported as an answer cut short.
  let start = '';
  for await (const piece of readText(ctx, response)) {
    if (!spoken && start.length < 200) start += piece.slice(0, 200);
    parser.feed(piece);
    while (pending.length > 0) yield pending.shift()!;
    if (overflowed) throw tooLong(ctx, 'an event of the stream');
  }
  // Servers that close right after a last `data:` line without its blank line still mean
  // that event; the spec would drop it, a lenient client should not.
  parser.feed('\n\n');
  if (!spoken && start.trim()) {
    throw protocolError(ctx, `expected an event stream, got a body with no events${contentType ? ` (${contentType})` : ''}: ${start.trim().slice(0, 120)}`, undefined, start);
  }
  while (pending.length > 0) yield pending.shift()!;
}

/** The value of an SSE `error:` line: its JSON object, or its text as the message. */
function errorFieldValue(value: string): Record<string, unknown> {
  return jsonObject(value) ?? { message: value };
}

/** Yields one parsed JSON value per non-empty line of a newline-delimited JSON body. */
export async function* readNdjson(ctx: HttpContext, response: Response, progressBy: ProgressBy = 'reader'): AsyncGenerator<unknown> {
  // The current line's pieces, joined once its newline comes: appending each piece to one
  // string and searching it made a long line quadratic (V8 flattens the string to search it).
  let parts: string[] = [];
  let partsLength = 0;
  for await (const piece of readText(ctx, response)) {
    let start = 0;
    let newline: number;
    while ((newline = piece.indexOf('\n', start)) >= 0) {
      parts.push(piece.slice(start, newline));
      const line = parts.join('').trim();
      parts = [];
      partsLength = 0;
      start = newline + 1;
      if (!line) continue;
      // The bound below counts the pieces held before this one: a line ending in this piece
      // is held to it here.
      if (line.length > MAX_UNIT_CHARS) throw tooLong(ctx, 'a line of the stream');
      if (progressBy === 'reader') ctx.progress?.();
      yield parseJson(ctx, line);
    }
    if (start < piece.length) {
      parts.push(start === 0 ? piece : piece.slice(start));
      partsLength += piece.length - start;
    }
    if (partsLength > MAX_UNIT_CHARS) throw tooLong(ctx, 'a line of the stream');
  }
  const rest = parts.join('').trim();
  if (rest) yield parseJson(ctx, rest);
}

/** Parses JSON text from the server, mapping a syntax error to `provider_protocol`. */
export function parseJson(ctx: HttpContext, text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (cause) {
    throw protocolError(ctx, `malformed JSON from the server: ${text.slice(0, 120)}`, cause, text);
  }
}

/** The text of `raw`, making it when it is made on demand (`lazyText`). */
export function textOf(raw: string | (() => string)): string {
  return typeof raw === 'string' ? raw : raw();
}

/** Narrows a parsed value to a JSON object; anything else breaks the wire format. */
export function expectObject(ctx: HttpContext, value: unknown, raw: string | (() => string)): Record<string, unknown> {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    const text = textOf(raw);
    throw protocolError(ctx, `expected a JSON object, got: ${text.slice(0, 120)}`, undefined, text);
  }
  return value as Record<string, unknown>;
}

/** A response that does not follow the provider's wire format. Never retried. */
export function protocolError(ctx: HttpContext, message: string, cause?: unknown, body?: string): ProviderError {
  return new ProviderError('provider_protocol', `${ctx.provider}: ${message}`, {
    provider: ctx.provider,
    retryable: false,
    cause,
    body: body?.slice(0, BODY_EXCERPT_LIMIT),
  });
}

/**
 * An error the server reported inside a 200 response (an SSE `error` event, an `error`
 * field). `retryable` lets an overload reported before the first chunk be retried; after one,
 * {@link withRetry} turns it off.
 */
export function streamedError(
  ctx: HttpContext,
  message: string,
  details: { status?: number; retryable: boolean; body: string },
): ProviderError {
  return new ProviderError('provider_http', `${ctx.provider}: ${message}`, {
    provider: ctx.provider,
    status: details.status,
    retryable: details.retryable,
    body: details.body.slice(0, BODY_EXCERPT_LIMIT),
  });
}

/** Decoded text pieces of a body; cancels the body when the consumer stops early. */
async function* readText(ctx: HttpContext, response: Response): AsyncGenerator<string> {
  if (!response.body) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let done = false;
  try {
    for (;;) {
      let result: ReadableStreamReadResult<Uint8Array>;
      try {
        result = await reader.read();
      } catch (cause) {
        throw networkError(ctx, cause);
      }
      if (result.done) {
        done = true;
        const tail = decoder.decode();
        if (tail) yield tail;
        return;
      }
      const text = decoder.decode(result.value, { stream: true });
      if (text) yield text;
    }
  } finally {
    // Frees the connection when the consumer broke out of the loop or parsing threw.
    if (!done) await reader.cancel().catch(() => undefined);
    reader.releaseLock();
  }
}

async function readExcerpt(response: Response): Promise<string> {
  if (!response.body) return '';
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let text = '';
  try {
    while (text.length < BODY_EXCERPT_LIMIT) {
      const { done, value } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
  } catch {
    // The status already tells what happened; a lost error body is not worth a second error.
  } finally {
    await reader.cancel().catch(() => undefined);
  }
  return text.slice(0, BODY_EXCERPT_LIMIT);
}

function classify(
  ctx: HttpContext,
  raw: unknown,
  callerSignal: AbortSignal | undefined,
  timeout: AbortSignal,
): unknown {
  // The signals decide first: an abort surfaces inside fetch as a network-looking error.
  if (callerSignal?.aborted) return raw instanceof AbortError ? raw : abortError(callerSignal, raw);
  if (timeout.aborted) {
    return new ProviderError('provider_timeout', `${ctx.provider}: no progress for ${ctx.timeoutMs} ms`, {
      provider: ctx.provider,
      retryable: true,
      cause: raw,
    });
  }
  return raw;
}

function networkError(ctx: HttpContext, cause: unknown): ProviderError {
  const detail = cause instanceof Error ? (cause.cause instanceof Error ? cause.cause.message : cause.message) : String(cause);
  return new ProviderError('provider_network', `${ctx.provider}: network error: ${detail}`, {
    provider: ctx.provider,
    retryable: true,
    cause,
  });
}

function abortError(signal: AbortSignal, cause?: unknown): AbortError {
  return new AbortError('The model call was aborted', { cause: cause ?? signal.reason });
}

/** Exponential backoff with "equal jitter": half fixed, half random, so retries spread out. */
function backoffMs(retry: Required<RetryOptions>, attemptNo: number, retryAfterMs: number | undefined): number {
  if (retryAfterMs !== undefined) return retryAfterMs;
  const exponential = Math.min(retry.initialDelayMs * 2 ** attemptNo, retry.maxDelayMs);
  return exponential / 2 + Math.random() * (exponential / 2);
}

/** `Retry-After` is either delta-seconds or an HTTP-date (RFC 9110 §10.2.3). */
export function parseRetryAfter(value: string | null, now = Date.now()): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+(\.\d+)?$/.test(trimmed)) return Math.round(Number(trimmed) * 1000);
  const date = Date.parse(trimmed);
  if (Number.isNaN(date)) return undefined;
  return Math.max(0, date - now);
}

/** A signal that aborts once `ms` pass without a `restart`; `stop` holds it until the next
 *  `restart`, and `end` drops it. */
function stallTimer(ms: number): { signal: AbortSignal; restart(): void; stop(): void; end(): void } {
  const controller = new AbortController();
  // Progress moves a deadline; one timer checks it when it fires and waits out what is left.
  // Re-arming a timer for every piece of a stream cost two timer calls per chunk.
  let deadline = performance.now() + ms;
  let paused = false;
  let timer: ReturnType<typeof setTimeout> | undefined;
  const arm = (wait: number) => {
    timer = setTimeout(() => {
      timer = undefined;
      if (paused) return;
      const left = deadline - performance.now();
      if (left > 0) arm(left);
      else controller.abort(new DOMException(`no progress for ${ms} ms`, 'TimeoutError'));
    }, wait);
    // Node: the request's socket keeps a process alive while it matters; the timer of an
    // answer nobody reads any more must not.
    (timer as { unref?: () => void }).unref?.();
  };
  arm(ms);
  return {
    signal: controller.signal,
    restart() {
      deadline = performance.now() + ms;
      paused = false;
      if (timer === undefined) arm(ms);
    },
    stop() {
      paused = true;
    },
    end() {
      clearTimeout(timer);
    },
  };
}

function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(abortError(signal));
    const onAbort = () => {
      clearTimeout(timer);
      reject(abortError(signal!));
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

function definedOnly<T extends object>(value: T): Partial<T> {
  return Object.fromEntries(Object.entries(value).filter(([, v]) => v != null)) as Partial<T>;
}
