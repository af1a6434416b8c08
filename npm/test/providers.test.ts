/**
 * Providers against the mock LLM server over real `fetch`: streaming, tool calls, usage,
 * request mapping, retries, aborts, timeouts and malformed answers, for each wire format.
 */

import assert from 'node:assert/strict';
import { after, before, beforeEach, describe, it } from 'node:test';
import { isDeepStrictEqual } from 'node:util';
import { AbortError, CrucibleError, ProviderError } from '../src/errors.js';
import { anthropic, ollama, openai } from '../src/providers/index.js';
import { parseRetryAfter } from '../src/providers/http.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, OllamaOptions, OpenAIOptions, ProviderOptions, ToolDefinition } from '../src/providers/types.js';
import { echoToolResponder, startMockLlmServer, type MockLlmServer, type MockReply, type MockRequest } from './support/mock-llm-server.js';
import { writeEvents } from './support/endless-stream.js';
import { startJsonServer } from './support/json-server.js';
import { iterations, seeded } from './support/seeded.js';

// ---------------------------------------------------------------------------------------------
// Helpers

interface Assembled {
  chunks: ModelChunk[];
  text: string;
  calls: Array<{ id: string | undefined; name: string; arguments: string; providerData?: unknown }>;
  finish: Extract<ModelChunk, { type: 'finish' }> | undefined;
}

/** Folds chunks the way the core does: tool-call pieces by index, names and arguments
 *  concatenated, the last `providerData` given kept. */
async function collect(stream: AsyncIterable<ModelChunk>): Promise<Assembled> {
  const chunks: ModelChunk[] = [];
  for await (const chunk of stream) chunks.push(chunk);
  const byIndex = new Map<number, Assembled['calls'][number]>();
  for (const chunk of chunks) {
    if (chunk.type !== 'tool_call') continue;
    const call = byIndex.get(chunk.index) ?? { id: undefined, name: '', arguments: '' };
    if (chunk.id) call.id = chunk.id;
    if (chunk.name) call.name += chunk.name;
    call.arguments += chunk.argumentsDelta;
    if (chunk.providerData !== undefined) call.providerData = chunk.providerData;
    byIndex.set(chunk.index, call);
  }
  const last = chunks.at(-1);
  return {
    chunks,
    text: chunks.map((c) => (c.type === 'text' ? c.delta : '')).join(''),
    calls: [...byIndex.entries()].sort(([a], [b]) => a - b).map(([, call]) => call),
    finish: last?.type === 'finish' ? last : undefined,
  };
}

/** An `assert.rejects` check: a `CrucibleError` `provider_protocol` whose message matches. */
function failsAsProviderProtocol(message: RegExp): (error: unknown) => true {
  return (error) => {
    assert.ok(error instanceof CrucibleError, String(error));
    assert.equal(error.code, 'provider_protocol');
    assert.match(error.message, message);
    return true;
  };
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (error) {
    return error;
  }
  assert.fail('expected the call to fail');
}

const weatherTool: ToolDefinition = {
  name: 'get_weather',
  description: 'Current weather for a city',
  inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

/** `weatherTool` as a host tool that answers 21C, with the cities it was asked for. */
async function recordingWeather() {
  const { tool } = await import('../src/node.js');
  const cities: string[] = [];
  const weather = tool({ ...weatherTool, execute: ({ city }: { city: string }) => (cities.push(city), '21C') });
  return { weather, cities };
}

const hello: ChatMessage[] = [{ role: 'user', content: 'Hello' }];

/** A conversation that exercises every message kind, including two parallel tool results. */
const toolConversation: ChatMessage[] = [
  { role: 'system', content: 'Be brief.' },
  { role: 'user', content: 'Weather in Paris and Rome?' },
  {
    role: 'assistant',
    content: '',
    toolCalls: [
      { id: 'call_1', name: 'get_weather', arguments: '{"city":"Paris"}' },
      { id: 'call_2', name: 'get_weather', arguments: '{"city":"Rome"}' },
    ],
  },
  { role: 'tool', toolCallId: 'call_1', name: 'get_weather', content: '18C' },
  { role: 'tool', toolCallId: 'call_2', name: 'get_weather', content: '24C' },
];

type Factory = (options: ProviderOptions) => ModelProvider;

const providers: Array<{ name: string; factory: Factory; baseURL: (s: MockLlmServer) => string; splitsArguments: boolean }> = [
  { name: 'openai', factory: openai, baseURL: (s) => s.openaiBaseURL, splitsArguments: true },
  { name: 'anthropic', factory: anthropic, baseURL: (s) => s.anthropicBaseURL, splitsArguments: true },
  { name: 'ollama', factory: ollama, baseURL: (s) => s.ollamaBaseURL, splitsArguments: false },
];

let server: MockLlmServer;
before(async () => {
  server = await startMockLlmServer({ replies: [] });
});
after(async () => {
  await server.close();
});
beforeEach(() => {
  server.reset();
  server.setResponder(undefined);
});

// ---------------------------------------------------------------------------------------------
// Behaviour shared by every provider

for (const { name, factory, baseURL, splitsArguments } of providers) {
  describe(`${name} provider`, () => {
    const make = (options: Partial<ProviderOptions> = {}) =>
      factory({ model: 'test-model', baseURL: baseURL(server), apiKey: 'sk-test', retry: { initialDelayMs: 5 }, ...options });

    it('has the id "<provider>:<model>"', () => {
      assert.equal(make().id, `${name}:test-model`);
    });

    it('streams text deltas in order and finishes last', async () => {
      server.enqueue({ text: ['Hel', 'lo, ', 'world'] });
      const result = await collect(make().stream({ messages: hello, tools: [] }));
      const deltas = result.chunks.filter((c) => c.type === 'text').map((c) => (c as { delta: string }).delta);
      assert.deepEqual(deltas, ['Hel', 'lo, ', 'world']);
      assert.equal(result.finish?.finishReason, name === 'anthropic' ? 'end_turn' : 'stop');
      assert.equal(result.chunks.filter((c) => c.type === 'finish').length, 1);
      assert.equal(server.requests.length, 1);
      assert.equal(server.requests[0]?.stream, true);
    });

    it('streams a tool call whose pieces assemble to the right name and arguments', async () => {
      server.enqueue({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Paris', unit: 'celsius' } }] });
      const result = await collect(make().stream({ messages: hello, tools: [weatherTool] }));
      assert.equal(result.calls.length, 1);
      assert.equal(result.calls[0]?.name, 'get_weather');
      assert.deepEqual(JSON.parse(result.calls[0]!.arguments), { city: 'Paris', unit: 'celsius' });
      assert.ok(result.calls[0]?.id, 'the call has an id');
      const pieces = result.chunks.filter((c) => c.type === 'tool_call');
      // OpenAI and Anthropic stream arguments in pieces; Ollama sends each call whole.
      if (splitsArguments) assert.ok(pieces.length > 2, `expected several pieces, got ${pieces.length}`);
      else assert.equal(pieces.length, 1);
      assert.equal(result.finish?.finishReason, { openai: 'tool_calls', anthropic: 'tool_use', ollama: 'stop' }[name]);
    });

    it('keeps parallel tool calls apart by index', async () => {
      server.enqueue({
        text: 'Checking both.',
        toolCalls: [
          { name: 'get_weather', arguments: { city: 'Paris' } },
          { name: 'get_time', arguments: { zone: 'Europe/Rome' } },
        ],
      });
      const result = await collect(make().stream({ messages: hello, tools: [weatherTool] }));
      assert.equal(result.text, 'Checking both.');
      assert.deepEqual(
        result.calls.map((c) => [c.name, JSON.parse(c.arguments)]),
        [
          ['get_weather', { city: 'Paris' }],
          ['get_time', { zone: 'Europe/Rome' }],
        ],
      );
      assert.deepEqual(
        [...new Set(result.chunks.filter((c) => c.type === 'tool_call').map((c) => (c as { index: number }).index))],
        [0, 1],
      );
      assert.notEqual(result.calls[0]?.id, result.calls[1]?.id);
    });

    it('maps token usage onto the finish chunk', async () => {
      server.enqueue({ text: 'ok', usage: { inputTokens: 123, outputTokens: 45 } });
      const result = await collect(make().stream({ messages: hello, tools: [] }));
      assert.deepEqual(result.finish?.usage, { inputTokens: 123, outputTokens: 45 });
      // Counts are whole: a server's fraction is rounded down, a huge one held to 2^53 - 1.
      server.enqueue({ text: 'ok', usage: { inputTokens: 12.5, outputTokens: 1e20 } });
      const odd = await collect(make().stream({ messages: hello, tools: [] }));
      assert.deepEqual(odd.finish?.usage, { inputTokens: 12, outputTokens: Number.MAX_SAFE_INTEGER });
    });

    it('retries a 429 and then succeeds', async () => {
      server.enqueue({ status: 429 }, { status: 429 }, { text: 'finally' });
      const result = await collect(make().stream({ messages: hello, tools: [] }));
      assert.equal(result.text, 'finally');
      assert.equal(server.requests.length, 3);
    });

    it('gives up on HTTP 500 after the bounded retries with a typed error', async () => {
      server.enqueue(...Array.from({ length: 5 }, () => ({ status: 500, body: 'tool parse failure' })));
      const error = await rejection(collect(make({ retry: { maxRetries: 2, initialDelayMs: 5 } }).stream({ messages: hello, tools: [weatherTool] })));
      assert.ok(error instanceof ProviderError);
      assert.equal(error.code, 'provider_http');
      assert.equal(error.status, 500);
      assert.equal(error.retryable, true);
      assert.equal(error.provider, `${name}:test-model`);
      assert.equal(error.body, 'tool parse failure');
      assert.equal(server.requests.length, 3);
    });

    it('does not retry a 400', async () => {
      server.enqueue({ status: 400 }, { text: 'never sent' });
      const error = await rejection(collect(make().stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError);
      assert.equal(error.status, 400);
      assert.equal(error.retryable, false);
      assert.match(error.body ?? '', /scripted HTTP 400/);
      assert.equal(server.requests.length, 1);
    });

    it('throws AbortError quickly when aborted mid-stream', async () => {
      server.enqueue({ text: ['first ', 'second'], hangMs: 10_000 });
      const controller = new AbortController();
      const seen: ModelChunk[] = [];
      const started = Date.now();
      const error = await rejection(
        (async () => {
          for await (const chunk of make().stream({ messages: hello, tools: [] }, { signal: controller.signal })) {
            seen.push(chunk);
            controller.abort();
          }
        })(),
      );
      assert.ok(error instanceof AbortError, `got ${String(error)}`);
      assert.equal(error.code, 'aborted');
      assert.deepEqual(seen, [{ type: 'text', delta: 'first ' }]);
      assert.ok(Date.now() - started < 2000);
      assert.equal(server.requests.length, 1);
    });

    it('lets the consumer stop early without waiting for the rest of the stream', async () => {
      server.enqueue({ text: ['first ', 'second'], hangMs: 10_000 });
      const started = Date.now();
      for await (const chunk of make().stream({ messages: hello, tools: [] })) {
        assert.deepEqual(chunk, { type: 'text', delta: 'first ' });
        break;
      }
      assert.ok(Date.now() - started < 2000);
    });

    it('fails with provider_timeout when the server stalls past timeoutMs, without retrying', async () => {
      server.enqueue({ text: ['slow'], hangMs: 10_000 }, { text: 'not reached' });
      const started = Date.now();
      const error = await rejection(collect(make({ timeoutMs: 150 }).stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError, `got ${String(error)}`);
      assert.equal(error.code, 'provider_timeout');
      assert.ok(Date.now() - started < 2000);
      assert.equal(server.requests.length, 1);
    });

    it('lets a streamed answer that keeps coming run past timeoutMs: the timeout is for stalls', async () => {
      const pieces = Array.from({ length: 8 }, (_, i) => `w${i} `);
      server.enqueue({ text: pieces, chunkDelayMs: 60 });
      const started = Date.now();
      const result = await collect(make({ timeoutMs: 250 }).stream({ messages: hello, tools: [] }));
      assert.equal(result.text, pieces.join(''));
      assert.ok(Date.now() - started > 250, 'the whole answer took longer than timeoutMs');
    });

    it('fails with provider_protocol on malformed streamed JSON, without retrying', async () => {
      server.enqueue({ text: ['a', 'b'], malformed: true }, { text: 'not reached' });
      const error = await rejection(collect(make().stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError, `got ${String(error)}`);
      assert.equal(error.code, 'provider_protocol');
      assert.equal(server.requests.length, 1);
    });

    it('surfaces an error reported inside the stream as a ProviderError', async () => {
      server.enqueue({ text: ['partial ', 'answer'], streamError: { type: 'server_error', message: 'model crashed' } });
      const error = await rejection(collect(make().stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError, `got ${String(error)}`);
      assert.equal(error.code, 'provider_http');
      assert.match(error.message, /model crashed/);
      // Text was already yielded, so even a retryable error must not be retried.
      assert.equal(server.requests.length, 1);
    });

    if (name !== 'ollama') {
      // Ollama's streamed errors are never retryable; these two servers report overloads so.
      it('an overload error event after a text delta is not retryable: the caller has that text already', async () => {
        server.enqueue({ text: ['partial'], streamError: { type: 'overloaded_error', message: 'Overloaded' } }, { text: 'not reached' });
        const seen: ModelChunk[] = [];
        const error = await rejection(
          (async () => {
            for await (const chunk of make().stream({ messages: hello, tools: [] })) seen.push(chunk);
          })(),
        );
        assert.deepEqual(seen, [{ type: 'text', delta: 'partial' }]);
        assert.ok(error instanceof ProviderError && error.code === 'provider_http', `got ${String(error)}`);
        assert.match(error.message, /Overloaded/);
        assert.equal(error.retryable, false);
        assert.equal(server.requests.length, 1);
      });

      it('the same overload before any output is retried, and retryable when retries run out', async () => {
        server.enqueue({ streamError: { type: 'overloaded_error', message: 'Overloaded' } }, { text: 'recovered' });
        assert.equal((await collect(make().stream({ messages: hello, tools: [] }))).text, 'recovered');
        assert.equal(server.requests.length, 2);
        server.reset();
        server.enqueue({ streamError: { type: 'overloaded_error', message: 'Overloaded' } });
        const error = await rejection(collect(make({ retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [] })));
        assert.ok(error instanceof ProviderError && error.code === 'provider_http', `got ${String(error)}`);
        assert.equal(error.retryable, true);
      });
    }

    it('a stall after output is a provider_timeout that is not retryable', async () => {
      server.enqueue({ text: ['first ', 'second'], hangMs: 2_000 });
      const error = await rejection(collect(make({ timeoutMs: 150 }).stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError && error.code === 'provider_timeout', `got ${String(error)}`);
      assert.equal(error.retryable, false);
    });

    it('answers in one response when stream is false, with the same chunk types', async () => {
      server.enqueue({
        text: 'Sure.',
        toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }],
        usage: { inputTokens: 9, outputTokens: 3 },
      });
      const result = await collect(make({ stream: false }).stream({ messages: hello, tools: [weatherTool] }));
      assert.equal(result.text, 'Sure.');
      assert.deepEqual(result.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [['get_weather', { city: 'Oslo' }]]);
      assert.deepEqual(result.finish?.usage, { inputTokens: 9, outputTokens: 3 });
      assert.equal(server.requests[0]?.stream, false);
      assert.equal(server.requests[0]?.body.stream, name === 'anthropic' ? undefined : false);
    });

    it('fails with provider_protocol on a malformed non-streaming body', async () => {
      server.enqueue({ malformed: true });
      const error = await rejection(collect(make({ stream: false }).stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError);
      assert.equal(error.code, 'provider_protocol');
    });

    it('does not send a request when the signal is already aborted', async () => {
      server.enqueue({ text: 'never' });
      const error = await rejection(collect(make().stream({ messages: hello, tools: [] }, { signal: AbortSignal.abort() })));
      assert.ok(error instanceof AbortError);
      assert.equal(server.requests.length, 0);
    });

    it('stops waiting for a retry as soon as the caller aborts', async () => {
      server.enqueue({ status: 503 }, { text: 'not reached' });
      const controller = new AbortController();
      setTimeout(() => controller.abort(), 50);
      const started = Date.now();
      const slowRetry = make({ retry: { initialDelayMs: 5000, maxDelayMs: 5000 } });
      const error = await rejection(collect(slowRetry.stream({ messages: hello, tools: [] }, { signal: controller.signal })));
      assert.ok(error instanceof AbortError, `got ${String(error)}`);
      assert.ok(Date.now() - started < 1000);
      assert.equal(server.requests.length, 1);
    });

    it('maps a refused connection to a retryable provider_network error', async () => {
      const closed = await startMockLlmServer();
      const url = baseURL(closed);
      await closed.close();
      const error = await rejection(
        collect(factory({ model: 'm', baseURL: url, retry: { maxRetries: 1, initialDelayMs: 5 } }).stream({ messages: hello, tools: [] })),
      );
      assert.ok(error instanceof ProviderError, `got ${String(error)}`);
      assert.equal(error.code, 'provider_network');
      assert.equal(error.retryable, true);
    });
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping, per wire format

describe('openai request mapping', () => {
  it('sends messages, tool calls, tool results, tools and the streaming options', async () => {
    server.enqueue({ text: 'ok' });
    const model = openai({ model: 'gpt-test', baseURL: server.openaiBaseURL, apiKey: 'sk-123', headers: { 'x-extra': '1' } });
    await collect(model.stream({ messages: toolConversation, tools: [weatherTool], temperature: 0.2, maxTokens: 64 }));
    const request = server.requests[0]!;
    assert.equal(request.path, '/v1/chat/completions');
    assert.equal(request.headers.authorization, 'Bearer sk-123');
    assert.equal(request.headers['x-extra'], '1');
    assert.deepEqual(request.body, {
      model: 'gpt-test',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Weather in Paris and Rome?' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [
            { id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } },
            { id: 'call_2', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Rome"}' } },
          ],
        },
        { role: 'tool', tool_call_id: 'call_1', content: '18C' },
        { role: 'tool', tool_call_id: 'call_2', content: '24C' },
      ],
      tools: [
        {
          type: 'function',
          function: { name: 'get_weather', description: 'Current weather for a city', parameters: weatherTool.inputSchema },
        },
      ],
      temperature: 0.2,
      max_tokens: 64,
      stream: true,
      stream_options: { include_usage: true },
    });
  });

  it('omits tools when there are none and the key when none is given', async () => {
    server.enqueue({ text: 'ok' });
    await collect(openai({ model: 'local', baseURL: server.openaiBaseURL }).stream({ messages: hello, tools: [] }));
    const request = server.requests[0]!;
    assert.equal('tools' in request.body, false);
    assert.equal(request.headers.authorization, undefined);
  });
  it('asks reasoning models (o-series, gpt-5) for max_completion_tokens and no temperature, which they require', async () => {
    const sent = async (options: Record<string, unknown>) => {
      server.enqueue({ text: 'ok' });
      await collect(openai({ baseURL: server.openaiBaseURL, ...options } as OpenAIOptions).stream({ messages: hello, tools: [], temperature: 0, maxTokens: 512 }));
      const { temperature, max_tokens, max_completion_tokens, reasoning_effort } = server.requests.at(-1)!.body as Record<string, unknown>;
      return { temperature, max_tokens, max_completion_tokens, reasoning_effort };
    };
    const reasoning = { temperature: undefined, max_tokens: undefined, max_completion_tokens: 512, reasoning_effort: undefined };
    for (const model of ['o1', 'o3-mini', 'o4-mini-2025-04-16', 'gpt-5', 'gpt-5-nano', 'GPT-5.1']) assert.deepEqual(await sent({ model }), reasoning, model);
    // Other models, OpenRouter's vendor-prefixed names (it maps parameters itself) and names
    // that only look alike keep the classic fields.
    const classic = { temperature: 0, max_tokens: 512, max_completion_tokens: undefined, reasoning_effort: undefined };
    for (const model of ['gpt-4o-mini', 'qwen2.5-0.5b-instruct', 'openai/o3-mini', 'olmo-2', 'gpt-50x']) assert.deepEqual(await sent({ model }), classic, model);
    // The name guess can be overridden both ways, and an effort is passed through.
    assert.deepEqual(await sent({ model: 'my-azure-deployment', reasoningModel: true, reasoningEffort: 'low' }), { ...reasoning, reasoning_effort: 'low' });
    assert.deepEqual(await sent({ model: 'o3-mini', reasoningModel: false }), classic);
  });
});

describe('extraBody', () => {
  it('adds fields the provider does not map to every request, after its own: a field named there replaces the provider\'s', async () => {
    const extraBody = { seed: 7, top_p: 0.5, temperature: 0.1 };
    for (const [make, base] of [[openai, server.openaiBaseURL], [anthropic, server.anthropicBaseURL], [ollama, server.ollamaBaseURL]] as const) {
      server.reset();
      server.enqueue({ text: 'ok' });
      assert.equal((await collect(make({ model: 'm', baseURL: base, extraBody }).stream({ messages: hello, tools: [], temperature: 0.9 }))).text, 'ok');
      const body = server.requests[0]!.body;
      assert.equal(body.seed, 7, make.name);
      assert.equal(body.top_p, 0.5, make.name);
      assert.equal(body.temperature, 0.1, `${make.name}: extraBody's temperature replaces the request's`);
      assert.equal(body.model, 'm', make.name);
    }
    assert.throws(() => openai({ model: 'm', extraBody: 'seed=7' as never }), { code: 'invalid_config', message: /extraBody/ });
  });
});

describe('request headers', () => {
  it('one value per header name whatever its case: a spelling of a default or of the key in `headers` replaces it, and unset values are left out', async () => {
    // `fetch` joins two spellings of one name into one value ("application/json, application/json"),
    // which servers that read the content type strictly (FastAPI's, vLLM's among them) refuse.
    const headers = { 'Content-Type': 'application/json', Authorization: 'Bearer from-headers', 'X-Title': 'app', 'OpenAI-Organization': undefined } as unknown as Record<string, string>;
    for (const [make, base] of [[openai, server.openaiBaseURL], [ollama, server.ollamaBaseURL]] as const) {
      server.reset();
      server.enqueue({ text: 'ok' });
      await collect(make({ model: 'm', baseURL: base, apiKey: 'sk-123', headers }).stream({ messages: hello, tools: [] }));
      const sent = server.requests[0]!.headers;
      assert.equal(sent['content-type'], 'application/json', make.name);
      // The provider's own key wins over an authorization header, as it did spelled in lower case.
      assert.equal(sent.authorization, 'Bearer sk-123', make.name);
      assert.equal(sent['x-title'], 'app', make.name);
      assert.equal('openai-organization' in sent, false, make.name);
    }
    server.reset();
    server.enqueue({ text: 'ok' });
    const claude = anthropic({ model: 'm', baseURL: server.anthropicBaseURL, apiKey: 'sk-ant', headers: { 'Anthropic-Version': '2024-01-01', 'X-Api-Key': 'other' } });
    await collect(claude.stream({ messages: hello, tools: [] }));
    const sent = server.requests[0]!.headers;
    assert.equal(sent['anthropic-version'], '2024-01-01');
    assert.equal(sent['x-api-key'], 'sk-ant');
  });
});

describe('openai(): servers that refuse stream_options (Mistral, Azure AI Foundry)', () => {
  // Mistral's answer, and one in the manner of Azure AI Foundry's with `extra-parameters: error`.
  const mistral = JSON.stringify({ object: 'error', message: { detail: [{ type: 'extra_forbidden', loc: ['body', 'stream_options', 'include_usage'], msg: 'Extra inputs are not permitted', input: true }] }, type: 'invalid_request_error', param: null, code: null });
  const azure = JSON.stringify({ error: { code: 'Invalid input', message: "Extra parameters ['stream_options'] are not allowed when extra-parameters is set to 'error'.", status: 400 } });
  const refusing = (status: number, body: string) => (request: MockRequest): MockReply => (request.body.stream_options !== undefined ? { status, body } : { text: 'ok' });

  it('a 4xx naming stream_options is answered by sending the request once more without it, and the provider leaves it out from then on', async () => {
    for (const [status, body] of [[422, mistral], [400, azure]] as const) {
      server.reset();
      server.setResponder(refusing(status, body));
      const model = openai({ model: 'mistral-large-latest', baseURL: server.openaiBaseURL, apiKey: 'k', retry: { maxRetries: 0 } });
      const first = await collect(model.stream({ messages: hello, tools: [] }));
      assert.equal(first.text, 'ok');
      // Usage comes only when the server reports it unasked; this one does not.
      assert.equal(first.finish?.usage, undefined);
      assert.deepEqual(server.requests.map((r) => r.body.stream_options), [{ include_usage: true }, undefined], `HTTP ${status}`);
      assert.equal((await collect(model.stream({ messages: hello, tools: [] }))).text, 'ok');
      assert.equal(server.requests.length, 3);
      assert.equal('stream_options' in server.requests[2]!.body, false);
    }
  });

  it('streamUsage: false leaves it out from the start; a 4xx that does not name it is not sent again', async () => {
    server.enqueue({ text: 'ok' });
    await collect(openai({ model: 'm', baseURL: server.openaiBaseURL, streamUsage: false }).stream({ messages: hello, tools: [] }));
    assert.equal('stream_options' in server.requests[0]!.body, false);
    assert.equal(server.requests[0]!.body.stream, true);

    server.reset();
    server.enqueue({ status: 400, body: JSON.stringify({ error: { message: 'Invalid model: m', type: 'invalid_request_error' } }) });
    const error = await rejection(collect(openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError && error.status === 400, `got ${String(error)}`);
    assert.equal(server.requests.length, 1);
  });
});

describe('openai(): what servers need back with past tool calls (DeepSeek reasoning_content, Gemini thought signatures, OpenRouter reasoning_details)', () => {
  interface WireMessage {
    role: string;
    reasoning_content?: unknown;
    reasoning_details?: unknown;
    tool_calls?: Array<{ id: string; extra_content?: unknown }>;
  }
  interface WireBody {
    stream: boolean;
    messages: WireMessage[];
  }
  let raw: import('node:http').Server;
  let base = '';
  const bodies: WireBody[] = [];
  /** The answer to a request: a status and a JSON body, or SSE data lines, all at once or (`long`)
   *  one at a time for as long as the client reads them. */
  let answer: (body: WireBody) => { status: number; json: unknown } | { sse: unknown[] } | { long: Iterable<unknown> };
  /** How many events the last `long` answer wrote before it ended or the client went away. */
  let written = Promise.resolve(0);
  before(async () => {
    const started = await startJsonServer<WireBody>((body, res) => {
      bodies.push(body);
      const reply = answer(body);
      if ('long' in reply) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        const events = function* () {
          for (const data of reply.long) yield `data: ${JSON.stringify(data)}\n\n`;
          yield 'data: [DONE]\n\n';
        };
        written = writeEvents(res, events());
      } else if ('sse' in reply) {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end([...reply.sse.map((data) => `data: ${JSON.stringify(data)}\n\n`), 'data: [DONE]\n\n'].join(''));
      } else {
        res.writeHead(reply.status, { 'content-type': 'application/json' });
        res.end(JSON.stringify(reply.json));
      }
    });
    raw = started.server;
    base = `${started.origin}/v1`;
  });
  after(() => raw.close());
  beforeEach(() => {
    bodies.length = 0;
  });

  /** Runs the tool loop the way the core does, answering every call with "21C"; the final text. */
  async function toolLoop(model: ModelProvider): Promise<string> {
    const messages: ChatMessage[] = [{ role: 'user', content: 'Weather in Oslo, then in Lima?' }];
    for (let turn = 0; turn < 5; turn++) {
      const out = await collect(model.stream({ messages, tools: [weatherTool] }));
      if (out.calls.length === 0) return out.text;
      messages.push({ role: 'assistant', content: out.text, toolCalls: out.calls.map((call) => ({ ...call, id: call.id! })) });
      for (const call of out.calls) messages.push({ role: 'tool', toolCallId: call.id!, name: call.name, content: '21C' });
    }
    assert.fail('the tool loop did not end');
  }

  /** DeepSeek in thinking mode: a turn's reasoning comes with its tool calls, and every assistant
   *  message with tool calls must carry it back, else 400. Answers streamed or whole, as asked. */
  function deepSeek(body: WireBody): ReturnType<typeof answer> {
    const missing = body.messages.findIndex((m) => m.role === 'assistant' && m.tool_calls && typeof m.reasoning_content !== 'string');
    if (missing >= 0) {
      const message = `Missing \`reasoning_content\` field in the assistant message at message index ${missing}. For more information, please refer to https://api-docs.deepseek.com/guides/thinking_mode#tool-calls`;
      return { status: 400, json: { error: { message, type: 'invalid_request_error', param: null, code: 'invalid_request_error' } } };
    }
    const done = body.messages.filter((m) => m.role === 'tool').length;
    const city = ['Oslo', 'Lima'][done];
    const reasoning = city ? [`I should look up `, `the weather in ${city}.`] : ['Both are known.'];
    const call = city && { index: 0, id: `call_${done}`, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) } };
    if (!body.stream) {
      const message = { role: 'assistant', reasoning_content: reasoning.join(''), content: call ? '' : 'Both 21C.', ...(call && { tool_calls: [call] }) };
      return { status: 200, json: { choices: [{ index: 0, message, finish_reason: call ? 'tool_calls' : 'stop' }] } };
    }
    const delta = (d: Record<string, unknown>, finish: string | null = null) => ({ choices: [{ index: 0, delta: d, finish_reason: finish }] });
    return {
      sse: [
        delta({ role: 'assistant', content: null, reasoning_content: reasoning[0] }),
        ...reasoning.slice(1).map((r) => delta({ reasoning_content: r })),
        call ? delta({ tool_calls: [call] }) : delta({ content: 'Both 21C.' }),
        delta({}, call ? 'tool_calls' : 'stop'),
      ],
    };
  }

  it("DeepSeek: each tool-call turn's reasoning_content, streamed or whole, goes back on its assistant message", async () => {
    for (const stream of [true, false]) {
      bodies.length = 0;
      answer = deepSeek;
      const model = openai({ baseURL: base, apiKey: 'k', model: 'deepseek-v4-pro', stream, retry: { maxRetries: 0 } });
      assert.equal(await toolLoop(model), 'Both 21C.', `stream: ${stream}`);
      const last = bodies.at(-1)!.messages;
      assert.deepEqual(last.map((m) => m.reasoning_content), [undefined, 'I should look up the weather in Oslo.', undefined, 'I should look up the weather in Lima.', undefined]);
    }
  });

  const signature = { google: { thought_signature: 'CrICAdHtim827fQ==' } };
  /** Gemini 3: parallel calls, the first with its thought signature, which must come back on
   *  that call, else 400. */
  function gemini(body: WireBody): ReturnType<typeof answer> {
    const unsigned = body.messages.findIndex((m) => m.tool_calls && m.tool_calls[0]?.extra_content === undefined);
    if (unsigned >= 0) return { status: 400, json: [{ error: { code: 400, message: `Function call is missing a thought_signature in functionCall parts. position ${unsigned}`, status: 'INVALID_ARGUMENT' } }] };
    if (body.messages.some((m) => m.role === 'tool')) return { sse: [{ choices: [{ index: 0, delta: { role: 'assistant', content: 'Both 21C.' }, finish_reason: 'stop' }] }] };
    const call = (index: number, city: string) => ({ index, id: `function-call-${index}`, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) } });
    return {
      sse: [
        // Parallel calls: only the first has a signature.
        { choices: [{ index: 0, delta: { role: 'assistant', tool_calls: [{ ...call(0, 'Oslo'), extra_content: signature }] } }] },
        { choices: [{ index: 0, delta: { tool_calls: [call(1, 'Lima')] }, finish_reason: 'tool_calls' }] },
      ],
    };
  }

  it("Gemini 3: each call's extra_content (its thought signature) goes back on that call, and only there", async () => {
    answer = gemini;
    const model = openai({ baseURL: base, apiKey: 'k', model: 'gemini-3-pro-preview', retry: { maxRetries: 0 } });
    assert.equal(await toolLoop(model), 'Both 21C.');
    const assistant = bodies.at(-1)!.messages[1]!;
    assert.deepEqual(assistant.tool_calls!.map((call) => call.extra_content), [signature, undefined]);
    assert.equal('extra_content' in assistant.tool_calls![1]!, false);
    assert.equal('reasoning_content' in assistant, false);
  });

  it("they travel as the calls' providerData: another provider object sends back what the messages hold, and nothing else", async () => {
    answer = () => ({ status: 200, json: { choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] } });
    const toolCalls = [
      { id: 'call_0', name: 'get_weather', arguments: '{}', providerData: { reasoning_content: 'Two cities.', extra_content: { n: 0 } } },
      { id: 'call_1', name: 'get_weather', arguments: '{}' },
      // What another provider (or an edited state) left: not this provider's to send.
      { id: 'call_2', name: 'get_weather', arguments: '{}', providerData: 'opaque' },
    ];
    const fresh = openai({ baseURL: base, apiKey: 'k', model: 'm', stream: false, retry: { maxRetries: 0 } });
    await collect(fresh.stream({ messages: [...hello, { role: 'assistant', content: '', toolCalls }], tools: [weatherTool] }));
    const sent = bodies.at(-1)!.messages[1]!;
    assert.equal(sent.reasoning_content, 'Two cities.');
    assert.deepEqual(sent.tool_calls!.map((call) => call.extra_content), [{ n: 0 }, undefined, undefined]);
    assert.deepEqual(sent.tool_calls!.map((call) => 'extra_content' in call), [true, false, false]);
  });

  it("the turn's reasoning is given once, with its last call, and every call's signature with that call", async () => {
    answer = () => ({
      sse: [
        { choices: [{ index: 0, delta: { role: 'assistant', reasoning_content: 'Both ' } }] },
        { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'a', type: 'function', function: { name: 'get_weather', arguments: '{}' }, extra_content: { s: 'a' } }] } }] },
        // Reasoning after a call's first piece still belongs to the turn.
        { choices: [{ index: 0, delta: { reasoning_content: 'cities.', tool_calls: [{ index: 1, id: 'b', type: 'function', function: { name: 'get_weather', arguments: '{}' }, extra_content: { s: 'b' } }] } }] },
        { choices: [{ index: 0, delta: {}, finish_reason: 'tool_calls' }] },
      ],
    });
    const out = await collect(openai({ baseURL: base, apiKey: 'k', model: 'm', retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [weatherTool] }));
    assert.deepEqual(out.calls.map((call) => call.providerData), [{ extra_content: { s: 'a' } }, { reasoning_content: 'Both cities.', extra_content: { s: 'b' } }]);
  });

  /** What OpenRouter gives with tool turn `turn` of Gemini 3, whole: the thought summary and the
   *  thought signature, an opaque blob that must come back as it went (bytes a JSON or base64
   *  mangling would change among them). */
  const openRouterDetails = (turn: number, city: string): Array<Record<string, unknown>> => [
    { type: 'reasoning.text', text: `The user wants two cities; first ${city}.`, id: null, format: 'google-gemini-v1', index: 0 },
    { type: 'reasoning.encrypted', data: `CiQBjz1rX+/${'Qm9yZWFs'.repeat(64)}\u00e9\u2028${turn}==`, id: `tool_get_weather_${turn}`, format: 'google-gemini-v1', index: 1 },
  ];
  /** OpenRouter with Gemini 3 behind it: like the upstream, it answers 400 when a tool-call turn
   *  comes back without its `reasoning_details` or with them changed. Streamed, the text item
   *  comes in two pieces at its index (with the plain `reasoning` beside them), the encrypted
   *  one whole with the call, as OpenRouter streams them. */
  function openRouter(body: WireBody): ReturnType<typeof answer> {
    for (const [position, message] of body.messages.entries()) {
      if (message.role !== 'assistant' || !message.tool_calls) continue;
      const turn = Number(message.tool_calls[0]!.id.replace('call_', ''));
      if (isDeepStrictEqual(message.reasoning_details, openRouterDetails(turn, ['Oslo', 'Lima'][turn]!))) continue;
      const raw = `Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly. Position ${position}.`;
      const message400 = 'Gemini models require OpenRouter reasoning details to be preserved in each request. Please refer to our docs: https://openrouter.ai/docs/guides/best-practices/reasoning-tokens#preserving-reasoning-blocks.';
      return { status: 400, json: { error: { message: message400, code: 400, metadata: { raw, provider_name: 'Google AI Studio' } } } };
    }
    const done = body.messages.filter((m) => m.role === 'tool').length;
    const city = ['Oslo', 'Lima'][done];
    const details = city ? openRouterDetails(done, city) : [{ type: 'reasoning.text', text: 'Both are known.', id: null, format: 'google-gemini-v1', index: 0 }];
    const call = city && { index: 0, id: `call_${done}`, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) } };
    const plain = (detail: Record<string, unknown>) => (detail.type === 'reasoning.text' ? (detail.text as string) : null);
    if (!body.stream) {
      const message = { role: 'assistant', content: call ? '' : 'Both 21C.', reasoning: plain(details[0]!), reasoning_details: details, ...(call && { tool_calls: [call] }) };
      return { status: 200, json: { id: 'gen-1', provider: 'Google AI Studio', choices: [{ index: 0, message, finish_reason: call ? 'tool_calls' : 'stop' }] } };
    }
    const delta = (d: Record<string, unknown>, finish: string | null = null) => ({ id: 'gen-1', provider: 'Google AI Studio', choices: [{ index: 0, delta: d, finish_reason: finish }] });
    const [text, ...rest] = details as [Record<string, unknown>, ...Array<Record<string, unknown>>];
    const words = (text.text as string).split(/(?<=;)/);
    return {
      sse: [
        ...words.map((piece, i) => {
          const { text: _whole, ...fields } = text;
          const detail = i === 0 ? { ...fields, text: piece } : { type: text.type, text: piece, format: text.format, index: text.index };
          return delta({ role: 'assistant', content: '', reasoning: piece, reasoning_details: [detail] });
        }),
        call ? delta({ content: null, reasoning_details: rest, tool_calls: [call] }) : delta({ content: 'Both 21C.' }),
        delta({}, call ? 'tool_calls' : 'stop'),
      ],
    };
  }

  it("OpenRouter: each tool-call turn's reasoning_details, streamed or whole, go back on its assistant message unchanged", async () => {
    const { createAgent } = await import('../src/node.js');
    for (const stream of [true, false]) {
      bodies.length = 0;
      answer = openRouter;
      const { weather, cities } = await recordingWeather();
      const model = openai({ baseURL: base, apiKey: 'k', model: 'google/gemini-3-pro-preview', stream, retry: { maxRetries: 0 } });
      const agent = await createAgent({ model, tools: [weather] });
      // The reasoning streamed beside the answer is no part of its text.
      assert.equal((await agent.run('Weather in Oslo, then in Lima?')).text, 'Both 21C.', `stream: ${stream}`);
      assert.deepEqual(cities, ['Oslo', 'Lima']);
      const last = bodies.at(-1)!.messages;
      assert.deepEqual(
        last.map((m) => m.reasoning_details),
        [undefined, openRouterDetails(0, 'Oslo'), undefined, openRouterDetails(1, 'Lima'), undefined],
        `stream: ${stream}`,
      );
      assert.deepEqual(last.map((m) => 'reasoning_details' in m), [false, true, false, true, false], 'no empty field on the other messages');
      const encrypted = (last[3]!.reasoning_details as Array<Record<string, unknown>>)[1]!;
      const sent = openRouterDetails(1, 'Lima')[1]!;
      for (const field of ['data', 'id', 'format'] as const) assert.equal(encrypted[field], sent[field], `${field} (stream: ${stream})`);
      assert.equal('reasoning_content' in last[1]!, false);
    }
  });

  it('OpenRouter: reasoning_details pieces streamed at one index merge into one item, signature and all; other pieces stay as they came', async () => {
    answer = () => ({
      sse: [
        // Anthropic through OpenRouter: a thinking block a few words a piece, then its signature alone.
        { choices: [{ index: 0, delta: { role: 'assistant', content: '', reasoning: 'Two ', reasoning_details: [{ type: 'reasoning.text', text: 'Two ', format: 'anthropic-claude-v1', index: 0 }] } }] },
        { choices: [{ index: 0, delta: { reasoning: 'cities.', reasoning_details: [{ type: 'reasoning.text', text: 'cities.', format: 'anthropic-claude-v1', index: 0 }] } }] },
        { choices: [{ index: 0, delta: { reasoning_details: [{ type: 'reasoning.text', signature: 'ErUBCkYIBRgCIkB+/0==', format: 'anthropic-claude-v1', index: 0 }] } }] },
        // A redacted block whole at the next index, and in the same delta a summary split in two.
        {
          choices: [
            {
              index: 0,
              delta: {
                reasoning_details: [
                  { type: 'reasoning.encrypted', data: 'EmwKAhgBEgy3+/==', id: 'rs_1', format: 'anthropic-claude-v1', index: 1 },
                  { type: 'reasoning.summary', summary: 'Look ', format: 'anthropic-claude-v1', index: 2 },
                ],
              },
            },
          ],
        },
        { choices: [{ index: 0, delta: { reasoning_details: [{ type: 'reasoning.summary', summary: 'both up.', index: 2 }] } }] },
        // Pieces without an index have nothing to be merged by: each is an item of its own.
        { choices: [{ index: 0, delta: { reasoning_details: [{ type: 'reasoning.text', text: 'a' }, { type: 'reasoning.text', text: 'b' }] } }] },
        { choices: [{ index: 0, delta: { tool_calls: [{ index: 0, id: 'a', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] } }] },
        { choices: [{ index: 0, delta: { tool_calls: [{ index: 1, id: 'b', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Lima"}' } }] }, finish_reason: 'tool_calls' }] },
      ],
    });
    const out = await collect(openai({ baseURL: base, apiKey: 'k', model: 'anthropic/claude-sonnet-4.5', retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [weatherTool] }));
    assert.equal(out.text, '', 'reasoning is not answer text');
    assert.deepEqual(out.calls.map((call) => call.providerData), [
      undefined,
      {
        reasoning_details: [
          { type: 'reasoning.text', text: 'Two cities.', signature: 'ErUBCkYIBRgCIkB+/0==', format: 'anthropic-claude-v1', index: 0 },
          { type: 'reasoning.encrypted', data: 'EmwKAhgBEgy3+/==', id: 'rs_1', format: 'anthropic-claude-v1', index: 1 },
          { type: 'reasoning.summary', summary: 'Look both up.', format: 'anthropic-claude-v1', index: 2 },
          { type: 'reasoning.text', text: 'a' },
          { type: 'reasoning.text', text: 'b' },
        ],
      },
    ]);
  });

  it('OpenRouter: only stored reasoning_details of its own shape are sent back, and a message without them gets no such field', async () => {
    answer = () => ({ status: 200, json: { choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }] } });
    const details = [{ type: 'reasoning.encrypted', data: 'Zm9v+/==', id: 'tool_get_weather_0', format: 'google-gemini-v1', index: 0 }];
    const turn = (id: string, providerData?: unknown): ChatMessage => ({ role: 'assistant', content: '', toolCalls: [{ id, name: 'get_weather', arguments: '{}', ...(providerData !== undefined && { providerData }) }] });
    const messages: ChatMessage[] = [
      ...hello,
      turn('kept', { reasoning_details: details }),
      turn('none'),
      turn('empty', { reasoning_details: [] }),
      // What another provider (or an edited state) left under that name: not OpenRouter's items.
      turn('foreign', { reasoning_details: [{ type: 'thinking', thinking: 'x', signature: 's' }] }),
      turn('partly', { reasoning_details: [...details, 'opaque'] }),
      turn('opaque', { reasoning_details: 'opaque' }),
    ];
    const fresh = openai({ baseURL: base, apiKey: 'k', model: 'google/gemini-3-pro-preview', stream: false, retry: { maxRetries: 0 } });
    await collect(fresh.stream({ messages, tools: [weatherTool] }));
    const sent = bodies.at(-1)!.messages;
    assert.deepEqual(sent[1]!.reasoning_details, details);
    assert.deepEqual(sent.map((m) => 'reasoning_details' in m), [false, true, false, false, false, false, false]);
  });

  it('calls a server numbers alike (every one index 0) each keep their own signature, and no call is made up', async () => {
    const { createAgent } = await import('../src/node.js');
    const call = (id: string, city: string) => ({ index: 0, id, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify({ city }) }, extra_content: { s: id } });
    answer = (body) => {
      if (body.messages.some((m) => m.role === 'tool')) return { sse: [{ choices: [{ index: 0, delta: { content: 'Both 21C.' }, finish_reason: 'stop' }] }] };
      return {
        sse: [
          { choices: [{ index: 0, delta: { role: 'assistant', reasoning_content: 'Two cities.', tool_calls: [call('a', 'Oslo')] } }] },
          { choices: [{ index: 0, delta: { tool_calls: [call('b', 'Lima')] }, finish_reason: 'tool_calls' }] },
        ],
      };
    };
    const { weather, cities } = await recordingWeather();
    const agent = await createAgent({ model: openai({ baseURL: base, apiKey: 'k', model: 'gemini-3-pro-preview', retry: { maxRetries: 0 } }), tools: [weather] });
    assert.equal((await agent.run('Weather in Oslo and Lima?')).text, 'Both 21C.');
    assert.deepEqual(cities, ['Oslo', 'Lima']);
    const sent = bodies[1]!.messages.find((m) => m.role === 'assistant' && m.tool_calls)!;
    assert.deepEqual(sent.tool_calls!.map((c) => [c.id, c.extra_content]), [['a', { s: 'a' }], ['b', { s: 'b' }]]);
    assert.equal(sent.reasoning_content, 'Two cities.');
  });

  it('a run paused for approval after such a turn resumes in a new agent, with a new provider object, and sends them back', async () => {
    const { createAgent, memoryStore, tool } = await import('../src/node.js');
    const cases = [
      { server: deepSeek, model: 'deepseek-v4-pro', sentBack: (m: WireMessage) => m.reasoning_content, expected: 'I should look up the weather in Oslo.' },
      { server: gemini, model: 'gemini-3-pro-preview', sentBack: (m: WireMessage) => m.tool_calls![0]!.extra_content, expected: signature },
      { server: openRouter, model: 'google/gemini-3-pro-preview', sentBack: (m: WireMessage) => m.reasoning_details, expected: openRouterDetails(0, 'Oslo') },
    ];
    for (const { server, model, sentBack, expected } of cases) {
      bodies.length = 0;
      answer = server;
      const store = memoryStore();
      const weather = tool({
        ...weatherTool,
        needsApproval: ({ city }: { city: string }) => city === 'Oslo',
        execute: () => '21C',
      });
      // Each "process" has its own agent and its own provider object; only the store is shared.
      const agent = async () => createAgent({ model: openai({ baseURL: base, apiKey: 'k', model, retry: { maxRetries: 0 } }), tools: [weather], store });
      const paused = await (await agent()).run('Weather in Oslo, then in Lima?');
      assert.equal(paused.status, 'paused', model);
      const resumed = await (await agent()).resume(paused.runId, { approvals: paused.pendingApprovals.map(({ id }) => ({ id, approved: true })) });
      assert.equal(resumed.status, 'completed', model);
      assert.equal(resumed.text, 'Both 21C.', model);
      const first = bodies[1]!.messages.find((m) => m.role === 'assistant' && m.tool_calls);
      assert.deepEqual(first && sentBack(first), expected, `${model}: the resumed request carries what the paused turn was sent with`);
    }
  });

  it('a server that gives more than 512 KiB of them with one answer fails that run as provider_protocol, and the agent serves on', async () => {
    const { createAgent, tool } = await import('../src/node.js');
    let extra: unknown = { google: { thought_signature: 'x'.repeat(600_000) } };
    answer = (body) => {
      if (body.messages.some((m) => m.role === 'tool') || extra === undefined) return { sse: [{ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }] };
      const call = { index: 0, id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' }, extra_content: extra };
      return { sse: [{ choices: [{ index: 0, delta: { tool_calls: [call] }, finish_reason: 'tool_calls' }] }] };
    };
    const agent = await createAgent({ model: openai({ baseURL: base, apiKey: 'k', model: 'gemini-3-pro-preview', retry: { maxRetries: 0 } }), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    await assert.rejects(agent.run('Weather in Oslo?'), failsAsProviderProtocol(/\d+ bytes of provider data to send back; at most 524288 are kept/));
    extra = { google: { thought_signature: 'x'.repeat(1000) } };
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok');
  });

  it("OpenRouter: a turn's reasoning_details count toward the same 512 KiB", async () => {
    const { createAgent, tool } = await import('../src/node.js');
    let size = 600_000;
    answer = (body) => {
      if (body.messages.some((m) => m.role === 'tool')) return { sse: [{ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }] };
      const call = { index: 0, id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } };
      const details = [{ type: 'reasoning.encrypted', data: 'x'.repeat(size), format: 'google-gemini-v1', index: 0 }];
      return { sse: [{ choices: [{ index: 0, delta: { reasoning_details: details, tool_calls: [call] }, finish_reason: 'tool_calls' }] }] };
    };
    const agent = await createAgent({ model: openai({ baseURL: base, apiKey: 'k', model: 'google/gemini-3-pro-preview', retry: { maxRetries: 0 } }), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    await assert.rejects(agent.run('Weather in Oslo?'), failsAsProviderProtocol(/\d+ bytes of provider data to send back; at most 524288 are kept/));
    size = 1000;
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok');
    const sent = bodies.at(-1)!.messages.find((m) => m.tool_calls)!.reasoning_details as Array<{ data: string }>;
    assert.equal(sent[0]!.data.length, 1000);
  });

  it('the 512 KiB is the core\'s own bound: a response whose calls keep that many bytes of JSON is kept, one byte more fails it', async () => {
    const { createAgent, tool } = await import('../src/node.js');
    const { MAX_PROVIDER_DATA_BYTES } = await import('../src/providers/provider-data.js');
    let data = '';
    // TEST DOUBLE: a scripted model whose one call carries `data` as its providerData.
    const scripted: ModelProvider = {
      id: 'scripted:provider-data',
      async *stream(request) {
        if (request.messages.at(-1)?.role === 'tool') {
          yield { type: 'text', delta: 'ok' };
        } else {
          yield { type: 'tool_call', index: 0, id: 'c', name: 'get_weather', argumentsDelta: '{"city":"Oslo"}', providerData: data };
        }
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: scripted, tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    // Three bytes of UTF-8 a character, and the two quotes: the bound exactly.
    data = '€'.repeat((MAX_PROVIDER_DATA_BYTES - 2) / 3);
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok');
    data += 'x';
    await assert.rejects(agent.run('Weather in Oslo?'), failsAsProviderProtocol(new RegExp(`gave its tool calls ${MAX_PROVIDER_DATA_BYTES + 1} bytes of provider data to send back; at most ${MAX_PROVIDER_DATA_BYTES} are kept`)));
  });

  it("the 8 MiB of reasoning streamed is the core's own bound on an answer's text", async () => {
    const { createAgent } = await import('../src/node.js');
    const { MAX_STREAMED_REASONING_BYTES } = await import('../src/providers/provider-data.js');
    // TEST DOUBLE: a scripted model that streams one byte of text more than the bound.
    const scripted: ModelProvider = {
      id: 'scripted:long-text',
      async *stream() {
        for (let sent = 0; sent <= MAX_STREAMED_REASONING_BYTES; sent += 1 << 20) yield { type: 'text', delta: 'x'.repeat(Math.min(1 << 20, MAX_STREAMED_REASONING_BYTES + 1 - sent)) };
        yield { type: 'finish', finishReason: 'stop' };
      },
    };
    const agent = await createAgent({ model: scripted });
    await assert.rejects(agent.run('Talk.'), failsAsProviderProtocol(new RegExp(`streamed more than ${MAX_STREAMED_REASONING_BYTES} bytes of text`)));
  });

  /** 64 MiB of reasoning (128 times the bound) a KiB an event, then a call: what a broken or
   *  hostile server could stream for as long as it liked, every event progress. */
  const LONG_EVENTS = 65_536;
  function longReasoning(delta: (n: number) => Record<string, unknown>): { long: Iterable<unknown> } {
    const call = { index: 0, id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } };
    return {
      long: (function* () {
        for (let n = 0; n < LONG_EVENTS; n++) yield { choices: [{ index: 0, delta: delta(n) }] };
        yield { choices: [{ index: 0, delta: { tool_calls: [call] }, finish_reason: 'tool_calls' }] };
      })(),
    };
  }
  const kib = (n: number) => `${n} `.padEnd(1024, 'x');

  it('reasoning streamed past 8 MiB (DeepSeek reasoning_content, OpenRouter reasoning_details) fails the run as provider_protocol then, long before the server would stop, and the agent serves on', async () => {
    const { createAgent, tool } = await import('../src/node.js');
    const cases = [
      { field: 'reasoning_content', delta: (n: number) => ({ ...(n === 0 && { role: 'assistant' }), reasoning_content: kib(n) }) },
      // OpenRouter: one item streamed a piece at a time at its index, the plain text beside it.
      { field: 'reasoning_details', delta: (n: number) => ({ reasoning: kib(n), reasoning_details: [{ type: 'reasoning.text', text: kib(n), format: 'anthropic-claude-v1', index: 0 }] }) },
    ];
    for (const { field, delta } of cases) {
      let long = true;
      answer = (body) => {
        if (long && !body.messages.some((m) => m.role === 'tool')) return longReasoning(delta);
        return { sse: [{ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }] };
      };
      const agent = await createAgent({ model: openai({ baseURL: base, apiKey: 'k', model: 'm', retry: { maxRetries: 0 } }), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
      const error = await rejection(agent.run('Weather in Oslo?'));
      // The client stopped reading at the bound; what the socket buffers held is the rest.
      const events = await written;
      assert.ok(events < LONG_EVENTS / 4, `${field}: the server wrote ${events} of its ${LONG_EVENTS} events`);
      assert.ok(error instanceof CrucibleError, String(error));
      assert.equal(error.code, 'provider_protocol', field);
      assert.match(error.message, /the model's response streamed more than 8388608 bytes of reasoning/, field);
      long = false;
      assert.equal((await agent.run('Weather in Oslo?')).text, 'ok', field);
    }
  });

  it('reasoning is counted as the core counts it, in bytes of UTF-8: what the core keeps goes through, a byte past the bound fails in the provider', async () => {
    const { createAgent, tool } = await import('../src/node.js');
    let reasoning = '';
    answer = (body) => {
      if (body.messages.at(-1)?.role === 'tool') return { sse: [{ choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] }] };
      const pieces = reasoning.match(/[^]{1,4096}/g)!.map((piece) => ({ choices: [{ index: 0, delta: { reasoning_content: piece } }] }));
      const call = { index: 0, id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } };
      return { sse: [...pieces, { choices: [{ index: 0, delta: { tool_calls: [call] }, finish_reason: 'tool_calls' }] }] };
    };
    const agent = await createAgent({ model: openai({ baseURL: base, apiKey: 'k', model: 'deepseek-v4-pro', retry: { maxRetries: 0 } }), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    // The core counts `{"reasoning_content":"…"}`: 24 bytes around the text's.
    reasoning = `${'€'.repeat(174_754)}xx`;
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok', 'the bound exactly, as the core counts it');
    reasoning += 'x'.repeat(25);
    await assert.rejects(agent.run('Weather in Oslo?'), failsAsProviderProtocol(/openai:deepseek-v4-pro: `reasoning_content` took the model's response past 524288 bytes/));
  });

  it('a final answer that reasoned past 512 KiB, with no call to send it back with, completes: only what nobody sends back is dropped', async () => {
    for (const delta of [(n: number) => ({ reasoning_content: kib(n) }), (n: number) => ({ reasoning_details: [{ type: 'reasoning.text', text: kib(n), index: 0 }] })]) {
      answer = () => ({
        long: (function* () {
          for (let n = 0; n < 1024; n++) yield { choices: [{ index: 0, delta: delta(n) }] };
          yield { choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] };
        })(),
      });
      const out = await collect(openai({ baseURL: base, apiKey: 'k', model: 'm', retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [weatherTool] }));
      assert.equal(out.text, 'ok', JSON.stringify(delta(0)).slice(0, 40));
      assert.equal(out.calls.length, 0);
    }
  });

  it('reasoning that is only progress (the plain `reasoning` text beside it) is not kept: any amount of it streams through', async () => {
    answer = () => ({
      long: (function* () {
        for (let n = 0; n < 1024; n++) yield { choices: [{ index: 0, delta: { reasoning: kib(n) } }] };
        yield { choices: [{ index: 0, delta: { content: 'ok' }, finish_reason: 'stop' }] };
      })(),
    });
    const out = await collect(openai({ baseURL: base, apiKey: 'k', model: 'm', retry: { maxRetries: 0 } }).stream({ messages: hello, tools: [weatherTool] }));
    assert.equal(out.text, 'ok');
    assert.equal(await written, 1026, 'every event read, [DONE] too');
  });
});

describe('anthropic request mapping', () => {
  it('moves system to the top level, merges tool results into one user message and sends tool_use blocks', async () => {
    server.enqueue({ text: 'ok' });
    const model = anthropic({ model: 'claude-test', baseURL: server.anthropicBaseURL, apiKey: 'sk-ant' });
    await collect(model.stream({ messages: [...toolConversation, { role: 'user', content: 'Thanks' }], tools: [weatherTool] }));
    const request = server.requests[0]!;
    assert.equal(request.path, '/v1/messages');
    assert.equal(request.headers['x-api-key'], 'sk-ant');
    assert.equal(request.headers['anthropic-version'], '2023-06-01');
    assert.deepEqual(request.body, {
      model: 'claude-test',
      max_tokens: 4096,
      system: 'Be brief.',
      messages: [
        { role: 'user', content: 'Weather in Paris and Rome?' },
        {
          role: 'assistant',
          content: [
            { type: 'tool_use', id: 'call_1', name: 'get_weather', input: { city: 'Paris' } },
            { type: 'tool_use', id: 'call_2', name: 'get_weather', input: { city: 'Rome' } },
          ],
        },
        {
          role: 'user',
          content: [
            { type: 'tool_result', tool_use_id: 'call_1', content: '18C' },
            { type: 'tool_result', tool_use_id: 'call_2', content: '24C' },
          ],
        },
        { role: 'user', content: 'Thanks' },
      ],
      tools: [{ name: 'get_weather', description: 'Current weather for a city', input_schema: weatherTool.inputSchema }],
      stream: true,
    });
  });

  it('leaves out an empty assistant turn and whitespace-only text next to tool calls (the API refuses both)', async () => {
    server.enqueue({ text: 'ok' });
    const model = anthropic({ model: 'c', baseURL: server.anthropicBaseURL });
    await collect(
      model.stream({
        messages: [
          { role: 'user', content: 'First?' },
          { role: 'assistant', content: '' },
          { role: 'user', content: 'Second?' },
          { role: 'assistant', content: ' \n', toolCalls: [{ id: 't1', name: 'get_weather', arguments: '{"city":"Oslo"}' }] },
          { role: 'tool', toolCallId: 't1', name: 'get_weather', content: '9C' },
        ],
        tools: [weatherTool],
      }),
    );
    assert.deepEqual((server.requests[0]!.body as { messages: unknown[] }).messages, [
      { role: 'user', content: 'First?' },
      { role: 'user', content: 'Second?' },
      { role: 'assistant', content: [{ type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'Oslo' } }] },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: '9C' }] },
    ]);
  });

  it('gives tool calls begun on another provider ids the API takes: its characters only, unique in the request, each result by its call', async () => {
    server.enqueue({ text: 'ok' });
    const call = (id: string, city: string) => ({ role: 'assistant' as const, content: '', toolCalls: [{ id, name: 'get_weather', arguments: JSON.stringify({ city }) }] });
    const result = (id: string, content: string) => ({ role: 'tool' as const, toolCallId: id, name: 'get_weather', content });
    await collect(
      anthropic({ model: 'c', baseURL: server.anthropicBaseURL }).stream({
        messages: [
          // Kimi-K2's ids, then a server that numbers the calls of each answer from 0.
          { role: 'user', content: 'Oslo?' },
          call('functions.get_weather:0', 'Oslo'),
          result('functions.get_weather:0', '9C'),
          { role: 'user', content: 'Lima?' },
          call('call_0', 'Lima'),
          result('call_0', '21C'),
          { role: 'user', content: 'Rome?' },
          call('call_0', 'Rome'),
          result('call_0', '18C'),
          { role: 'user', content: 'And Anthropic own?' },
          call('toolu_01A', 'Paris'),
          result('toolu_01A', '15C'),
        ],
        tools: [weatherTool],
      }),
    );
    const messages = (server.requests[0]!.body as { messages: Array<{ content: unknown }> }).messages;
    const ids = messages.flatMap((m) => (Array.isArray(m.content) ? (m.content as Array<{ id?: string; tool_use_id?: string }>) : [])).map((b) => b.id ?? b.tool_use_id);
    assert.deepEqual(ids, ['functions_get_weather_0', 'functions_get_weather_0', 'call_0', 'call_0', 'call_0_2', 'call_0_2', 'toolu_01A', 'toolu_01A']);
  });

  it('marks the result of a failed call is_error, as the API documents', async () => {
    server.enqueue({ text: 'ok' });
    const failed = '{"error":{"code":"execution_failed","message":"down"}}';
    await collect(
      anthropic({ model: 'c', baseURL: server.anthropicBaseURL }).stream({
        messages: [
          { role: 'user', content: 'Weather?' },
          { role: 'assistant', content: '', toolCalls: [{ id: 't1', name: 'get_weather', arguments: '{"city":"Oslo"}' }] },
          { role: 'tool', toolCallId: 't1', name: 'get_weather', content: failed, isError: true },
        ],
        tools: [weatherTool],
      }),
    );
    const messages = (server.requests[0]!.body as { messages: unknown[] }).messages;
    assert.deepEqual(messages.at(-1), { role: 'user', content: [{ type: 'tool_result', tool_use_id: 't1', content: failed, is_error: true }] });
  });

  it('retries an overloaded error event that arrives before any output', async () => {
    server.enqueue({ streamError: { type: 'overloaded_error', message: 'Overloaded' } }, { text: 'recovered' });
    const model = anthropic({ model: 'c', baseURL: server.anthropicBaseURL, retry: { initialDelayMs: 5 } });
    const result = await collect(model.stream({ messages: hello, tools: [] }));
    assert.equal(result.text, 'recovered');
    assert.equal(server.requests.length, 2);
  });

  it('numbers tool calls from 0 even when a text block comes first', async () => {
    server.enqueue({ text: 'Let me check.', toolCalls: [{ name: 'get_weather', arguments: { city: 'Lima' } }] });
    const result = await collect(anthropic({ model: 'c', baseURL: server.anthropicBaseURL }).stream({ messages: hello, tools: [weatherTool] }));
    const indices = result.chunks.filter((c) => c.type === 'tool_call').map((c) => (c as { index: number }).index);
    assert.ok(indices.length > 1 && indices.every((i) => i === 0), `indices ${indices.join(',')}`);
  });
});

describe('JSON answers (responseFormat)', () => {
  it('asks OpenAI-compatible servers for a JSON object (json_schema) and Ollama for format json', async () => {
    server.reset();
    server.enqueue({ text: '{}' }, { text: '{}' }, { text: '{}' });
    const request = { messages: [{ role: 'user' as const, content: 'verdict?' }], tools: [], responseFormat: 'json' as const };
    await collect(openai({ model: 'm', baseURL: server.openaiBaseURL }).stream(request));
    await collect(ollama({ model: 'm', baseURL: server.ollamaBaseURL }).stream(request));
    await collect(openai({ model: 'm', baseURL: server.openaiBaseURL }).stream({ ...request, responseFormat: undefined }));
    assert.deepEqual((server.requests[0]!.body as Record<string, unknown>).response_format, { type: 'json_schema', json_schema: { name: 'response', schema: { type: 'object' } } });
    assert.equal((server.requests[1]!.body as Record<string, unknown>).format, 'json');
    assert.equal('response_format' in (server.requests[2]!.body as Record<string, unknown>), false);
  });

  it('sends a JSON Schema as OpenAI json_schema and as Ollama format; Anthropic carries none', async () => {
    server.reset();
    server.enqueue({ text: '{"ok":true}' }, { text: '{"ok":true}' }, { text: '{"ok":true}' });
    const schema = { type: 'object', properties: { ok: { type: 'boolean' } }, required: ['ok'] };
    const request: ModelRequest = { messages: [{ role: 'user', content: 'verdict?' }], tools: [], responseFormat: { jsonSchema: { name: 'verdict', schema } } };
    const answers = [
      await collect(openai({ model: 'm', baseURL: server.openaiBaseURL }).stream(request)),
      await collect(ollama({ model: 'm', baseURL: server.ollamaBaseURL }).stream(request)),
      await collect(anthropic({ model: 'c', baseURL: server.anthropicBaseURL }).stream(request)),
    ];
    const bodies = server.requests.map((r) => r.body as Record<string, unknown>);
    assert.deepEqual(bodies[0]!.response_format, { type: 'json_schema', json_schema: { name: 'verdict', schema } });
    assert.deepEqual(bodies[1]!.format, schema);
    assert.equal('response_format' in bodies[2]! || 'format' in bodies[2]!, false);
    for (const answer of answers) assert.equal(answer.text, '{"ok":true}');
  });
});

describe('tool choice (toolChoice)', () => {
  const otherTool: ToolDefinition = { name: 'forge_tool', description: 'forge', inputSchema: { type: 'object', properties: {} } };
  const tools = [weatherTool, otherTool];
  const ask = (toolChoice: ModelRequest['toolChoice'], withTools = tools): ModelRequest => ({ messages: hello, tools: withTools, toolChoice });
  const bodies = () => server.requests.map((r) => r.body as Record<string, unknown>);

  it('sends OpenAI tool_choice strings and the named-function object, and none without tools', async () => {
    server.reset();
    server.enqueue({ text: 'a' }, { text: 'b' }, { text: 'c' }, { text: 'd' });
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL });
    for (const request of [ask('required'), ask({ tool: 'forge_tool' }), ask(undefined), ask('required', [])]) await collect(model.stream(request));
    const [required, named, unset, toolless] = bodies();
    assert.equal(required!.tool_choice, 'required');
    assert.deepEqual(named!.tool_choice, { type: 'function', function: { name: 'forge_tool' } });
    assert.equal('tool_choice' in unset!, false);
    // A choice without tools is meaningless and some servers reject it.
    assert.equal('tool_choice' in toolless!, false);
  });

  it('maps to Anthropic tool_choice: required is any, a name is a tool block', async () => {
    server.reset();
    server.enqueue({ text: 'a' }, { text: 'b' }, { text: 'c' });
    const model = anthropic({ model: 'c', baseURL: server.anthropicBaseURL });
    for (const request of [ask('required'), ask({ tool: 'get_weather' }), ask('none')]) await collect(model.stream(request));
    assert.deepEqual(bodies().map((b) => b.tool_choice), [{ type: 'any' }, { type: 'tool', name: 'get_weather' }, { type: 'none' }]);
  });

  it('narrows the tools Ollama gets, since its chat API has no tool choice', async () => {
    server.reset();
    server.enqueue({ text: 'a' }, { text: 'b' });
    const model = ollama({ model: 'm', baseURL: server.ollamaBaseURL });
    for (const request of [ask({ tool: 'forge_tool' }), ask('none')]) await collect(model.stream(request));
    const [named, none] = bodies();
    assert.deepEqual((named!.tools as { function: { name: string } }[]).map((t) => t.function.name), ['forge_tool']);
    assert.equal('tools' in none!, false);
    assert.equal('tool_choice' in named!, false);
  });
});

describe('ollama request mapping', () => {
  it('sends object arguments, tool_name on tool results and model options', async () => {
    server.enqueue({ text: 'ok' });
    const model = ollama({ model: 'qwen3:4b', baseURL: server.ollamaBaseURL });
    await collect(model.stream({ messages: toolConversation, tools: [weatherTool], temperature: 0, maxTokens: 32 }));
    const request = server.requests[0]!;
    assert.equal(request.path, '/api/chat');
    assert.deepEqual(request.body, {
      model: 'qwen3:4b',
      messages: [
        { role: 'system', content: 'Be brief.' },
        { role: 'user', content: 'Weather in Paris and Rome?' },
        {
          role: 'assistant',
          content: '',
          tool_calls: [
            { function: { name: 'get_weather', arguments: { city: 'Paris' } } },
            { function: { name: 'get_weather', arguments: { city: 'Rome' } } },
          ],
        },
        { role: 'tool', content: '18C', tool_name: 'get_weather' },
        { role: 'tool', content: '24C', tool_name: 'get_weather' },
      ],
      stream: true,
      tools: [
        {
          type: 'function',
          function: { name: 'get_weather', description: 'Current weather for a city', parameters: weatherTool.inputSchema },
        },
      ],
      options: { temperature: 0, num_predict: 32 },
    });
  });

  it("sends the provider's model options and keep_alive with every request; the request's own settings win", async () => {
    server.enqueue({ text: 'ok' }, { text: 'ok' });
    const model = ollama({ model: 'qwen3:4b', baseURL: server.ollamaBaseURL, options: { num_ctx: 8192, temperature: 0.7, seed: 7 }, keepAlive: '10m' });
    await collect(model.stream({ messages: hello, tools: [], temperature: 0, maxTokens: 32 }));
    await collect(model.stream({ messages: hello, tools: [] }));
    const [first, second] = server.requests.map((r) => r.body as Record<string, unknown>);
    assert.deepEqual(first!.options, { num_ctx: 8192, temperature: 0, seed: 7, num_predict: 32 });
    assert.equal(first!.keep_alive, '10m');
    assert.deepEqual(second!.options, { num_ctx: 8192, temperature: 0.7, seed: 7 });
  });

  it('sends `think` as given as the top-level think of every request; without it, none (the model default); extraBody.think wins', async () => {
    const sent = async (options: Partial<OllamaOptions>): Promise<Record<string, unknown>> => {
      server.reset();
      server.enqueue({ text: 'ok' }, { text: 'ok' });
      const model = ollama({ model: 'gpt-oss:20b', baseURL: server.ollamaBaseURL, ...options });
      await collect(model.stream({ messages: hello, tools: [] }));
      await collect(model.stream({ messages: toolConversation, tools: [weatherTool] }));
      const [first, second] = server.requests.map((r) => r.body);
      assert.deepEqual(second!.think, first!.think, 'every request alike');
      return first!;
    };
    for (const think of [true, false, 'low', 'medium', 'high'] as const) {
      assert.equal((await sent({ think })).think, think);
    }
    for (const absent of [{}, { think: undefined }, { think: null as never }]) {
      assert.equal('think' in (await sent(absent)), false, JSON.stringify(absent));
    }
    assert.equal((await sent({ think: 'high', extraBody: { think: 'max' } })).think, 'max');
    assert.equal((await sent({ extraBody: { think: false } })).think, false);
  });
});

describe('ollama(): thinking models (think, message.thinking)', () => {
  interface WireMessage {
    role: string;
    content?: string;
    thinking?: unknown;
    tool_calls?: unknown[];
  }
  interface WireBody {
    stream: boolean;
    think?: unknown;
    messages: WireMessage[];
  }
  let raw: import('node:http').Server;
  let base = '';
  const bodies: WireBody[] = [];
  /** The answer to a request: its message lines, the last one `done`, written as NDJSON when
   *  streamed (at once, or with `long` one at a time for as long as the client reads them) and
   *  folded into one body when not, as Ollama folds them. */
  let answer: (body: WireBody) => { lines: Array<Record<string, unknown>> } | { long: Iterable<Record<string, unknown>> };
  /** How many lines the last `long` answer wrote before it ended or the client went away. */
  let written = Promise.resolve(0);
  const line = (message: Record<string, unknown>, done = false) => ({
    model: 'qwen3:4b',
    created_at: '2026-11-24T00:00:00Z',
    message: { role: 'assistant', content: '', ...message },
    done,
    ...(done && { done_reason: 'stop', prompt_eval_count: 12, eval_count: 34 }),
  });
  before(async () => {
    const started = await startJsonServer<WireBody>((body, res) => {
      bodies.push(body);
      const reply = answer(body);
      if ('long' in reply) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        written = writeEvents(res, (function* () {
          for (const value of reply.long) yield `${JSON.stringify(value)}\n`;
        })());
      } else if (body.stream !== false) {
        res.writeHead(200, { 'content-type': 'application/x-ndjson' });
        res.end(reply.lines.map((value) => `${JSON.stringify(value)}\n`).join(''));
      } else {
        // Not streamed, Ollama answers the whole message in one object.
        const messages = reply.lines.map((value) => value.message as Record<string, unknown>);
        const joined = (field: string) => messages.map((m) => (typeof m[field] === 'string' ? m[field] : '')).join('');
        const calls = messages.flatMap((m) => (Array.isArray(m.tool_calls) ? m.tool_calls : []));
        const thinking = joined('thinking');
        const message = { content: joined('content'), ...(thinking && { thinking }), ...(calls.length > 0 && { tool_calls: calls }) };
        res.writeHead(200, { 'content-type': 'application/json' });
        res.end(JSON.stringify(line(message, true)));
      }
    });
    raw = started.server;
    base = `${started.origin}`;
  });
  after(() => raw.close());
  beforeEach(() => {
    bodies.length = 0;
  });

  const call = (city: string) => ({ function: { name: 'get_weather', arguments: { city } } });
  const model = (options: Partial<OllamaOptions> = {}) => ollama({ baseURL: base, model: 'qwen3:4b', think: true, retry: { maxRetries: 0 }, ...options });

  it('thinking, streamed a piece a line or whole, and in the same line as content, is never text', async () => {
    answer = () => ({
      lines: [
        line({ thinking: 'The user ' }),
        line({ thinking: 'says hello.' }),
        // A server may send the last of the thinking and the first of the answer in one line.
        line({ thinking: ' Greet back.', content: 'Hel' }),
        line({ content: 'lo!' }),
        line({}, true),
      ],
    });
    for (const stream of [true, false]) {
      const out = await collect(model({ stream }).stream({ messages: hello, tools: [] }));
      assert.equal(out.text, 'Hello!', `stream: ${stream}`);
      assert.deepEqual(out.chunks.filter((c) => c.type === 'text').map((c) => c.delta), stream ? ['Hel', 'lo!'] : ['Hello!']);
      // A final answer's thinking has no call to go back with: nothing but its text and finish.
      assert.deepEqual(out.chunks.map((c) => c.type), [...(stream ? ['text', 'text'] : ['text']), 'finish'], `stream: ${stream}`);
      assert.deepEqual(out.finish?.usage, { inputTokens: 12, outputTokens: 34 });
      assert.equal(bodies.at(-1)!.think, true);
    }
  });

  /** A thinking model looking up two cities one after the other, thinking before each call. */
  function lookups(body: WireBody): { lines: Array<Record<string, unknown>> } {
    const done = body.messages.filter((m) => m.role === 'tool').length;
    const city = ['Oslo', 'Lima'][done];
    if (!city) return { lines: [line({ thinking: 'Both are known.' }), line({ content: 'Both 21C.' }), line({}, true)] };
    return { lines: [line({ thinking: 'I should look up ' }), line({ thinking: `the weather in ${city}.` }), line({ tool_calls: [call(city)] }), line({}, true)] };
  }

  it("an agent through tool turns with thinking on: each tool-call turn's thinking, streamed or whole, goes back on its assistant message, and none is text", async () => {
    const { createAgent } = await import('../src/node.js');
    for (const stream of [true, false]) {
      bodies.length = 0;
      answer = lookups;
      const { weather, cities } = await recordingWeather();
      const agent = await createAgent({ model: model({ stream }), tools: [weather] });
      const events: string[] = [];
      for await (const event of agent.stream('Weather in Oslo, then in Lima?')) {
        if (event.type === 'text.delta') events.push(event.delta);
      }
      assert.equal(events.join(''), 'Both 21C.', `stream: ${stream}: the thinking is no part of the text`);
      assert.deepEqual(cities, ['Oslo', 'Lima']);
      assert.deepEqual(bodies.map((b) => b.think), [true, true, true]);
      const last = bodies.at(-1)!.messages;
      assert.deepEqual(
        last.map((m) => m.thinking),
        [undefined, 'I should look up the weather in Oslo.', undefined, 'I should look up the weather in Lima.', undefined],
        `stream: ${stream}`,
      );
      assert.deepEqual(last.map((m) => 'thinking' in m), [false, true, false, true, false], 'no empty field on the other messages');
      assert.deepEqual(last[1]!.tool_calls, [call('Oslo')]);
    }
  });

  it("the turn's thinking is given once, whole, with its last call, thinking after a call included; another provider object sends back what the messages hold, and nothing else", async () => {
    answer = () => ({ lines: [line({ thinking: 'Two ' }), line({ tool_calls: [call('Oslo')] }), line({ thinking: 'cities.', tool_calls: [call('Lima')] }), line({}, true)] });
    const out = await collect(model().stream({ messages: hello, tools: [weatherTool] }));
    assert.equal(out.text, '');
    assert.deepEqual(out.calls.map((c) => [c.name, c.providerData]), [['get_weather', undefined], ['get_weather', { thinking: 'Two cities.' }]]);

    answer = () => ({ lines: [line({ content: 'ok' }), line({}, true)] });
    const turn = (id: string, providerData?: unknown): ChatMessage => ({ role: 'assistant', content: '', toolCalls: [{ id, name: 'get_weather', arguments: '{}', ...(providerData !== undefined && { providerData }) }] });
    const messages: ChatMessage[] = [
      ...hello,
      turn('kept', { thinking: 'Look it up.' }),
      turn('none'),
      // What another provider (or an edited state) left: not Ollama's to send.
      turn('opaque', 'opaque'),
      turn('number', { thinking: 5 }),
      turn('other', { reasoning_content: 'DeepSeek\u2019s' }),
    ];
    await collect(ollama({ baseURL: base, model: 'qwen3:4b', retry: { maxRetries: 0 } }).stream({ messages, tools: [weatherTool] }));
    const sent = bodies.at(-1)!.messages;
    assert.deepEqual(sent.map((m) => m.thinking), [undefined, 'Look it up.', undefined, undefined, undefined, undefined]);
    assert.deepEqual(sent.map((m) => 'thinking' in m), [false, true, false, false, false, false]);
    assert.equal('think' in bodies.at(-1)!, false, 'sent back without the option too');
  });

  it("a tool-call turn's thinking past 512 KiB fails the run as provider_protocol, and the agent serves on; a final answer's is only dropped", async () => {
    const { createAgent, tool } = await import('../src/node.js');
    const kib = (n: number) => `${n} `.padEnd(1024, 'x');
    let size = 600;
    answer = (body) => {
      const thinking = Array.from({ length: size }, (_, n) => line({ thinking: kib(n) }));
      if (body.messages.at(-1)?.role === 'tool') return { lines: [line({ content: 'ok' }), line({}, true)] };
      return { lines: [...thinking, line({ tool_calls: [call('Oslo')] }), line({}, true)] };
    };
    const agent = await createAgent({ model: model(), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    await assert.rejects(agent.run('Weather in Oslo?'), failsAsProviderProtocol(/ollama:qwen3:4b: `message.thinking` took the model's response past 524288 bytes/));
    size = 4;
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok');
    assert.equal((bodies.at(-1)!.messages.find((m) => m.tool_calls)!.thinking as string).length, 4 * 1024);

    answer = () => ({ lines: [...Array.from({ length: 600 }, (_, n) => line({ thinking: kib(n) })), line({ content: 'ok' }), line({}, true)] });
    const out = await collect(model().stream({ messages: hello, tools: [weatherTool] }));
    assert.equal(out.text, 'ok');
    assert.equal(out.calls.length, 0);
  });

  it('thinking streamed past 8 MiB fails the run as provider_protocol then, long before the server would stop, and the agent serves on', async () => {
    const { createAgent, tool } = await import('../src/node.js');
    // 64 MiB of thinking a KiB a line, then a call: what a broken or hostile server could
    // stream for as long as it liked, every line progress.
    const LONG_LINES = 65_536;
    let long = true;
    answer = (body) => {
      if (!long || body.messages.at(-1)?.role === 'tool') return { lines: [line({ content: 'ok' }), line({}, true)] };
      return {
        long: (function* () {
          for (let n = 0; n < LONG_LINES; n++) yield line({ thinking: `${n} `.padEnd(1024, 'x') });
          yield line({ tool_calls: [call('Oslo')] });
          yield line({}, true);
        })(),
      };
    };
    const agent = await createAgent({ model: model(), tools: [tool({ ...weatherTool, execute: () => '21C' })] });
    const error = await rejection(agent.run('Weather in Oslo?'));
    // The client stopped reading at the bound; what the socket buffers held is the rest.
    const lines = await written;
    assert.ok(lines < LONG_LINES / 4, `the server wrote ${lines} of its ${LONG_LINES} lines`);
    assert.ok(error instanceof CrucibleError, String(error));
    assert.equal(error.code, 'provider_protocol');
    assert.match(error.message, /the model's response streamed more than 8388608 bytes of reasoning/);
    long = false;
    assert.equal((await agent.run('Weather in Oslo?')).text, 'ok');
  });
});

// ---------------------------------------------------------------------------------------------
// Retry-After

describe('an exhausted quota', () => {
  it('is not retried: OpenAI answers it with 429 too, and waiting cannot help', async () => {
    const body = JSON.stringify({ error: { message: 'You exceeded your current quota.', type: 'insufficient_quota', code: 'insufficient_quota' } });
    server.enqueue({ status: 429, body }, { text: 'never' });
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1 } });
    const error = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError && error.status === 429 && !error.retryable, `got ${String(error)}`);
    assert.equal(server.requests.length, 1);
  });
});

describe('HTTP errors say what the server said, and where', () => {
  it("quotes the error body's message, whole, rather than 200 characters of its JSON", async () => {
    const message = `This model's maximum context length is 8192 tokens. However, you requested 9001 tokens (8001 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.`;
    for (const body of [
      JSON.stringify({ object: 'error', type: 'BadRequestError', param: null, code: 400, error: { message, type: 'invalid_request_error' } }),
      JSON.stringify({ detail: message }),
      JSON.stringify([{ error: { code: 400, message, status: 'INVALID_ARGUMENT' } }]),
    ]) {
      server.reset();
      server.enqueue({ status: 400, body });
      const error = await rejection(collect(openai({ model: 'm', baseURL: server.openaiBaseURL }).stream({ messages: hello, tools: [] })));
      assert.ok(error instanceof ProviderError && error.status === 400, `got ${String(error)}`);
      assert.ok(error.message.endsWith(`HTTP 400: ${message}`), error.message);
      assert.equal(error.body, body, 'the body is kept whole');
    }
  });

  it('a 404 names the URL it asked: a base URL with a path too many or too few', async () => {
    server.enqueue({ status: 404, body: JSON.stringify({ error: { message: 'Not Found' } }) });
    const model = openai({ model: 'm', baseURL: `${server.openaiBaseURL}/v1` });
    const error = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError && error.status === 404, `got ${String(error)}`);
    assert.match(error.message, /HTTP 404 at http:\/\/[^ ]+\/v1\/v1\/chat\/completions: Not Found$/);
  });

  it("anthropic() takes a baseURL ending in /v1, as the Vercel AI SDK writes it: the request goes to /v1/messages, not /v1/v1/messages", async () => {
    server.enqueue({ text: 'ok' });
    const answer = await collect(anthropic({ model: 'claude-test', baseURL: `${server.anthropicBaseURL}/v1/`, apiKey: 'k' }).stream({ messages: hello, tools: [] }));
    assert.equal(answer.text, 'ok');
    assert.equal(server.requests[0]!.path, '/v1/messages');
  });

  it('ollama() takes the OpenAI-compatible endpoint\'s base URL (ending in /v1) as the server\'s: the request goes to /api/chat', async () => {
    server.enqueue({ text: 'ok' });
    const answer = await collect(ollama({ model: 'qwen3', baseURL: `${server.ollamaBaseURL}/v1/` }).stream({ messages: hello, tools: [] }));
    assert.equal(answer.text, 'ok');
    assert.equal(server.requests[0]!.path, '/api/chat');
  });
});

describe("a baseURL with a query (Azure OpenAI's classic `…/deployments/<name>?api-version=…`)", () => {
  // A recording proxy before the mock server, which routes by the path alone: the proxy sees
  // the request line as sent, query and all, and passes the mock's answer back unchanged.
  let proxy: import('node:http').Server;
  let origin = '';
  const asked: string[] = [];
  before(async () => {
    const { createServer } = await import('node:http');
    proxy = createServer(async (req, res) => {
      asked.push(req.url ?? '');
      let body = '';
      for await (const piece of req) body += piece;
      const answer = await fetch(`${server.url}${req.url ?? '/'}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' });
      res.end(Buffer.from(await answer.arrayBuffer()));
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    origin = `http://127.0.0.1:${(proxy.address() as import('node:net').AddressInfo).port}`;
  });
  after(() => proxy.close());
  beforeEach(() => {
    asked.length = 0;
  });
  const deployment = '/openai/deployments/gpt4o';
  const query = '?api-version=2024-10-21';

  for (const [name, factory, endpoint] of [
    ['openai', openai, '/chat/completions'],
    ['anthropic', anthropic, '/v1/messages'],
    ['ollama', ollama, '/api/chat'],
  ] as const) {
    it(`${name}(): the endpoint's path goes after the base URL's path and the query after both, streamed or not`, async () => {
      for (const stream of [true, false]) {
        server.enqueue({ text: 'ok' });
        // A slash before the query, and a fragment (never sent), change nothing.
        const baseURL = `${origin}${deployment}${stream ? '' : '/'}${query}${stream ? '' : '#section'}`;
        const answer = await collect(factory({ model: 'gpt4o', baseURL, apiKey: 'k', stream }).stream({ messages: hello, tools: [] }));
        assert.equal(answer.text, 'ok');
      }
      assert.deepEqual(asked, [`${deployment}${endpoint}${query}`, `${deployment}${endpoint}${query}`]);
    });
  }

  it('anthropic(): a baseURL ending in /v1 before its query still reaches /v1/messages', async () => {
    server.enqueue({ text: 'ok' });
    await collect(anthropic({ model: 'claude-test', baseURL: `${origin}/v1${query}`, apiKey: 'k' }).stream({ messages: hello, tools: [] }));
    assert.deepEqual(asked, [`/v1/messages${query}`]);
  });

  it('a 404 names the path it asked, the endpoint included, and leaves the query out', async () => {
    server.enqueue({ status: 404, body: JSON.stringify({ error: { message: 'Resource not found' } }) });
    const model = openai({ model: 'gpt4o', baseURL: `${origin}${deployment}${query}`, apiKey: 'k' });
    const error = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError && error.status === 404, `got ${String(error)}`);
    assert.equal(error.message, `openai:gpt4o: HTTP 404 at ${origin}${deployment}/chat/completions: Resource not found`);
  });
});

describe('Retry-After', () => {
  it('waits the number of seconds the server asks for', async () => {
    server.enqueue({ status: 429, retryAfter: 1 }, { text: 'ok' });
    const started = Date.now();
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1 } });
    await collect(model.stream({ messages: hello, tools: [] }));
    const elapsed = Date.now() - started;
    assert.ok(elapsed >= 950, `retried after ${elapsed} ms`);
    assert.equal(server.requests.length, 2);
  });

  it('is waited out past the exponential backoff when it fits within maxDelayMs', async () => {
    server.enqueue({ status: 503, retryAfter: 1 }, { text: 'ok' });
    const started = Date.now();
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1, maxDelayMs: 1000 } });
    assert.equal((await collect(model.stream({ messages: hello, tools: [] }))).text, 'ok');
    assert.ok(Date.now() - started >= 950);
  });

  it('longer than maxDelayMs is not cut short: the error comes at once and says when to try again', async () => {
    server.enqueue({ status: 429, retryAfter: 30 }, { text: 'ok' });
    const started = Date.now();
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1, maxDelayMs: 50 } });
    const error = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError && error.status === 429 && error.retryable, `got ${String(error)}`);
    assert.equal(error.retryAfterMs, 30_000);
    assert.match(error.message, /retry after 30 s/);
    assert.ok(Date.now() - started < 1000);
    assert.equal(server.requests.length, 1, 'a retry before the server allows one would be refused too');
  });

  it("retry-after-ms is read before Retry-After, and x-should-retry overrides the status: the official SDKs' signals", async () => {
    server.enqueue({ status: 429, retryAfter: 30, errorHeaders: { 'retry-after-ms': '150' } }, { text: 'ok' });
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1, maxDelayMs: 1000 } });
    const started = Date.now();
    assert.equal((await collect(model.stream({ messages: hello, tools: [] }))).text, 'ok', 'the 30 s Retry-After would have ended the call');
    assert.ok(Date.now() - started >= 140);
    server.reset();
    server.enqueue({ status: 503, errorHeaders: { 'x-should-retry': 'false' } }, { text: 'never' });
    const refused = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(refused instanceof ProviderError && refused.status === 503 && !refused.retryable, `got ${String(refused)}`);
    assert.equal(server.requests.length, 1);
    server.reset();
    server.enqueue({ status: 400, errorHeaders: { 'x-should-retry': 'true' } }, { text: 'ok' });
    assert.equal((await collect(model.stream({ messages: hello, tools: [] }))).text, 'ok');
  });

  it('408 and 409 are retried, as the official SDKs do', async () => {
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { initialDelayMs: 1 } });
    for (const status of [408, 409]) {
      server.reset();
      server.enqueue({ status }, { text: 'ok' });
      assert.equal((await collect(model.stream({ messages: hello, tools: [] }))).text, 'ok', `HTTP ${status}`);
      assert.equal(server.requests.length, 2);
    }
  });

  it('parses delta-seconds and HTTP-dates', () => {
    const now = Date.parse('2025-01-01T00:00:00Z');
    assert.equal(parseRetryAfter('3', now), 3000);
    assert.equal(parseRetryAfter('Wed, 01 Jan 2025 00:00:02 GMT', now), 2000);
    assert.equal(parseRetryAfter('Tue, 31 Dec 2024 23:59:00 GMT', now), 0);
    assert.equal(parseRetryAfter('soon', now), undefined);
    assert.equal(parseRetryAfter(null, now), undefined);
  });
});

// ---------------------------------------------------------------------------------------------
// The test double itself

describe('mock LLM server', () => {
  it('answers CORS preflights so browser pages on another origin can call it', async () => {
    const response = await fetch(`${server.openaiBaseURL}/chat/completions`, {
      method: 'OPTIONS',
      headers: { origin: 'http://localhost:5173', 'access-control-request-method': 'POST', 'access-control-request-headers': 'authorization,content-type' },
    });
    assert.equal(response.status, 204);
    assert.equal(response.headers.get('access-control-allow-origin'), '*');
    assert.equal(response.headers.get('access-control-allow-headers'), 'authorization,content-type');
    assert.equal(server.requests.length, 0);
  });

  it('runs a tool round trip with echoToolResponder', async () => {
    server.setResponder(echoToolResponder());
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL });
    const first = await collect(model.stream({ messages: [{ role: 'user', content: 'ping' }], tools: [weatherTool] }));
    assert.deepEqual(first.calls.map((c) => [c.name, JSON.parse(c.arguments)]), [['get_weather', { input: 'ping' }]]);
    const second = await collect(
      model.stream({
        messages: [
          { role: 'user', content: 'ping' },
          { role: 'assistant', content: '', toolCalls: [{ id: first.calls[0]!.id!, name: 'get_weather', arguments: first.calls[0]!.arguments }] },
          { role: 'tool', toolCallId: first.calls[0]!.id!, name: 'get_weather', content: 'pong' },
        ],
        tools: [weatherTool],
      }),
    );
    assert.equal(second.text, 'tool result: pong');
  });

  it('sends arguments that are not a JSON object back as {} (servers that parse past calls refuse the turn)', async () => {
    server.enqueue({ text: 'ok' });
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL });
    const call = (id: string, args: string) => ({ role: 'assistant' as const, content: '', toolCalls: [{ id, name: 'get_weather', arguments: args }] });
    const result = (id: string) => ({ role: 'tool' as const, toolCallId: id, name: 'get_weather', content: 'error' });
    await collect(model.stream({ messages: [{ role: 'user', content: 'hi' }, call('a', '{"city": '), result('a'), call('b', '[1]'), result('b'), call('c', '{"city":"Oslo"}'), result('c')], tools: [weatherTool] }));
    const sent = (server.requests[0]!.body as { messages: Array<{ tool_calls?: Array<{ function: { arguments: string } }> }> }).messages;
    assert.deepEqual(sent.flatMap((m) => m.tool_calls ?? []).map((c) => c.function.arguments), ['{}', '{}', '{"city":"Oslo"}']);
  });

  it('answers 500 once a script runs out, so a surplus request is visible', async () => {
    const model = openai({ model: 'm', baseURL: server.openaiBaseURL, retry: { maxRetries: 0 } });
    const error = await rejection(collect(model.stream({ messages: hello, tools: [] })));
    assert.ok(error instanceof ProviderError);
    assert.match(error.body ?? '', /no scripted reply left/);
  });
});

// ---------------------------------------------------------------------------------------------
// SSE as servers actually write it: a raw server sends exact bytes, split where it likes.

describe('openai() reads SSE framing as servers write it', () => {
  let raw: import('node:http').Server;
  let base = '';
  let pieces: string[] = [];
  let contentType = 'text/event-stream';
  let pieceDelayMs = 2;
  beforeEach(() => {
    contentType = 'text/event-stream';
    pieceDelayMs = 2;
  });
  before(async () => {
    const { createServer } = await import('node:http');
    raw = createServer(async (_req, res) => {
      res.writeHead(200, { 'content-type': contentType });
      for (const piece of pieces) {
        // With no delay, only the socket paces the writes: a long body goes out in many pieces.
        if (!res.write(piece) && pieceDelayMs === 0) await new Promise((resolve) => res.once('drain', resolve));
        if (pieceDelayMs > 0) await new Promise((resolve) => setTimeout(resolve, pieceDelayMs));
      }
      res.end();
    });
    await new Promise<void>((resolve) => raw.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(raw.address() as import('node:net').AddressInfo).port}/v1`;
  });
  after(() => raw.close());
  const provider = () => openai({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } });
  const delta = (content: string) => JSON.stringify({ choices: [{ index: 0, delta: { content } }] });

  it('CRLF line ends, comments, a multi-line data field, and events and UTF-8 split across writes', async () => {
    const stream = [
      ': keep-alive comment\r\n\r\n',
      `data: ${delta('Hé')}\r\n\r\n`,
      // One JSON value over two `data:` lines (joined with a newline, which JSON allows).
      `data: {"choices":[{"index":0,\r\ndata: "delta":{"content":"llo 🌍"}}]}\r\n\r\n`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] })}\r\n\r\ndata: [DONE]\r\n\r\n`,
    ].join('');
    // Split every few bytes, in the middle of lines and of multi-byte characters.
    const bytes = Buffer.from(stream);
    pieces = [];
    for (let i = 0; i < bytes.length; i += 7) pieces.push(bytes.subarray(i, i + 7) as unknown as string);
    const out = await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }));
    assert.equal(out.text, 'Héllo 🌍');
    assert.equal(out.finish?.finishReason, 'stop');
  });

  it('a model thinking past timeoutMs is not cut off: its reasoning and keep-alives are progress, though they yield no text', async () => {
    // Gaps well inside the timeout, so a loaded machine's late timers do not fail a passing case;
    // the thinking still lasts longer than the timeout, which it would exceed were it no progress.
    pieceDelayMs = 100;
    const thinking = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { reasoning_content: 'hmm' } }] })}\n\n`;
    pieces = [...Array.from({ length: 6 }, () => thinking), `data: ${delta('done')}\n\n`, 'data: [DONE]\n\n'];
    const model = openai({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 }, timeoutMs: 400 });
    assert.equal((await collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'done');
  });

  it('keep-alives alone do not hold a stalled answer open past timeoutMs', async () => {
    pieceDelayMs = 60;
    pieces = [`data: ${delta('a')}\n\n`, ...Array.from({ length: 8 }, (_, i) => (i % 2 ? ': keep-alive\n\n' : 'data:\n\n')), `data: ${delta('b')}\n\n`, 'data: [DONE]\n\n'];
    const model = openai({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 }, timeoutMs: 150 });
    const error = await rejection(collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_timeout', `got ${String(error)}`);
  });

  it('deltas that carry nothing are keep-alives too (OpenAI-compatible SSE and Ollama lines); thinking under any name is progress', async () => {
    pieceDelayMs = 100;
    // As above: gaps well inside the timeout, pieces that carry nothing lasting well past it.
    const empties = [{}, { role: 'assistant' }, { role: 'assistant', content: '' }, { content: null, tool_calls: [] }];
    pieces = [`data: ${delta('a')}\n\n`, ...Array.from({ length: 8 }, (_, i) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: empties[i % 4] }] })}\n\n`)];
    const model = openai({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 }, timeoutMs: 400 });
    const error = await rejection(collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_timeout', `got ${String(error)}`);

    contentType = 'application/x-ndjson';
    const ndjson = ollama({ baseURL: base.replace(/\/v1$/, ''), model: 'm', retry: { maxRetries: 0 }, timeoutMs: 400 });
    const line = (message: Record<string, unknown>, done = false) => `${JSON.stringify({ model: 'm', message, done })}\n`;
    pieces = Array.from({ length: 8 }, () => line({ role: 'assistant', content: '' }));
    const stalled = await rejection(collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(stalled instanceof ProviderError && stalled.code === 'provider_timeout', `got ${String(stalled)}`);
    // Ollama's thinking, like OpenRouter's `reasoning`, yields no text: progress all the same.
    pieces = [...Array.from({ length: 6 }, () => line({ role: 'assistant', content: '', thinking: 'hmm' })), line({ role: 'assistant', content: 'done' }, true)];
    assert.equal((await collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'done');
    contentType = 'text/event-stream';
    const reasoning = `data: ${JSON.stringify({ choices: [{ index: 0, delta: { role: 'assistant', reasoning: 'hmm' } }] })}\n\n`;
    pieces = [...Array.from({ length: 6 }, () => reasoning), `data: ${delta('done')}\n\n`, 'data: [DONE]\n\n'];
    assert.equal((await collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'done');
  });

  it("Anthropic's `ping` events are keep-alives too: a stream of only pings fails with provider_timeout", async () => {
    pieceDelayMs = 60;
    const start = { type: 'message_start', message: { id: 'm', type: 'message', role: 'assistant', content: [], model: 'm', usage: { input_tokens: 1, output_tokens: 0 } } };
    pieces = [`event: message_start\ndata: ${JSON.stringify(start)}\n\n`, ...Array.from({ length: 10 }, () => 'event: ping\ndata: {"type": "ping"}\n\n')];
    const model = anthropic({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 }, timeoutMs: 150 });
    const error = await rejection(collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_timeout', `got ${String(error)}`);
  });

  it('empty `data:` keep-alives are skipped', async () => {
    pieces = ['data:\n\n', `data: ${delta('Hel')}\n\n`, 'data: \r\n\r\n', `data: ${delta('lo')}\n\n`, 'data: [DONE]\n\n'];
    assert.equal((await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'Hello');
  });

  it('a plain JSON reply to a streaming request is read whole: an answer, or an error with its message', async () => {
    contentType = 'application/json; charset=utf-8';
    // LM Studio, asked at a path it does not serve, answers 200 with an error object.
    pieces = ['{"error":"Unexpected endpoint or method. (POST /chat/completions)"}'];
    const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError, `got ${String(error)}`);
    assert.match(error.message, /Unexpected endpoint or method/);
    // A server that ignores `stream: true` and answers the whole completion.
    pieces = [JSON.stringify({ choices: [{ index: 0, message: { role: 'assistant', content: 'whole answer' }, finish_reason: 'stop' }] })];
    assert.equal((await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'whole answer');
  });

  it('anthropic(): a tool input sent whole at its block start (as proxies do) is the call\'s input, and cached prompt tokens count', async () => {
    const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const usage = { input_tokens: 10, cache_creation_input_tokens: 500, cache_read_input_tokens: 1000, output_tokens: 1 };
    pieces = [
      ev('message_start', { message: { usage } }),
      ev('content_block_start', { index: 0, content_block: { type: 'tool_use', id: 't1', name: 'get_weather', input: { city: 'Oslo' } } }),
      ev('content_block_stop', { index: 0 }),
      // The API's own way: `{}` at the start, the input streamed.
      ev('content_block_start', { index: 1, content_block: { type: 'tool_use', id: 't2', name: 'get_weather', input: {} } }),
      ev('content_block_delta', { index: 1, delta: { type: 'input_json_delta', partial_json: '{"city":"Lima"}' } }),
      ev('content_block_stop', { index: 1 }),
      ev('message_delta', { delta: { stop_reason: 'tool_use' }, usage: { output_tokens: 20 } }),
      ev('message_stop', {}),
    ];
    const model = anthropic({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } });
    const out = await collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [weatherTool] }));
    assert.deepEqual(out.calls, [
      { id: 't1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
      { id: 't2', name: 'get_weather', arguments: '{"city":"Lima"}' },
    ]);
    assert.deepEqual(out.finish?.usage, { inputTokens: 1510, outputTokens: 20 });
  });

  it('anthropic(): a tool input sent whole at its block start is given when the next block starts: a server that stops no block has no inputs held back', async () => {
    const ev = (type: string, data: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`;
    const call = (index: number, city: string) => ev('content_block_start', { index, content_block: { type: 'tool_use', id: `t${index}`, name: 'get_weather', input: { city } } });
    pieces = [ev('message_start', { message: { usage: { input_tokens: 1, output_tokens: 1 } } }), call(0, 'Oslo'), call(1, 'Lima'), call(2, 'Rome'), ev('message_stop', {})];
    const model = anthropic({ baseURL: base, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } });
    const out = await collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [weatherTool] }));
    const pieceOrder = out.chunks.flatMap((chunk) => (chunk.type === 'tool_call' ? [`${chunk.index}:${chunk.name ?? chunk.argumentsDelta}`] : []));
    assert.deepEqual(pieceOrder, ['0:get_weather', '0:{"city":"Oslo"}', '1:get_weather', '1:{"city":"Lima"}', '2:get_weather', '2:{"city":"Rome"}']);
  });

  it('an `error:` line before [DONE] is a ProviderError, not a finished answer', async () => {
    pieces = [`data: ${delta('partial')}\n\n`, 'error: {"code":500,"message":"the request exceeds the available context size","type":"server_error"}\n\n', 'data: [DONE]\n\n'];
    const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError, `got ${String(error)}`);
    assert.match(error.message, /exceeds the available context size/);
  });

  it('an `event: error` is a ProviderError with its message whatever its data holds, not the answer so far passed off as finished', async () => {
    const failsWith = async (errorEvent: string, message: RegExp, retryable: boolean) => {
      // After a delta nothing is retryable (the caller has the delta); before one, the event's kind decides.
      for (const [before, expected] of [[[`data: ${delta('partial')}\n\n`], false], [[], retryable]] as const) {
        pieces = [...before, `event: error\n${errorEvent}\n\n`, 'data: [DONE]\n\n'];
        const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
        assert.ok(error instanceof ProviderError && error.code === 'provider_http', `${errorEvent}: got ${String(error)}`);
        assert.match(error.message, message);
        assert.equal(error.retryable, expected, `${errorEvent} after ${before.length} deltas`);
      }
    };
    // A serving layer over vLLM (fms-guardrails-orchestrator) reports a refused request so.
    await failsWith('data: {"code":400,"details":"Requested sample logprobs of 21, which is greater than max allowed: 20"}', /greater than max allowed: 20/, false);
    // The shape of the Responses API's error event, which some compatible servers reuse.
    await failsWith('data: {"type":"error","code":"server_error","message":"Something went wrong","param":null}', /Something went wrong/, true);
    // The Chat Completions shape under the event name too, and data that is no JSON at all.
    await failsWith('data: {"error":{"message":"Compute error.","type":"server_error"}}', /Compute error\./, true);
    await failsWith('data: upstream connect error or disconnect/reset before headers', /upstream connect error/, false);
  });

  it('content sent as text parts rather than a string, or as a refusal, is read as its text', async () => {
    const parts = [{ type: 'text', text: 'Hel' }, { type: 'image_url', image_url: { url: 'x' } }, { type: 'text', text: 'lo' }];
    pieces = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: parts }, finish_reason: 'stop' }] })}\n\n`, 'data: [DONE]\n\n'];
    const out = await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }));
    assert.equal(out.text, 'Hello');
    // A refusal (OpenAI sends it in its own field) is the answer's text.
    pieces = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: null, refusal: "I can't help with that." }, finish_reason: 'stop' }] })}\n\n`, 'data: [DONE]\n\n'];
    assert.equal((await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, "I can't help with that.");
    pieces = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: [{ type: 'text', text: 5 }] } }] })}\n\n`, 'data: [DONE]\n\n'];
    const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_protocol', `got ${String(error)}`);
  });

  it('tool-call arguments sent as an object rather than JSON text are read as that object', async () => {
    const call = { index: 0, id: 'c1', type: 'function', function: { name: 'get_weather', arguments: { city: 'Oslo' } } };
    pieces = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { tool_calls: [call] }, finish_reason: 'tool_calls' }] })}\n\n`, 'data: [DONE]\n\n'];
    const out = await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }));
    assert.deepEqual(out.calls, [{ id: 'c1', name: 'get_weather', arguments: '{"city":"Oslo"}' }]);
  });

  it('a tool-call index past what the core counts (2^32 - 1) is provider_protocol naming the field', async () => {
    const delta = (index: number) => ({ choices: [{ index: 0, delta: { tool_calls: [{ index, id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] }, finish_reason: 'tool_calls' }] });
    pieces = [`data: ${JSON.stringify(delta(2 ** 32))}\n\n`, 'data: [DONE]\n\n'];
    const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_protocol', `got ${String(error)}`);
    assert.match(error.message, /`tool_calls\[\]\.index` is number, not a non-negative integer up to 4294967295/);
    pieces = [`data: ${JSON.stringify(delta(2 ** 32 - 1))}\n\n`, 'data: [DONE]\n\n'];
    assert.deepEqual((await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).calls, [{ id: 'c1', name: 'f', arguments: '{}' }]);
  });

  it('an SSE event or an NDJSON line longer than 16 Mi characters is provider_protocol, and reading stops there', async () => {
    const mib = 'x'.repeat(2 ** 20);
    pieces = ['data: {"choices":[{"index":0,"delta":{"content":"', ...Array.from({ length: 17 }, () => mib)];
    const sse = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(sse instanceof ProviderError && sse.code === 'provider_protocol', `got ${String(sse)}`);
    assert.match(sse.message, /an event of the stream is longer than 16777216 characters/);
    // One character over, most of it buffered before the read that completes the event (the
    // parser's bound counts only what it held before that read), with `[DONE]` in that read.
    const over = 'x'.repeat(2 ** 24 + 1);
    pieces = [`data: ${over.slice(0, 2 ** 24 - 100)}`, `${over.slice(2 ** 24 - 100)}\n\ndata: [DONE]\n\n`];
    const edge = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(edge instanceof ProviderError && edge.code === 'provider_protocol', `got ${String(edge)}`);
    assert.match(edge.message, /an event of the stream is longer than 16777216 characters/);
    pieces = ['{"message":{"content":"', ...Array.from({ length: 17 }, () => mib)];
    const ndjson = ollama({ baseURL: base.replace(/\/v1$/, ''), model: 'm', retry: { maxRetries: 0 } });
    const line = await rejection(collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(line instanceof ProviderError && line.code === 'provider_protocol', `got ${String(line)}`);
    assert.match(line.message, /a line of the stream is longer than 16777216 characters/);
    // One character over, completed in the read that holds its newline.
    pieces = [over.slice(0, 2 ** 24 - 100), `${over.slice(2 ** 24 - 100)}\n`];
    const edgeLine = await rejection(collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(edgeLine instanceof ProviderError && edgeLine.code === 'provider_protocol', `got ${String(edgeLine)}`);
    assert.match(edgeLine.message, /a line of the stream is longer than 16777216 characters/);
  });

  it('an NDJSON line of 16 M characters in 4 KB pieces is read in linear time (appending and searching it was quadratic)', async () => {
    contentType = 'application/x-ndjson';
    pieceDelayMs = 0;
    // Just under the longest line read (MAX_UNIT_CHARS).
    const content = 'y'.repeat(16_000_000);
    const body = `${JSON.stringify({ model: 'm', message: { role: 'assistant', content }, done: true, done_reason: 'stop' })}\n`;
    pieces = Array.from({ length: Math.ceil(body.length / 4096) }, (_, i) => body.slice(i * 4096, (i + 1) * 4096));
    const ndjson = ollama({ baseURL: base.replace(/\/v1$/, ''), model: 'm', retry: { maxRetries: 0 } });
    const started = performance.now();
    const out = await collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }));
    const ms = performance.now() - started;
    assert.equal(out.text.length, content.length);
    // Linear: a few hundred ms. Quadratic, it took over 6 s here.
    assert.ok(ms < 2500, `took ${Math.round(ms)} ms`);
  });

  it('ollama(): `"error": null` on every line (a serializer writing absent fields) is no error; an error is', async () => {
    contentType = 'application/x-ndjson';
    const line = (fields: Record<string, unknown>) => `${JSON.stringify({ model: 'm', error: null, ...fields })}\n`;
    pieces = [line({ message: { role: 'assistant', content: 'Hello' }, done: false }), line({ message: { role: 'assistant', content: '' }, done: true, done_reason: 'stop' })];
    const ndjson = ollama({ baseURL: base.replace(/\/v1$/, ''), model: 'm', retry: { maxRetries: 0 } });
    const out = await collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }));
    assert.equal(out.text, 'Hello');
    assert.equal(out.finish?.finishReason, 'stop');
    pieces = [line({ error: 'model "m" not found, try pulling it first' })];
    const error = await rejection(collect(ndjson.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError, `got ${String(error)}`);
    assert.match(error.message, /model "m" not found/);
  });

  it('a web page answered with 200 to a streaming request is provider_protocol naming its content type and quoting it; SSE sent as text/plain is read', async () => {
    const page = '<!doctype html><html><head><title>Open WebUI</title></head><body><div id="app"></div></body></html>';
    contentType = 'text/html; charset=utf-8';
    pieces = [page];
    const root = base.replace(/\/v1$/, '');
    for (const model of [provider(), anthropic({ baseURL: root, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } })]) {
      const error = await rejection(collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
      assert.ok(error instanceof ProviderError && error.code === 'provider_protocol', `${model.id}: got ${String(error)}`);
      assert.match(error.message, /expected an event stream, got text\/html; charset=utf-8: <!doctype html><html><head><title>Open WebUI/);
      assert.equal(error.body, page);
    }
    contentType = 'text/plain; charset=utf-8';
    pieces = [`data: ${delta('Hel')}\n\n`, `data: ${delta('lo')}\n\n`, 'data: [DONE]\n\n'];
    assert.equal((await collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] }))).text, 'Hello');
    // Text that holds no event at all (a proxy's notice) is quoted, not called an answer cut short.
    pieces = ['Service temporarily unavailable, ', 'try again later'];
    for (const model of [provider(), anthropic({ baseURL: root, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } })]) {
      const error = await rejection(collect(model.stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
      assert.ok(error instanceof ProviderError && error.code === 'provider_protocol', `${model.id}: got ${String(error)}`);
      assert.match(error.message, /expected an event stream, got a body with no events \(text\/plain; charset=utf-8\): Service temporarily unavailable, try again later$/);
    }
    // Keep-alives alone are an event stream cut short, as before.
    pieces = [': ping\n\n', ': ping\n\n'];
    const cut = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.match(String(cut), /stream ended before the answer finished/);
  });

  it('random and mutated bodies of the three wire formats end in chunks of the right shape or a ProviderError, never another exception', async () => {
    const { below: rnd, pick } = seeded(0x2545f491);
    const odd = [null, -1, 1e9, 'a', {}, [], true, 0, 1.5, '0'];
    const openaiEvents = () => [
      `data: ${delta(pick(['a', 'é', '']))}`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: { tool_calls: [{ index: pick(odd), id: pick(['c1', null, 7]), function: { name: pick(['f', null, 3]), arguments: pick(['{"a":', '1}', null, { a: 1 }]) } }] } }] })}`,
      `data: ${JSON.stringify({ choices: [{ index: 0, delta: pick([null, {}, { content: pick(odd) }]), finish_reason: pick(['stop', 'tool_calls', 'length', null, 5]) }] })}`,
      `data: ${JSON.stringify({ choices: pick([null, [], [null], 'x']), usage: pick([null, { prompt_tokens: 'x' }, { prompt_tokens: 1, completion_tokens: 2 }]) })}`,
      'data: [DONE]', 'data: {', 'data: null', 'data: []', 'event: x', ': c', 'error: {"message":"m"}', 'data:', 'retry: 1',
    ];
    const anthropicEvents = () => [
      `event: message_start\ndata: ${JSON.stringify({ type: 'message_start', message: pick([{ usage: { input_tokens: 3 } }, null, {}]) })}`,
      `event: content_block_start\ndata: ${JSON.stringify({ type: 'content_block_start', index: pick(odd), content_block: pick([{ type: 'tool_use', id: 't', name: pick(['f', null]) }, { type: 'text', text: 'x' }, null]) })}`,
      `event: content_block_delta\ndata: ${JSON.stringify({ type: 'content_block_delta', index: pick(odd), delta: pick([{ type: 'text_delta', text: 'hi' }, { type: 'input_json_delta', partial_json: pick(['{"a"', ':1}', null]) }, null, {}]) })}`,
      `event: message_delta\ndata: ${JSON.stringify({ type: 'message_delta', delta: { stop_reason: pick(['end_turn', 'tool_use', 'max_tokens', null, 4]) }, usage: pick([{ output_tokens: 2 }, null, 'x']) })}`,
      'event: message_stop\ndata: {"type":"message_stop"}', 'event: ping\ndata: {"type":"ping"}', 'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"m"}}',
      'data: {', 'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}',
    ];
    const ollamaLines = () => [
      JSON.stringify({ message: { content: pick(['a', '', null, 5]) }, done: false }),
      JSON.stringify({ message: { tool_calls: pick([[{ function: { name: pick(['f', null]), arguments: pick([{ a: 1 }, '{"a":1}', null, 'x']) } }], null, 'x', [null]]) }, done: false }),
      JSON.stringify({ done: true, done_reason: pick(['stop', 'length', null, 3]), prompt_eval_count: pick([1, 'x', null]), eval_count: 2 }),
      '{', 'null', '[]', '"x"', '',
    ];
    const formats = [
      { make: provider, events: openaiEvents, join: (xs: string[]) => xs.map((x) => `${x}\n\n`).join('') },
      { make: () => anthropic({ baseURL: base.replace(/\/v1$/, ''), apiKey: 'x', model: 'm', retry: { maxRetries: 0 } }), events: anthropicEvents, join: (xs: string[]) => xs.map((x) => `${x}\n\n`).join('') },
      { make: () => ollama({ baseURL: base.replace(/\/v1$/, ''), model: 'm', retry: { maxRetries: 0 } }), events: ollamaLines, join: (xs: string[]) => xs.map((x) => `${x}\n`).join('') },
    ];
    // Per format: the bodies are not all refused (a mapping that refused everything would pass
    // the shape checks below), nor all accepted.
    const finished = [0, 0, 0];
    const refused = [0, 0, 0];
    for (let i = 0; i < iterations(450); i++) {
      const format = formats[i % formats.length]!;
      const body = format.join(Array.from({ length: rnd(8) }, () => pick(format.events())));
      // Whole, or cut at a random byte.
      pieces = [rnd(4) === 0 ? body.slice(0, rnd(body.length + 1)) : body];
      try {
        for await (const chunk of format.make().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })) {
          const ok =
            (chunk.type === 'text' && typeof chunk.delta === 'string') ||
            (chunk.type === 'tool_call' && Number.isInteger(chunk.index) && chunk.index >= 0 && typeof chunk.argumentsDelta === 'string' &&
              (chunk.name === undefined || typeof chunk.name === 'string') && (chunk.id === undefined || typeof chunk.id === 'string')) ||
            (chunk.type === 'finish' && typeof chunk.finishReason === 'string');
          assert.ok(ok, `malformed chunk ${JSON.stringify(chunk)} from ${JSON.stringify(body)}`);
          if (chunk.type === 'finish') finished[i % formats.length]!++;
        }
      } catch (error) {
        if (error instanceof assert.AssertionError) throw error;
        assert.ok(error instanceof ProviderError, `${String(error)} (not a ProviderError) from ${JSON.stringify(pieces[0])}`);
        refused[i % formats.length]!++;
      }
    }
    assert.ok([...finished, ...refused].every((n) => n > 5), `finished ${finished}, refused ${refused} (openai, anthropic, ollama)`);
  });

  it('a body cut off before [DONE] or a finish reason is a provider_protocol error', async () => {
    pieces = [`data: ${delta('half an ans')}\n\n`];
    const error = await rejection(collect(provider().stream({ messages: [{ role: 'user', content: 'hi' }], tools: [] })));
    assert.ok(error instanceof ProviderError && error.code === 'provider_protocol', `got ${String(error)}`);
    assert.match(error.message, /ended before the answer finished/);
  });
});

describe('provider options are checked when the provider is created', () => {
  /** Asserts `make` throws a CrucibleError `invalid_config` whose message matches every pattern. */
  function throwsInvalid(make: () => unknown, ...patterns: Array<RegExp | string>): void {
    assert.throws(make, (e: unknown) => {
      assert.ok(e instanceof CrucibleError, `not a CrucibleError: ${String(e)}`);
      assert.ok(!(e instanceof ProviderError), 'a configuration mistake is not a provider failure');
      assert.equal(e.code, 'invalid_config');
      for (const pattern of patterns) {
        if (typeof pattern === 'string') assert.ok(e.message.includes(pattern), `${JSON.stringify(e.message)} lacks ${pattern}`);
        else assert.match(e.message, pattern);
      }
      return true;
    });
  }

  for (const { name, factory, baseURL } of providers) {
    const make = (options: Record<string, unknown>) => factory({ model: 'm', baseURL: baseURL(server), ...options } as ProviderOptions);
    const own = new RegExp(`^${name}\\(\\)`);

    it(`${name}(): an option it does not have is refused, not dropped (the prompt went to the default server)`, () => {
      // The Python SDK's spellings, and options that are createAgent's.
      throwsInvalid(() => make({ baseURL: undefined, base_url: 'http://127.0.0.1:1', api_key: 'k' }), own, /unknown options base_url \(did you mean baseURL\?\), api_key \(did you mean apiKey\?\); the options are model, baseURL/);
      throwsInvalid(() => make({ maxTokens: 100 }), own, /maxTokens \(did you mean createAgent's maxTokens\?\)/);
      throwsInvalid(() => make({ host: 'http://127.0.0.1:11434' }), own, /host \(did you mean baseURL\?\)/);
      throwsInvalid(() => make({ organisation: 'x' }), own, /unknown option organisation; the options are/);
    });

    it(`${name}(): no options, or options that are not an object`, () => {
      throwsInvalid(() => (factory as (o?: unknown) => unknown)(), own, /options object/, /model/);
      throwsInvalid(() => factory(null as never), own, /options object/, /null/);
      throwsInvalid(() => factory('gpt-4o' as never), own, /options object/);
    });

    it(`${name}(): model must be a non-empty string`, () => {
      throwsInvalid(() => factory({ baseURL: baseURL(server) } as never), own, /`model` must be a non-empty string/, /undefined/);
      throwsInvalid(() => make({ model: '' }), own, /`model`/);
      throwsInvalid(() => make({ model: '  ' }), own, /`model`/);
      throwsInvalid(() => make({ model: 4 }), own, /`model`/, /4/);
    });

    it(`${name}(): baseURL must be an absolute http(s) URL`, () => {
      for (const bad of ['', '/v1', '127.0.0.1:8080/v1', 'localhost:11434', 'ftp://example.com/v1', 'not a url']) {
        throwsInvalid(() => make({ baseURL: bad }), own, /`baseURL` must be an absolute http:\/\/ or https:\/\/ URL/, `(got ${JSON.stringify(bad)})`);
      }
      throwsInvalid(() => make({ baseURL: 8080 }), own, /`baseURL`/, /8080/);
      throwsInvalid(() => make({ baseURL: new URL(baseURL(server)) }), own, /`baseURL`/, /object/);
      throwsInvalid(() => make({ baseURL: undefined, baseUrl: 'http://127.0.0.1:1' }), own, /unknown option baseUrl \(did you mean baseURL\?\)/);
      // Absent means the provider's default; http and https both go.
      assert.ok(make({ baseURL: undefined }).id);
      assert.ok(make({ baseURL: 'https://example.com/v1/' }).id);
    });

    it(`${name}(): timeoutMs and retry settings must be usable numbers`, () => {
      for (const bad of [Number.NaN, Infinity, -1, 0, '1000', 2 ** 31]) {
        throwsInvalid(() => make({ timeoutMs: bad }), own, /`timeoutMs` must be a number of milliseconds/);
      }
      for (const bad of [Number.NaN, Infinity, -1, 1.5, '2']) {
        throwsInvalid(() => make({ retry: { maxRetries: bad } }), own, /`retry.maxRetries` must be a whole number/);
      }
      for (const bad of [Number.NaN, Infinity, -5, '10']) {
        throwsInvalid(() => make({ retry: { initialDelayMs: bad } }), own, /`retry.initialDelayMs` must be a number of milliseconds/);
        throwsInvalid(() => make({ retry: { maxDelayMs: bad } }), own, /`retry.maxDelayMs`/);
      }
      throwsInvalid(() => make({ retry: 3 }), own, /`retry` must be an object/);
      assert.ok(make({ timeoutMs: 1, retry: { maxRetries: 0, initialDelayMs: 0, maxDelayMs: 0 } }).id);
    });

    it(`${name}(): other options of the wrong type`, () => {
      throwsInvalid(() => make({ apiKey: 123 }), own, /`apiKey` must be a string/);
      throwsInvalid(() => make({ headers: 'x-key: 1' }), own, /`headers` must be an object/);
      throwsInvalid(() => make({ stream: 'false' }), own, /`stream` must be true or false/);
      throwsInvalid(() => make({ fetch: 'fetch' }), own, /`fetch` must be a function/);
    });
  }

  it("openai() and ollama(): their own options of the wrong type", () => {
    const base = { model: 'm', baseURL: server.openaiBaseURL };
    throwsInvalid(() => openai({ ...base, reasoningModel: 'yes' } as never), /^openai\(\)/, /`reasoningModel` must be true or false/);
    throwsInvalid(() => openai({ ...base, reasoningEffort: 1 } as never), /`reasoningEffort` must be a string/);
    throwsInvalid(() => openai({ ...base, streamUsage: 'no' } as never), /`streamUsage` must be true or false/);
    throwsInvalid(() => ollama({ ...base, options: 'num_ctx=8192' } as never), /^ollama\(\)/, /`options` must be an object/);
    throwsInvalid(() => ollama({ ...base, keepAlive: true } as never), /`keepAlive` must be a duration/);
  });

  it("ollama(): think is true, false, 'low', 'medium' or 'high' (null or undefined: not given)", () => {
    const base = { model: 'm', baseURL: server.ollamaBaseURL };
    for (const bad of ['true', 'yes', 'Medium', 'HIGH', 'max', 'minimal', '', 1, 0, {}, [], ['low']]) {
      throwsInvalid(() => ollama({ ...base, think: bad } as never), /^ollama\(\)/, /`think` must be true, false or a level, 'low', 'medium', 'high'/);
    }
    for (const good of [true, false, 'low', 'medium', 'high', null, undefined]) assert.ok(ollama({ ...base, think: good as never }).id);
  });

  it('a fractional timeoutMs is rounded up to whole milliseconds, not a RangeError from AbortSignal.timeout', async () => {
    server.enqueue({ text: 'ok' });
    const out = await collect(openai({ model: 'm', baseURL: server.openaiBaseURL, timeoutMs: 10_000.5 }).stream({ messages: hello, tools: [] }));
    assert.equal(out.text, 'ok');
  });
});
