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
  functionTools,
  postProvider,
  checkProviderOptions,
  argumentsText,
  type HttpContext,
} from './http.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, ProviderOptions, Usage } from './types.js';

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
export function openai(options: ProviderOptions): ModelProvider {
  checkProviderOptions('openai', options);
  const headers: Record<string, string> = { ...options.headers };
  // Local servers (llama-server, vLLM) need no key; sending an empty Bearer confuses some proxies.
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  return postProvider({
    name: 'openai',
    options,
    defaultBaseURL: OPENAI_DEFAULT_BASE_URL,
    path: 'chat/completions',
    headers,
    toWire: toWireRequest,
    parse: async function* (ctx, response, streaming) {
      if (streaming) yield* parseStream(ctx, readSse(ctx, response));
      else yield* parseCompletion(ctx, await readJson(ctx, response));
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping

function toWireRequest(model: string, request: ModelRequest, streaming: boolean): Record<string, unknown> {
  const body: Record<string, unknown> = { model, messages: request.messages.map(toWireMessage) };
  // Some servers reject an empty `tools` array, and it means the same as no tools.
  if (request.tools.length > 0) {
    body.tools = functionTools(request.tools);
    if (request.toolChoice !== undefined) {
      const choice = request.toolChoice;
      body.tool_choice = typeof choice === 'string' ? choice : { type: 'function', function: { name: choice.tool } };
    }
  }
  if (request.temperature !== undefined) body.temperature = request.temperature;
  if (request.maxTokens !== undefined) body.max_tokens = request.maxTokens;
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

interface WireToolCallDelta {
  index?: number;
  id?: string;
  /** JSON text per the spec; some compatible servers send the object itself. */
  function?: { name?: string; arguments?: string | Record<string, unknown> };
}

interface WireChunk {
  choices?: Array<{
    delta?: { content?: string | null; tool_calls?: WireToolCallDelta[] };
    message?: { content?: string | null; tool_calls?: WireToolCallDelta[] };
    finish_reason?: string | null;
  }>;
  usage?: { prompt_tokens?: number; completion_tokens?: number } | null;
  error?: { message?: string; type?: string; code?: number | string };
}

async function* parseStream(ctx: HttpContext, events: AsyncIterable<EventSourceMessage>): AsyncGenerator<ModelChunk> {
  let finishReason: string | undefined;
  let usage: Usage | undefined;
  let terminated = false;

  for await (const event of events) {
    if (event.data === '[DONE]') {
      terminated = true;
      break;
    }
    const chunk = expectObject(ctx, parseJson(ctx, event.data), event.data) as WireChunk;
    throwIfError(ctx, chunk, event.data);
    usage = toUsage(chunk.usage) ?? usage;
    // The usage-only chunk that `include_usage` adds has `choices: []`.
    const choice = chunk.choices?.[0];
    if (!choice) continue;
    const content = choice.delta?.content;
    if (content) yield { type: 'text', delta: content };
    const calls = choice.delta?.tool_calls ?? [];
    for (const [position, call] of calls.entries()) yield toToolCallChunk(call, position);
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }

  // A body that ends with neither `[DONE]` nor a finish reason was cut off mid-answer.
  if (!terminated && finishReason === undefined) throw protocolError(ctx, 'stream ended before the answer finished');
  yield usage ? { type: 'finish', finishReason: finishReason ?? 'stop', usage } : { type: 'finish', finishReason: finishReason ?? 'stop' };
}

async function* parseCompletion(ctx: HttpContext, json: unknown): AsyncGenerator<ModelChunk> {
  const completion = expectObject(ctx, json, JSON.stringify(json)) as WireChunk;
  throwIfError(ctx, completion, JSON.stringify(json));
  const choice = completion.choices?.[0];
  if (!choice?.message) throw protocolError(ctx, 'completion has no `choices[0].message`', undefined, JSON.stringify(json));
  if (choice.message.content) yield { type: 'text', delta: choice.message.content };
  for (const [position, call] of (choice.message.tool_calls ?? []).entries()) yield toToolCallChunk(call, position);
  const usage = toUsage(completion.usage);
  const finishReason = choice.finish_reason ?? 'stop';
  yield usage ? { type: 'finish', finishReason, usage } : { type: 'finish', finishReason };
}

function toToolCallChunk(call: WireToolCallDelta, position: number): ModelChunk {
  const args = call.function?.arguments;
  const chunk: Extract<ModelChunk, { type: 'tool_call' }> = {
    type: 'tool_call',
    // `index` is in the spec, but some compatible servers leave it out of single-call deltas.
    index: call.index ?? position,
    argumentsDelta: typeof args === 'object' && args !== null ? JSON.stringify(args) : (args ?? ''),
  };
  if (call.id) chunk.id = call.id;
  if (call.function?.name) chunk.name = call.function.name;
  return chunk;
}

function toUsage(usage: WireChunk['usage']): Usage | undefined {
  if (!usage) return undefined;
  return { inputTokens: usage.prompt_tokens ?? 0, outputTokens: usage.completion_tokens ?? 0 };
}

function throwIfError(ctx: HttpContext, chunk: WireChunk, raw: string): void {
  if (!chunk.error) return;
  const status = typeof chunk.error.code === 'number' ? chunk.error.code : undefined;
  const retryable =
    (status !== undefined && (status === 429 || status >= 500)) ||
    /server_error|overloaded|rate_limit/.test(chunk.error.type ?? '');
  throw streamedError(ctx, `server error in stream: ${chunk.error.message ?? raw.slice(0, 200)}`, {
    status,
    retryable,
    body: raw,
  });
}
