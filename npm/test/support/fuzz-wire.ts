/**
 * The property behind `fuzz-boundary-wire.test.ts`: a provider reading a mutated stream from a
 * local server. A valid answer that calls a tool, in one provider's wire format, is mutated
 * event by event (a field replaced by a value of another type, an event dropped, duplicated or
 * inserted) and byte by byte (bytes inserted, the body cut, other line ends), split into
 * pieces at any byte (inside a UTF-8 sequence or a line), and sent with an odd status, content
 * type or a dropped connection now and then. A run against it must end with a result or a
 * typed error, and the next run against a plain answer must be served.
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { createAgent, type Agent, type ModelProvider, type ProviderOptions } from '../../src/node.js';
import { hugeString, jsonish, jsonTextOf, oddNumber, path, replacedAt } from './fuzz-arbitraries.js';
import { add, approvingJudge, assertTyped, check, errorText, label, settles, SHOUT_FORGE, Tally, upper } from './fuzz-harness.js';

/** One provider's wire format, as the property needs it. */
export interface WireFormat {
  name: string;
  /** The provider under test, reading from the local server at `url` (no retries). */
  provider(url: string): ModelProvider;
  /** The content type of a streamed answer. */
  contentType: string;
  /** One event as written on the wire (a string event is written as it is). */
  frame(event: unknown): string;
  /** The events of a plain text answer `fine`. */
  plain: unknown[];
  /** The events of a valid answer with `text`, then one call of `name` with `args` (JSON text). */
  toolCallAnswer(text: string, name: string, args: string): unknown[];
  /** Events worth inserting: errors, odd shapes and values the format's parser must refuse or skip. */
  oddEvents: unknown[];
  /** Text worth inserting at any byte: the format's framing, half of it, keep-alives. */
  oddBytes: string[];
}

/** What the local server answers the next request with: a status, headers and the body's
 *  pieces, written one by one, then the end of the response, or a dropped connection with
 *  `hangUp`. Requests after it get the format's plain answer. */
interface Answer {
  status: number;
  headers: Record<string, string>;
  pieces: Buffer[];
  hangUp: boolean;
}

/** A local server answering with whatever `next` is set to, once. */
async function mutatingServer(plainBody: string, contentType: string): Promise<{ url: string; next: (a: Answer | undefined) => void; close: () => Promise<void> }> {
  let answer: Answer | undefined;
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const a = answer;
      answer = undefined;
      if (!a) {
        res.writeHead(200, { 'content-type': contentType }).end(plainBody);
        return;
      }
      res.writeHead(a.status, a.headers);
      for (const piece of a.pieces) res.write(piece);
      if (a.hangUp) res.destroy();
      else res.end();
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    next: (a) => (answer = a),
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

type EventEdit = readonly ['field', number, number[], unknown] | readonly ['drop' | 'duplicate', number] | readonly ['insert', number, unknown];
type ByteEdit = readonly ['bytes', number, Uint8Array] | readonly ['cut', number];

/** Runs the property for `format` over `runs` generated answers. */
export async function checkMutatedStreams(format: WireFormat, runs: number): Promise<void> {
  const server = await mutatingServer(format.plain.map((e) => format.frame(e)).join(''), format.contentType);
  const agent: Agent = await createAgent({
    model: format.provider(server.url),
    tools: [upper, add],
    maxTurns: 3,
    emergent: { enabled: true, judge: { model: approvingJudge }, sandboxTimeoutMs: 1500, autoPromote: false },
  });
  try {
    const calls: [string, string][] = [['upper', '{"text":"hi"}'], ['add', '{"a":1,"b":2}'], ['forge_tool', JSON.stringify(SHOUT_FORGE)], ['nope', '{}']];
    const validEvents = fc.tuple(fc.constantFrom('Hello', 'é😀', ''), fc.constantFrom(...calls)).map(([text, [name, args]]) => format.toolCallAnswer(text, name, args));
    const eventEdit: fc.Arbitrary<EventEdit> = fc.oneof(
      fc.tuple(fc.constant('field' as const), fc.nat(), path, fc.oneof(jsonish, oddNumber, hugeString)),
      fc.tuple(fc.constantFrom('drop' as const, 'duplicate' as const), fc.nat()),
      fc.tuple(fc.constant('insert' as const), fc.nat(), fc.oneof(fc.constantFrom<unknown>(...format.oddEvents), jsonish)),
    );
    const byteEdit: fc.Arbitrary<ByteEdit> = fc.oneof(
      fc.tuple(fc.constant('bytes' as const), fc.nat(), fc.uint8Array({ minLength: 1, maxLength: 8 })),
      fc.tuple(fc.constant('bytes' as const), fc.nat(), fc.constantFrom(...format.oddBytes, '\n', '\r\n', '\r', '\u0000', '\ufeff').map((t) => new Uint8Array(Buffer.from(t)))),
      fc.tuple(fc.constant('cut' as const), fc.nat()),
    );
    const response = fc.record({
      events: validEvents,
      eventEdits: fc.array(eventEdit, { maxLength: 3 }),
      byteEdits: fc.array(byteEdit, { maxLength: 2 }),
      splits: fc.array(fc.nat(), { maxLength: 6 }),
      lineEnd: fc.constantFrom('\n', '\n', '\r\n', '\r'),
      status: fc.oneof({ weight: 8, arbitrary: fc.constant(200) }, { weight: 1, arbitrary: fc.constantFrom(201, 204, 301, 400, 401, 404, 408, 413, 429, 500, 503, 529, 599) }),
      contentType: fc.oneof(
        { weight: 6, arbitrary: fc.constant(format.contentType) },
        { weight: 1, arbitrary: fc.constantFrom('application/json', 'text/html', 'text/plain', 'text/event-stream; charset=latin1', 'application/x-ndjson', '') },
      ),
      hangUp: fc.oneof({ weight: 6, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    });
    const built = (r: typeof response extends fc.Arbitrary<infer R> ? R : never): Answer => {
      const events = [...r.events];
      for (const e of r.eventEdits) {
        const i = e[1] % (events.length + 1);
        if (e[0] === 'field') events[i % events.length] = replacedAt(events[i % events.length], e[2], e[3]);
        else if (e[0] === 'drop') events.splice(i % events.length, 1);
        else if (e[0] === 'duplicate') events.splice(i, 0, events[i % events.length]);
        else events.splice(i, 0, e[2]);
      }
      let body = Buffer.from(events.map((e) => format.frame(e)).join('').replaceAll('\n', r.lineEnd));
      for (const e of r.byteEdits) {
        const i = e[1] % (body.length + 1);
        body = e[0] === 'cut' ? body.subarray(0, i) : Buffer.concat([body.subarray(0, i), e[2], body.subarray(i)]);
      }
      const ends = [...new Set(r.splits.map((n) => n % (body.length + 1))), body.length].sort((a, b) => a - b);
      const pieces = ends.map((end, i) => body.subarray(i === 0 ? 0 : ends[i - 1]!, end));
      return { status: r.status, headers: r.contentType ? { 'content-type': r.contentType } : {}, pieces, hangUp: r.hangUp };
    };
    const outcomes = new Tally(`${format.name} stream outcomes`);
    await check(
      fc.asyncProperty(response, async (r) => {
        server.next(built(r));
        const run = await settles(() => agent.run('go', { sessionId: 'fz' }), `a run against the mutated ${format.name} stream`);
        if (!run.ok) assertTyped(run.error, `a run against the mutated ${format.name} stream`);
        outcomes.add(run.ok ? run.value.status : label(run.error, 100));
        await agent.endSession('fz');
        server.next(undefined);
        const next = await settles(() => agent.run('hi', { sessionId: 'probe' }), 'a known-good run');
        assert.ok(
          next.ok && next.value.status === 'completed' && next.value.text === 'fine',
          `a known-good run after the mutated stream: ${next.ok ? JSON.stringify(next.value).slice(0, 200) : errorText(next.error)}`,
        );
        await agent.endSession('probe');
      }),
      runs,
    );
    outcomes.report();
  } finally {
    await agent.close();
    await server.close();
  }
}

/** A mutated event may no longer be an object: it is written as JSON text all the same. */
const textOf = (event: unknown) => (typeof event === 'string' ? event : jsonTextOf(event));

/** A provider factory (`openai`, `anthropic`, `ollama`). */
type Factory = (options: ProviderOptions) => ModelProvider;

/** Splits `text` in three pieces (a provider streams a call's arguments in several deltas). */
const inThree = (text: string) => [text.slice(0, 7), text.slice(7, 15), text.slice(15)];

/** OpenAI-compatible chat completions: `data:` lines, tool-call deltas by index, `[DONE]`. */
export function openaiWire(openai: Factory): WireFormat {
  const chunk = (delta: Record<string, unknown>, finish: string | null = null) => ({ id: 'chatcmpl-fz', object: 'chat.completion.chunk', created: 1, model: 'fz', choices: [{ index: 0, delta, finish_reason: finish }] });
  return {
    name: 'openai',
    provider: (url) => openai({ baseURL: `${url}/v1`, apiKey: 'x', model: 'fz', retry: { maxRetries: 0 }, timeoutMs: 3000 }),
    contentType: 'text/event-stream',
    frame: (event) => `data: ${textOf(event)}\n\n`,
    plain: [chunk({ role: 'assistant', content: 'fine' }), chunk({}, 'stop'), '[DONE]'],
    toolCallAnswer: (text, name, args) => [
      chunk({ role: 'assistant', content: '' }),
      // DeepSeek's reasoning and Gemini's signature come back as the call's providerData.
      chunk({ content: text, reasoning_content: 'Thinking.' }),
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name, arguments: '' }, extra_content: { google: { thought_signature: 'c2ln' } } }] } }] },
      ...inThree(args).map((piece) => ({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: piece } }] } }] })),
      chunk({}, 'tool_calls'),
      { id: 'chatcmpl-fz', choices: [], usage: { prompt_tokens: 3, completion_tokens: 5 } },
      '[DONE]',
    ],
    oddEvents: [
      { error: { message: 'overloaded', type: 'server_error', code: 500 } }, { error: 'plain' }, { error: null }, { choices: null }, { choices: [null] }, { choices: [{}] },
      { choices: [{ index: 0, delta: { tool_calls: [{ index: 4294967296, function: { name: 'upper' } }] } }] }, { choices: [{ delta: { tool_calls: [{ index: -1 }] } }] },
      { choices: [{ delta: { tool_calls: [{ function: { arguments: { text: 'an object' } } }] } }] }, { choices: [{ delta: { content: ['a', 'list'] } }] },
      { choices: [{ delta: { reasoning_content: 'thinking' } }] }, { choices: [{ delta: { reasoning_content: 5, tool_calls: [{ index: 0, extra_content: 'x'.repeat(600_000) }] } }] },
      { choices: [{ delta: { tool_calls: [{ index: 0, id: 'call_2', extra_content: [null, { deep: [[[]]] }] }] } }] }, { usage: { prompt_tokens: -5, completion_tokens: 1e300 } }, { usage: { prompt_tokens: 2 ** 64 } }, '[DONE]', 'not json', '',
    ],
    oddBytes: ['\n\n', 'data: ', 'data:', 'event: error\n', 'event: \n', ': keep-alive\n\n', 'id: 1\n', 'retry: 1\n', 'data: {"choices":[{"delta":{"content":"x"\n\n'],
  };
}

/** Anthropic Messages: `event:`/`data:` pairs, content blocks by index, `message_stop`. */
export function anthropicWire(anthropic: Factory): WireFormat {
  const event = (type: string, value: Record<string, unknown>) => ({ type, ...value });
  const start = event('message_start', {
    message: { id: 'msg_fz', type: 'message', role: 'assistant', content: [], model: 'fz', stop_reason: null, stop_sequence: null, usage: { input_tokens: 3, output_tokens: 1 } },
  });
  const textBlock = (text: string) => [
    event('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    event('ping', {}),
    event('content_block_delta', { index: 0, delta: { type: 'text_delta', text } }),
    event('content_block_stop', { index: 0 }),
  ];
  const end = (reason: string) => [event('message_delta', { delta: { stop_reason: reason, stop_sequence: null }, usage: { output_tokens: 5 } }), event('message_stop', {})];
  return {
    name: 'anthropic',
    provider: (url) => anthropic({ baseURL: url, apiKey: 'x', model: 'fz', retry: { maxRetries: 0 }, timeoutMs: 3000 }),
    contentType: 'text/event-stream',
    // The event's name from its `type`, as the API writes it (a mutated type renames it too).
    frame: (e) => {
      const type = typeof e === 'object' && e !== null && typeof (e as { type?: unknown }).type === 'string' ? (e as { type: string }).type : undefined;
      return `${type === undefined ? '' : `event: ${type}\n`}data: ${textOf(e)}\n\n`;
    },
    plain: [start, ...textBlock('fine'), ...end('end_turn')],
    toolCallAnswer: (text, name, args) => [
      start,
      ...textBlock(text),
      event('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 'toolu_1', name, input: {} } }),
      // The API opens every tool_use block with an empty partial_json.
      ...['', ...inThree(args)].map((partial_json) => event('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json } })),
      event('content_block_stop', { index: 1 }),
      ...end('tool_use'),
    ],
    oddEvents: [
      event('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }), event('error', { error: 'plain' }), event('error', {}),
      event('content_block_delta', { index: 7, delta: { type: 'text_delta', text: 'x' } }), event('content_block_delta', { index: 0, delta: { type: 'input_json_delta', partial_json: '{' } }),
      event('content_block_delta', { index: 1, delta: { type: 'text_delta', text: 'into a tool call' } }), event('content_block_delta', { index: 0, delta: { type: 'thinking_delta', thinking: 'hm' } }),
      event('content_block_delta', { index: 0, delta: null }), event('content_block_start', { index: 1, content_block: { type: 'tool_use', id: null, name: 5, input: 'x' } }),
      event('content_block_start', { index: 0, content_block: { type: 'server_tool_use', id: 's', name: 'web_search', input: {} } }), event('content_block_stop', { index: 99 }),
      event('message_delta', { delta: { stop_reason: 'max_tokens' }, usage: { output_tokens: -1 } }), event('message_delta', { usage: { output_tokens: 2 ** 64 } }),
      event('message_start', { message: null }), event('message_stop', {}), event('unknown_event', { index: 0 }), { type: 7 }, '[DONE]', 'not json', '',
    ],
    oddBytes: ['\n\n', 'event: message_stop\n', 'event: error\n', 'event: \n', 'data: ', ': keep-alive\n\n', 'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"\n\n'],
  };
}

/** Ollama's native chat: one JSON object per line, whole tool calls, `done`. */
export function ollamaWire(ollama: Factory): WireFormat {
  const line = (message: Record<string, unknown>, done = false, extra: Record<string, unknown> = {}) => ({
    model: 'fz', created_at: '2026-11-24T00:00:00Z', message: { role: 'assistant', content: '', ...message }, done, ...extra,
  });
  const end = line({}, true, { done_reason: 'stop', prompt_eval_count: 3, eval_count: 5 });
  return {
    name: 'ollama',
    provider: (url) => ollama({ baseURL: url, model: 'fz', retry: { maxRetries: 0 }, timeoutMs: 3000 }),
    contentType: 'application/x-ndjson',
    frame: (e) => `${textOf(e)}\n`,
    plain: [line({ content: 'fine' }), end],
    toolCallAnswer: (text, name, args) => [
      // A thinking model's reasoning, which comes back as the call's providerData.
      line({ thinking: 'Thinking.' }),
      line({ content: text }),
      // Ollama sends a call whole, with its arguments as an object (a string when they are not JSON).
      line({ tool_calls: [{ function: { name, arguments: (() => { try { return JSON.parse(args) as unknown; } catch { return args; } })() } }] }),
      end,
    ],
    oddEvents: [
      { error: 'model "fz" not found' }, { error: { message: 'an object' } }, { error: null, message: { content: 'x' } }, line({ tool_calls: [{ function: { name: 'upper', arguments: '{"text":' } }] }),
      line({ tool_calls: null }), line({ tool_calls: [null] }), line({ tool_calls: [{ function: null }] }), line({ content: ['a', 'list'] }), line({ thinking: 'hm' }), line({ thinking: 5 }), line({ thinking: 'x'.repeat(600_000) }), { message: null, done: false },
      line({}, true, { eval_count: 2 ** 64, prompt_eval_count: -1 }), line({}, true, { done_reason: 'length' }), { done: 'yes' }, '[DONE]', 'not json', '', '[1,2]',
    ],
    oddBytes: ['\n\n', '{"message":{"content":"x"}', '{', ' \n', '\r\n'],
  };
}
