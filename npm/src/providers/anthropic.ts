/**
 * Anthropic Messages API provider (`POST {baseURL}/v1/messages`).
 *
 * Wire format: https://docs.anthropic.com/en/api/messages and
 * https://docs.anthropic.com/en/api/messages-streaming
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
  argumentsObject,
  postProvider,
  checkProviderOptions,
  type HttpContext,
} from './http.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, ProviderOptions, Usage } from './types.js';

/** Default endpoint. */
export const ANTHROPIC_DEFAULT_BASE_URL = 'https://api.anthropic.com';
/** The API version this provider's wire mapping was written against. */
export const ANTHROPIC_VERSION = '2023-06-01';
/** The Messages API requires `max_tokens`; used when the request does not set `maxTokens`. */
export const ANTHROPIC_DEFAULT_MAX_TOKENS = 1024;

/**
 * Creates a provider for the Anthropic Messages API.
 *
 * From a browser page, Anthropic answers cross-origin requests only when they carry
 * `anthropic-dangerous-direct-browser-access: true` (pass it in `headers`); the API key is then
 * readable by whoever uses the page, so give it only to pages of your own.
 *
 * @example
 * ```ts
 * const model = anthropic({ model: 'claude-sonnet-4-5', apiKey: process.env.ANTHROPIC_API_KEY });
 * ```
 */
export function anthropic(options: ProviderOptions): ModelProvider {
  checkProviderOptions('anthropic', options);
  const headers: Record<string, string> = { 'anthropic-version': ANTHROPIC_VERSION, ...options.headers };
  if (options.apiKey) headers['x-api-key'] = options.apiKey;
  return postProvider({
    name: 'anthropic',
    options,
    defaultBaseURL: ANTHROPIC_DEFAULT_BASE_URL,
    path: 'v1/messages',
    headers,
    toWire: toWireRequest,
    parse: async function* (ctx, response, streaming) {
      if (streaming) yield* parseStream(ctx, readSse(ctx, response));
      else yield* parseMessage(ctx, await readJson(ctx, response));
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping

type WireBlock =
  | { type: 'text'; text: string }
  | { type: 'tool_use'; id: string; name: string; input: unknown }
  | { type: 'tool_result'; tool_use_id: string; content: string };

interface WireMessage {
  role: 'user' | 'assistant';
  content: string | WireBlock[];
}

function toWireRequest(model: string, request: ModelRequest, streaming: boolean): Record<string, unknown> {
  const system: string[] = [];
  const messages: WireMessage[] = [];
  for (const message of request.messages) {
    if (message.role === 'system') {
      // The Messages API has no system role; instructions live in the top-level `system`.
      system.push(message.content);
      continue;
    }
    if (message.role === 'tool') {
      const block: WireBlock = { type: 'tool_result', tool_use_id: message.toolCallId, content: message.content };
      const last = messages.at(-1);
      // Results of one turn's parallel calls must share a single user message.
      if (last?.role === 'user' && Array.isArray(last.content) && last.content.every((b) => b.type === 'tool_result')) {
        last.content.push(block);
      } else {
        messages.push({ role: 'user', content: [block] });
      }
      continue;
    }
    // An assistant turn with no text and no calls (a model that answered nothing) has no valid
    // form: the API refuses empty content outside the final message. Leaving it out keeps the
    // conversation sendable; the API joins the consecutive user turns around it.
    if (message.role === 'assistant' && !message.content.trim() && !message.toolCalls?.length) continue;
    messages.push(toWireMessage(message));
  }

  const body: Record<string, unknown> = {
    model,
    max_tokens: request.maxTokens ?? ANTHROPIC_DEFAULT_MAX_TOKENS,
    messages,
  };
  if (system.length > 0) body.system = system.join('\n\n');
  if (request.tools.length > 0) {
    body.tools = request.tools.map((tool) => ({
      name: tool.name,
      description: tool.description,
      input_schema: tool.inputSchema,
    }));
    const choice = request.toolChoice;
    if (choice !== undefined) {
      body.tool_choice = typeof choice === 'object' ? { type: 'tool', name: choice.tool } : { type: choice === 'required' ? 'any' : choice };
    }
  }
  if (request.temperature !== undefined) body.temperature = request.temperature;
  if (streaming) body.stream = true;
  return body;
}

function toWireMessage(message: Extract<ChatMessage, { role: 'user' | 'assistant' }>): WireMessage {
  if (message.role === 'user' || !message.toolCalls?.length) return { role: message.role, content: message.content };
  const blocks: WireBlock[] = [];
  // The API rejects empty (and whitespace-only) text blocks.
  if (message.content.trim()) blocks.push({ type: 'text', text: message.content });
  for (const call of message.toolCalls) {
    blocks.push({ type: 'tool_use', id: call.id, name: call.name, input: argumentsObject(call.arguments) });
  }
  return { role: 'assistant', content: blocks };
}

// ---------------------------------------------------------------------------------------------
// Response mapping

interface WireContentBlock {
  type?: string;
  text?: string;
  id?: string;
  name?: string;
  input?: unknown;
}

interface WireEvent {
  type?: string;
  index?: number;
  message?: { usage?: { input_tokens?: number; output_tokens?: number } };
  content_block?: WireContentBlock;
  delta?: { type?: string; text?: string; partial_json?: string; stop_reason?: string | null };
  usage?: { output_tokens?: number; input_tokens?: number };
  error?: { type?: string; message?: string };
}

async function* parseStream(ctx: HttpContext, events: AsyncIterable<EventSourceMessage>): AsyncGenerator<ModelChunk> {
  let inputTokens: number | undefined;
  let outputTokens: number | undefined;
  let stopReason: string | undefined;
  // Content blocks are numbered across text and tool_use; tool calls are numbered on their own.
  const callByBlock = new Map<number, number>();

  for await (const message of events) {
    const event = expectObject(ctx, parseJson(ctx, message.data), message.data) as WireEvent;
    const type = event.type ?? message.event;
    switch (type) {
      case 'message_start':
        inputTokens = event.message?.usage?.input_tokens ?? inputTokens;
        outputTokens = event.message?.usage?.output_tokens ?? outputTokens;
        break;
      case 'content_block_start': {
        const block = event.content_block;
        if (block?.type === 'text' && block.text) yield { type: 'text', delta: block.text };
        if (block?.type === 'tool_use') {
          const index = callByBlock.size;
          callByBlock.set(event.index ?? index, index);
          const chunk: ModelChunk = { type: 'tool_call', index, argumentsDelta: '' };
          if (block.id) chunk.id = block.id;
          if (block.name) chunk.name = block.name;
          yield chunk;
        }
        break;
      }
      case 'content_block_delta': {
        const delta = event.delta;
        if (delta?.type === 'text_delta' && delta.text) yield { type: 'text', delta: delta.text };
        if (delta?.type === 'input_json_delta' && delta.partial_json) {
          const index = callByBlock.get(event.index ?? -1);
          if (index === undefined) throw protocolError(ctx, `input_json_delta for unknown block ${event.index}`, undefined, message.data);
          yield { type: 'tool_call', index, argumentsDelta: delta.partial_json };
        }
        break;
      }
      case 'message_delta':
        stopReason = event.delta?.stop_reason ?? stopReason;
        outputTokens = event.usage?.output_tokens ?? outputTokens;
        // Newer API versions also report final input tokens here; a 0 would mean "unknown".
        if (event.usage?.input_tokens) inputTokens = event.usage.input_tokens;
        break;
      case 'message_stop':
        yield finishChunk(stopReason, inputTokens, outputTokens);
        return;
      case 'error': {
        const errorType = event.error?.type ?? 'error';
        throw streamedError(ctx, `${errorType}: ${event.error?.message ?? ''}`, {
          status: errorType === 'overloaded_error' ? 529 : undefined,
          retryable: /overloaded_error|api_error|rate_limit_error/.test(errorType),
          body: message.data,
        });
      }
      default:
        // `ping` and event types added after this mapping was written carry nothing we need.
        break;
    }
  }
  throw protocolError(ctx, 'stream ended before `message_stop`');
}

async function* parseMessage(ctx: HttpContext, json: unknown): AsyncGenerator<ModelChunk> {
  const raw = JSON.stringify(json);
  const message = expectObject(ctx, json, raw) as {
    type?: string;
    content?: WireContentBlock[];
    stop_reason?: string | null;
    usage?: { input_tokens?: number; output_tokens?: number };
    error?: { type?: string; message?: string };
  };
  if (message.type === 'error') {
    throw streamedError(ctx, `${message.error?.type}: ${message.error?.message ?? ''}`, { retryable: false, body: raw });
  }
  if (!Array.isArray(message.content)) throw protocolError(ctx, 'message has no `content` array', undefined, raw);
  let index = 0;
  for (const block of message.content) {
    if (block.type === 'text' && block.text) yield { type: 'text', delta: block.text };
    if (block.type === 'tool_use') {
      const chunk: ModelChunk = { type: 'tool_call', index: index++, argumentsDelta: JSON.stringify(block.input ?? {}) };
      if (block.id) chunk.id = block.id;
      if (block.name) chunk.name = block.name;
      yield chunk;
    }
  }
  yield finishChunk(message.stop_reason ?? undefined, message.usage?.input_tokens, message.usage?.output_tokens);
}

function finishChunk(stopReason: string | undefined, inputTokens?: number, outputTokens?: number): ModelChunk {
  const finishReason = stopReason ?? 'end_turn';
  if (inputTokens === undefined && outputTokens === undefined) return { type: 'finish', finishReason };
  const usage: Usage = { inputTokens: inputTokens ?? 0, outputTokens: outputTokens ?? 0 };
  return { type: 'finish', finishReason, usage };
}
