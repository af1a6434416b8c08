/**
 * TEST DOUBLE — a scripted LLM server on `node:http` that speaks the real wire formats of
 * the three providers Crucible supports, so provider code is tested over real `fetch`, real
 * sockets and real streaming:
 *
 * - OpenAI Chat Completions: `POST …/chat/completions`, plain JSON or SSE (`data:` lines,
 *   tool-call deltas split over several chunks, `include_usage` chunk, `[DONE]`).
 * - Anthropic Messages: `POST …/v1/messages`, plain JSON or SSE (`event:`/`data:` pairs).
 * - Ollama: `POST …/api/chat`, plain JSON or NDJSON.
 *
 * What it answers is scripted: a queue of {@link MockReply} values consumed one per request,
 * or a {@link MockResponder} function `(request) => reply` (e.g. {@link echoToolResponder}),
 * or, with neither, an echo of the last user message. Every request is recorded on
 * {@link MockLlmServer.requests} so tests can assert what a provider actually sent.
 *
 * It has no dependencies and only uses erasable TypeScript, so browser tests and benchmarks
 * can import it, and it can run as a process:
 * `node --import tsx test/support/mock-llm-server.ts [--port 8787] [--reply echo|echo-tool]`
 * prints one JSON line `{"url": …}` on stdout once listening. CORS is open (`*`) and OPTIONS
 * preflights are answered, because browser pages on another port call it.
 */

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';

// ---------------------------------------------------------------------------------------------
// Script

/** A tool call the scripted model makes. `arguments` may be an object or raw JSON text. */
export interface MockToolCall {
  name: string;
  arguments: unknown;
  /** Default: a generated `call_mock_<n>` (Anthropic: `toolu_mock_<n>`). Ollama never sends ids. */
  id?: string;
}

/**
 * One scripted answer. Fields combine: `{ text: 'Hi', delayMs: 20 }` waits, then streams.
 * A reply with neither `text` nor `toolCalls` is an empty answer.
 */
export interface MockReply {
  /** Text answer. A string is streamed one word per delta; an array gives the exact deltas. */
  text?: string | string[];
  /** Tool calls, streamed after the text. Arguments are split into several deltas. */
  toolCalls?: MockToolCall[];
  /** Answer with this HTTP status instead (>= 400 means an error response). */
  status?: number;
  /** Error body for `status`; default is the provider's JSON error shape. */
  body?: string;
  /** `Retry-After` header value (seconds, or an HTTP-date string) sent with `status`. */
  retryAfter?: number | string;
  /** More headers sent with `status` (`retry-after-ms`, `x-should-retry`, ...). */
  errorHeaders?: Record<string, string>;
  /** Wait this long before sending the response headers. */
  delayMs?: number;
  /** Stall this long after the first text/tool-call event (non-streaming: before the body). */
  hangMs?: number;
  /** Wait between streamed events. Default 0. */
  chunkDelayMs?: number;
  /** Send an event / body whose JSON is broken (after the first text/tool-call event). */
  malformed?: boolean;
  /** Report an error inside a 200 stream after the first text/tool-call event, or right after
   * the opening event when there is none (non-streaming: as the body). */
  streamError?: { type?: string; message: string };
  /** Provider finish reason; default `stop`/`tool_calls`, `end_turn`/`tool_use`, `stop`. */
  finishReason?: string;
  /** Token counts to report; default is a rough length-based estimate. */
  usage?: { inputTokens: number; outputTokens: number };
}

/** Which wire format a request used, by its path. */
export type MockWireFormat = 'openai' | 'anthropic' | 'ollama';

/** A message of a received request, flattened to role and text across wire formats. */
export interface MockMessageView {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string;
  /** Tool name when the wire format carries it (Ollama `tool_name`, assistant tool calls). */
  toolNames?: string[];
}

/** A request the server received. */
export interface MockRequest {
  format: MockWireFormat;
  path: string;
  headers: Record<string, string | string[] | undefined>;
  /** The parsed JSON body, exactly as sent. */
  body: Record<string, unknown>;
  /** Whether the body asked for a streamed answer. */
  stream: boolean;
  /** The conversation flattened across wire formats (Anthropic `system` included first). */
  messages: MockMessageView[];
  /** Names of the tools the request offered. */
  toolNames: string[];
}

/** Computes the reply to a request; lets one server serve agent loops and benchmarks. */
export type MockResponder = (request: MockRequest) => MockReply | Promise<MockReply>;

/** Options of {@link startMockLlmServer}. */
export interface MockLlmServerOptions {
  /** Replies consumed one per request, in order. When exhausted, `respond` takes over. */
  replies?: MockReply[];
  /** Answers requests once `replies` is empty. Without it, an exhausted script answers 500. */
  respond?: MockResponder;
  /** Default 0 (an ephemeral port). */
  port?: number;
  /** Default `127.0.0.1`. */
  host?: string;
}

/** A running mock server. */
export interface MockLlmServer {
  /** `http://127.0.0.1:<port>` */
  readonly url: string;
  readonly port: number;
  /** `baseURL` for `openai()`: `<url>/v1`. */
  readonly openaiBaseURL: string;
  /** `baseURL` for `anthropic()`: `<url>` (the provider appends `/v1/messages`). */
  readonly anthropicBaseURL: string;
  /** `baseURL` for `ollama()`: `<url>`. */
  readonly ollamaBaseURL: string;
  /** Every request received, in arrival order (OPTIONS preflights excluded). */
  readonly requests: MockRequest[];
  /** Appends scripted replies. */
  enqueue(...replies: MockReply[]): void;
  /** Replaces the responder used once the queue is empty. */
  setResponder(respond: MockResponder | undefined): void;
  /** Forgets recorded requests and queued replies. */
  reset(): void;
  /** Stops listening and drops open connections (hanging replies included). */
  close(): Promise<void>;
}

/** Echoes the last user message as text. The default when no script is given. */
export const echoResponder: MockResponder = (request) => {
  const last = [...request.messages].reverse().find((m) => m.role === 'user');
  return { text: `echo: ${last?.content ?? ''}` };
};

/**
 * A responder for agent-loop tests: when the request offers tools and the last message is
 * from the user, it calls `toolName` (default: the first tool offered) with
 * `{ input: <last user text> }`; once a tool result is the last message, it answers with
 * text `tool result: <result>`. Without tools it behaves like {@link echoResponder}.
 */
export function echoToolResponder(toolName?: string): MockResponder {
  return (request) => {
    const last = request.messages.at(-1);
    if (last?.role === 'tool') return { text: `tool result: ${last.content}` };
    const name = toolName ?? request.toolNames[0];
    if (!name || request.toolNames.length === 0) return echoResponder(request);
    return { toolCalls: [{ name, arguments: { input: last?.content ?? '' } }] };
  };
}

// ---------------------------------------------------------------------------------------------
// Server

/** Starts the test double; resolves once it listens. Always `close()` it in teardown. */
export async function startMockLlmServer(options: MockLlmServerOptions = {}): Promise<MockLlmServer> {
  const queue: MockReply[] = [...(options.replies ?? [])];
  let respond: MockResponder | undefined = options.respond ?? (options.replies ? undefined : echoResponder);
  const requests: MockRequest[] = [];
  const ids = { call: 0, message: 0 };
  const closing = new AbortController();

  const server = createServer((req, res) => {
    handle(req, res).catch((error: unknown) => {
      if (!res.headersSent) sendJson(res, 500, { error: { message: `mock-llm-server: ${String(error)}` } });
      else res.destroy();
    });
  });

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    setCors(req, res);
    if (req.method === 'OPTIONS') {
      res.writeHead(204).end();
      return;
    }
    const path = new URL(req.url ?? '/', 'http://mock').pathname;
    if (req.method === 'GET') {
      sendJson(res, 200, { ok: true, server: 'mock-llm-server' });
      return;
    }
    const format = formatOf(path);
    if (req.method !== 'POST' || !format) {
      sendJson(res, 404, { error: { message: `mock-llm-server: no route for ${req.method} ${path}` } });
      return;
    }
    let body: Record<string, unknown>;
    try {
      body = JSON.parse(await readBody(req)) as Record<string, unknown>;
    } catch {
      sendJson(res, 400, { error: { message: 'mock-llm-server: request body is not JSON' } });
      return;
    }
    const request = describeRequest(format, path, req, body);
    requests.push(request);

    const reply = queue.shift() ?? (respond ? await respond(request) : undefined);
    if (!reply) {
      sendJson(res, 500, { error: { message: 'mock-llm-server: no scripted reply left' } });
      return;
    }
    const wait = (ms: number) => sleep(ms, res, closing.signal);
    if (reply.delayMs) await wait(reply.delayMs);
    if (res.destroyed) return;

    if (reply.status !== undefined && reply.status >= 400) {
      const headers: Record<string, string> = {};
      if (reply.retryAfter !== undefined) headers['retry-after'] = String(reply.retryAfter);
      Object.assign(headers, reply.errorHeaders);
      const errorBody = reply.body ?? JSON.stringify(errorJson(format, reply.status));
      res.writeHead(reply.status, { 'content-type': 'application/json', ...headers }).end(errorBody);
      return;
    }

    const events = render(format, request, reply, ids);
    if (!request.stream) {
      if (reply.hangMs) await wait(reply.hangMs);
      if (res.destroyed) return;
      res.writeHead(reply.status ?? 200, { 'content-type': 'application/json' }).end(events.whole);
      return;
    }
    res.writeHead(reply.status ?? 200, {
      'content-type': format === 'ollama' ? 'application/x-ndjson' : 'text/event-stream',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
    });
    for (const [i, piece] of events.stream.entries()) {
      if (res.destroyed) return;
      res.write(piece);
      if (i === events.hangAt && reply.hangMs) await wait(reply.hangMs);
      else if (reply.chunkDelayMs) await wait(reply.chunkDelayMs);
    }
    res.end();
  }

  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? 0, options.host ?? '127.0.0.1', () => {
      server.off('error', reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const url = `http://${options.host ?? '127.0.0.1'}:${port}`;

  return {
    url,
    port,
    openaiBaseURL: `${url}/v1`,
    anthropicBaseURL: url,
    ollamaBaseURL: url,
    requests,
    enqueue: (...replies) => void queue.push(...replies),
    setResponder: (next) => void (respond = next),
    reset: () => {
      requests.length = 0;
      queue.length = 0;
    },
    close: () =>
      new Promise<void>((resolve) => {
        closing.abort();
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  };
}

// ---------------------------------------------------------------------------------------------
// Rendering the wire formats

interface Rendered {
  /** Pieces written one `write()` each when streaming. */
  stream: string[];
  /** Index of the piece after which `hangMs` stalls: the first content-bearing piece. */
  hangAt: number;
  /** The non-streaming body. */
  whole: string;
}

function render(format: MockWireFormat, request: MockRequest, reply: MockReply, ids: { call: number; message: number }): Rendered {
  const deltas = textDeltas(reply.text);
  const calls = (reply.toolCalls ?? []).map((call) => ({
    id: call.id ?? (format === 'anthropic' ? `toolu_mock_${++ids.call}` : `call_mock_${++ids.call}`),
    name: call.name,
    arguments: typeof call.arguments === 'string' ? call.arguments : JSON.stringify(call.arguments),
  }));
  const usage = reply.usage ?? {
    inputTokens: Math.ceil(JSON.stringify(request.body.messages ?? []).length / 4),
    outputTokens: Math.max(1, Math.ceil((deltas.join('') + calls.map((c) => c.arguments).join('')).length / 4)),
  };
  const model = typeof request.body.model === 'string' ? request.body.model : 'mock-model';
  const messageId = ++ids.message;
  const spec: RenderSpec = { deltas, calls, usage, model, messageId, reply };
  switch (format) {
    case 'openai':
      return renderOpenAI(spec, request.body);
    case 'anthropic':
      return renderAnthropic(spec);
    case 'ollama':
      return renderOllama(spec);
  }
}

interface RenderSpec {
  deltas: string[];
  calls: Array<{ id: string; name: string; arguments: string }>;
  usage: { inputTokens: number; outputTokens: number };
  model: string;
  messageId: number;
  reply: MockReply;
}

function renderOpenAI(spec: RenderSpec, body: Record<string, unknown>): Rendered {
  const { deltas, calls, usage, model, reply } = spec;
  const id = `chatcmpl-mock-${spec.messageId}`;
  const created = Math.floor(Date.now() / 1000);
  const finishReason = reply.finishReason ?? (calls.length > 0 ? 'tool_calls' : 'stop');
  const wireUsage = {
    prompt_tokens: usage.inputTokens,
    completion_tokens: usage.outputTokens,
    total_tokens: usage.inputTokens + usage.outputTokens,
  };
  const includeUsage = (body.stream_options as { include_usage?: boolean } | undefined)?.include_usage === true;
  const chunk = (delta: unknown, finish: string | null = null) => ({
    id,
    object: 'chat.completion.chunk',
    created,
    model,
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
    ...(includeUsage ? { usage: null } : {}),
  });
  const data = (value: unknown) => `data: ${JSON.stringify(value)}\n\n`;

  const content: string[] = [];
  for (const delta of deltas) content.push(data(chunk({ content: delta })));
  for (const [index, call] of calls.entries()) {
    content.push(data(chunk({ tool_calls: [{ index, id: call.id, type: 'function', function: { name: call.name, arguments: '' } }] })));
    for (const piece of splitInThree(call.arguments)) {
      content.push(data(chunk({ tool_calls: [{ index, function: { arguments: piece } }] })));
    }
  }
  const faults: string[] = [];
  if (reply.malformed) faults.push('data: {"id":"chatcmpl-mock","choices":[{"delta":{"content":"oops"\n\n');
  if (reply.streamError) {
    faults.push(data({ error: { message: reply.streamError.message, type: reply.streamError.type ?? 'server_error', code: 500 } }));
  }
  const closing = [data(chunk({}, finishReason))];
  if (includeUsage) closing.push(data({ id, object: 'chat.completion.chunk', created, model, choices: [], usage: wireUsage }));
  closing.push('data: [DONE]\n\n');
  const streamed = compose([data(chunk({ role: 'assistant', content: '' }))], content, faults, closing);

  const message: Record<string, unknown> = { role: 'assistant', content: deltas.length > 0 ? deltas.join('') : null };
  if (calls.length > 0) {
    message.tool_calls = calls.map((call) => ({
      id: call.id,
      type: 'function',
      function: { name: call.name, arguments: call.arguments },
    }));
  }
  const whole = reply.malformed
    ? '{"id":"chatcmpl-mock","choices":[{"message":'
    : JSON.stringify(
        reply.streamError
          ? { error: { message: reply.streamError.message, type: reply.streamError.type ?? 'server_error', code: 500 } }
          : {
              id,
              object: 'chat.completion',
              created,
              model,
              choices: [{ index: 0, message, logprobs: null, finish_reason: finishReason }],
              usage: wireUsage,
            },
      );
  return { ...streamed, whole };
}

function renderAnthropic(spec: RenderSpec): Rendered {
  const { deltas, calls, usage, model, reply } = spec;
  const id = `msg_mock_${spec.messageId}`;
  const stopReason = reply.finishReason ?? (calls.length > 0 ? 'tool_use' : 'end_turn');
  const event = (type: string, value: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...value })}\n\n`;

  const opening = [
    event('message_start', {
      message: {
        id,
        type: 'message',
        role: 'assistant',
        content: [],
        model,
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: usage.inputTokens, output_tokens: 1 },
      },
    }),
  ];
  const pieces: string[] = [];
  let block = 0;
  if (deltas.length > 0) {
    pieces.push(event('content_block_start', { index: block, content_block: { type: 'text', text: '' } }));
    pieces.push(event('ping', {}));
    for (const text of deltas) pieces.push(event('content_block_delta', { index: block, delta: { type: 'text_delta', text } }));
    pieces.push(event('content_block_stop', { index: block }));
    block++;
  }
  for (const call of calls) {
    pieces.push(event('content_block_start', { index: block, content_block: { type: 'tool_use', id: call.id, name: call.name, input: {} } }));
    // The real API opens every tool_use block with an empty partial_json.
    for (const partial_json of ['', ...splitInThree(call.arguments)]) {
      pieces.push(event('content_block_delta', { index: block, delta: { type: 'input_json_delta', partial_json } }));
    }
    pieces.push(event('content_block_stop', { index: block }));
    block++;
  }
  const faults: string[] = [];
  if (reply.malformed) faults.push('event: content_block_delta\ndata: {"type":"content_block_delta","index":0,\n\n');
  if (reply.streamError) {
    faults.push(event('error', { error: { type: reply.streamError.type ?? 'overloaded_error', message: reply.streamError.message } }));
  }
  const closing = [
    event('message_delta', { delta: { stop_reason: stopReason, stop_sequence: null }, usage: { output_tokens: usage.outputTokens } }),
    event('message_stop', {}),
  ];
  // The first content-bearing event of a text block is its first delta, not the block start.
  const firstContent = deltas.length > 0 ? 3 : 1;
  const streamed = compose(opening.concat(pieces.slice(0, firstContent - 1)), pieces.slice(firstContent - 1), faults, closing);

  const content: unknown[] = [];
  if (deltas.length > 0) content.push({ type: 'text', text: deltas.join('') });
  for (const call of calls) content.push({ type: 'tool_use', id: call.id, name: call.name, input: parseOrKeep(call.arguments) });
  const whole = reply.malformed
    ? '{"id":"msg_mock","content":['
    : JSON.stringify(
        reply.streamError
          ? { type: 'error', error: { type: reply.streamError.type ?? 'overloaded_error', message: reply.streamError.message } }
          : {
              id,
              type: 'message',
              role: 'assistant',
              model,
              content,
              stop_reason: stopReason,
              stop_sequence: null,
              usage: { input_tokens: usage.inputTokens, output_tokens: usage.outputTokens },
            },
      );
  return { ...streamed, whole };
}

function renderOllama(spec: RenderSpec): Rendered {
  const { deltas, calls, usage, model, reply } = spec;
  const createdAt = new Date().toISOString();
  const doneReason = reply.finishReason ?? 'stop';
  const line = (value: unknown) => `${JSON.stringify(value)}\n`;
  const partial = (message: Record<string, unknown>) => ({ model, created_at: createdAt, message: { role: 'assistant', ...message }, done: false });
  const wireCalls = calls.map((call) => ({ function: { name: call.name, arguments: parseOrKeep(call.arguments) } }));
  const final = (message: Record<string, unknown>) => ({
    model,
    created_at: createdAt,
    message: { role: 'assistant', ...message },
    done: true,
    done_reason: doneReason,
    total_duration: 1_000_000,
    load_duration: 1000,
    prompt_eval_count: usage.inputTokens,
    prompt_eval_duration: 1000,
    eval_count: usage.outputTokens,
    eval_duration: 1000,
  });

  const content = deltas.map((text) => line(partial({ content: text })));
  // Ollama delivers each tool call whole, in its own line.
  for (const call of wireCalls) content.push(line(partial({ content: '', tool_calls: [call] })));
  const faults: string[] = [];
  if (reply.malformed) faults.push('{"model":"mock","message":{"content":\n');
  if (reply.streamError) faults.push(line({ error: reply.streamError.message }));
  const streamed = compose([], content, faults, [line(final({ content: '' }))]);

  const whole = reply.malformed
    ? '{"model":"mock","message":'
    : JSON.stringify(
        reply.streamError
          ? { error: reply.streamError.message }
          : final({ content: deltas.join(''), ...(wireCalls.length > 0 ? { tool_calls: wireCalls } : {}) }),
      );
  return { ...streamed, whole };
}

function errorJson(format: MockWireFormat, status: number): unknown {
  const message = `mock-llm-server: scripted HTTP ${status}`;
  const type = status === 429 ? 'rate_limit_error' : status >= 500 ? 'api_error' : 'invalid_request_error';
  if (format === 'anthropic') return { type: 'error', error: { type, message } };
  if (format === 'ollama') return { error: message };
  return { error: { message, type, code: status } };
}

// ---------------------------------------------------------------------------------------------
// Reading requests

function formatOf(path: string): MockWireFormat | undefined {
  if (path.endsWith('/chat/completions')) return 'openai';
  if (path.endsWith('/v1/messages')) return 'anthropic';
  if (path.endsWith('/api/chat')) return 'ollama';
  return undefined;
}

function describeRequest(format: MockWireFormat, path: string, req: IncomingMessage, body: Record<string, unknown>): MockRequest {
  const tools = Array.isArray(body.tools) ? (body.tools as Array<Record<string, unknown>>) : [];
  const toolNames = tools.map((tool) =>
    String((tool.function as { name?: unknown } | undefined)?.name ?? tool.name ?? ''),
  );
  // Ollama streams unless `stream: false`; OpenAI and Anthropic only when `stream: true`.
  const stream = format === 'ollama' ? body.stream !== false : body.stream === true;
  return { format, path, headers: req.headers, body, stream, messages: viewMessages(format, body), toolNames };
}

function viewMessages(format: MockWireFormat, body: Record<string, unknown>): MockMessageView[] {
  const wire = Array.isArray(body.messages) ? (body.messages as Array<Record<string, unknown>>) : [];
  const views: MockMessageView[] = [];
  if (format === 'anthropic' && body.system !== undefined) views.push({ role: 'system', content: textOf(body.system) });
  for (const message of wire) {
    const role = String(message.role) as MockMessageView['role'];
    const content = message.content;
    if (format === 'anthropic' && Array.isArray(content) && content.some((b) => (b as { type?: string }).type === 'tool_result')) {
      for (const block of content as Array<{ type?: string; content?: unknown }>) {
        if (block.type === 'tool_result') views.push({ role: 'tool', content: textOf(block.content) });
      }
      continue;
    }
    const view: MockMessageView = { role, content: textOf(content) };
    if (typeof message.tool_name === 'string') view.toolNames = [message.tool_name];
    if (Array.isArray(message.tool_calls)) {
      view.toolNames = (message.tool_calls as Array<{ function?: { name?: string } }>).map((c) => c.function?.name ?? '');
    }
    if (format === 'anthropic' && Array.isArray(content)) {
      const uses = (content as Array<{ type?: string; name?: string }>).filter((b) => b.type === 'tool_use');
      if (uses.length > 0) view.toolNames = uses.map((b) => b.name ?? '');
    }
    views.push(view);
  }
  return views;
}

function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((block) => (typeof block === 'string' ? block : typeof (block as { text?: unknown }).text === 'string' ? (block as { text: string }).text : ''))
      .join('');
  }
  return content === null || content === undefined ? '' : JSON.stringify(content);
}

// ---------------------------------------------------------------------------------------------
// Helpers

function textDeltas(text: string | string[] | undefined): string[] {
  if (text === undefined) return [];
  if (Array.isArray(text)) return text;
  return text.match(/\S+\s*|\s+/g) ?? [];
}

/**
 * Lays out a stream: opening events, the first content piece, injected faults, the rest of
 * the content, closing events. `hangAt` points at the first content piece so a stall happens
 * after the client has seen some output (or after the opening when there is none).
 */
function compose(opening: string[], content: string[], faults: string[], closing: string[]): { stream: string[]; hangAt: number } {
  const head = opening.concat(content.slice(0, 1));
  return { stream: [...head, ...faults, ...content.slice(1), ...closing], hangAt: Math.max(0, head.length - 1) };
}

/** Scripted arguments may be deliberately invalid JSON; send them as they are then. */
function parseOrKeep(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

/** Splits tool arguments so a client must concatenate deltas, as with real servers. */
function splitInThree(text: string): string[] {
  if (text.length < 3) return [text];
  const a = Math.floor(text.length / 3);
  const b = Math.floor((2 * text.length) / 3);
  return [text.slice(0, a), text.slice(a, b), text.slice(b)];
}

function setCors(req: IncomingMessage, res: ServerResponse): void {
  res.setHeader('access-control-allow-origin', '*');
  res.setHeader('access-control-allow-methods', 'GET, POST, OPTIONS');
  // `*` does not cover `Authorization`, so echo whatever the preflight asks for.
  res.setHeader('access-control-allow-headers', req.headers['access-control-request-headers'] ?? '*');
  res.setHeader('access-control-expose-headers', 'retry-after');
  res.setHeader('access-control-max-age', '600');
}

function sendJson(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(value));
}

async function readBody(req: IncomingMessage): Promise<string> {
  const parts: Buffer[] = [];
  for await (const part of req) parts.push(part as Buffer);
  return Buffer.concat(parts).toString('utf8');
}

/** Waits, but wakes early when the client went away or the server is closing. */
function sleep(ms: number, res: ServerResponse, closing: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      res.off('close', done);
      closing.removeEventListener('abort', done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    res.once('close', done);
    closing.addEventListener('abort', done, { once: true });
  });
}

// ---------------------------------------------------------------------------------------------
// Running as a process (browser tests, benchmarks)

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  const arg = (name: string) => {
    const i = process.argv.indexOf(`--${name}`);
    return i >= 0 ? process.argv[i + 1] : undefined;
  };
  const server = await startMockLlmServer({
    port: Number(arg('port') ?? 0),
    respond: arg('reply') === 'echo-tool' ? echoToolResponder() : echoResponder,
  });
  process.stdout.write(`${JSON.stringify({ url: server.url, openaiBaseURL: server.openaiBaseURL })}\n`);
  const stop = () => void server.close().then(() => process.exit(0));
  process.once('SIGINT', stop);
  process.once('SIGTERM', stop);
}
