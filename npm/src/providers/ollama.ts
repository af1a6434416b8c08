/**
 * Ollama native chat provider (`POST {baseURL}/api/chat`), streaming newline-delimited JSON.
 * Prefer it over Ollama's OpenAI-compatible `/v1` when you want its token counts and its
 * whole-object tool calls.
 *
 * Wire format: https://github.com/ollama/ollama/blob/main/docs/api.md#generate-a-chat-completion
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
  checkProviderOptions,
  type HttpContext,
} from './http.js';
import type { ChatMessage, ModelChunk, ModelProvider, ModelRequest, ProviderOptions } from './types.js';

/** Default endpoint of a local Ollama. */
export const OLLAMA_DEFAULT_BASE_URL = 'http://127.0.0.1:11434';

/**
 * Creates a provider for a local or remote Ollama server.
 *
 * @example
 * ```ts
 * const model = ollama({ model: 'qwen3:4b' });
 * ```
 */
export function ollama(options: ProviderOptions): ModelProvider {
  checkProviderOptions('ollama', options);
  const headers: Record<string, string> = { ...options.headers };
  // Ollama itself needs no key; hosted Ollama-compatible gateways take a Bearer token.
  if (options.apiKey) headers.authorization = `Bearer ${options.apiKey}`;
  return postProvider({
    name: 'ollama',
    options,
    defaultBaseURL: OLLAMA_DEFAULT_BASE_URL,
    path: 'api/chat',
    headers,
    toWire: toWireRequest,
    parse: async function* (ctx, response, streaming) {
      const lines = streaming ? readNdjson(ctx, response) : single(await readJson(ctx, response));
      yield* parseLines(ctx, lines);
    },
  });
}

// ---------------------------------------------------------------------------------------------
// Request mapping

function toWireRequest(model: string, request: ModelRequest, streaming: boolean): Record<string, unknown> {
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
  const modelOptions: Record<string, number> = {};
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
    case 'assistant':
      if (!message.toolCalls?.length) return { role: 'assistant', content: message.content };
      return {
        role: 'assistant',
        content: message.content,
        // Ollama takes arguments as an object, not as JSON text.
        tool_calls: message.toolCalls.map((call) => ({
          function: { name: call.name, arguments: argumentsObject(call.arguments) },
        })),
      };
    case 'tool':
      return { role: 'tool', content: message.content, tool_name: message.name };
  }
}

// ---------------------------------------------------------------------------------------------
// Response mapping

interface WireLine {
  message?: {
    content?: string;
    tool_calls?: Array<{ id?: string; function?: { name?: string; arguments?: unknown } }>;
  };
  done?: boolean;
  done_reason?: string;
  prompt_eval_count?: number;
  eval_count?: number;
  error?: string;
}

async function* parseLines(ctx: HttpContext, lines: AsyncIterable<unknown>): AsyncGenerator<ModelChunk> {
  let callIndex = 0;
  for await (const value of lines) {
    const raw = JSON.stringify(value);
    const line = expectObject(ctx, value, raw) as WireLine;
    if (line.error !== undefined) {
      throw streamedError(ctx, `server error in stream: ${line.error}`, { retryable: false, body: raw });
    }
    if (line.message?.content) yield { type: 'text', delta: line.message.content };
    for (const call of line.message?.tool_calls ?? []) {
      const args = call.function?.arguments;
      yield {
        type: 'tool_call',
        index: callIndex++,
        // Ollama sends no call ids; tool results are matched by name on its side, ids on ours.
        id: call.id || generateCallId(),
        name: call.function?.name ?? '',
        argumentsDelta: typeof args === 'string' ? args : JSON.stringify(args ?? {}),
      };
    }
    if (line.done) {
      const finishReason = line.done_reason ?? 'stop';
      if (line.prompt_eval_count === undefined && line.eval_count === undefined) {
        yield { type: 'finish', finishReason };
      } else {
        yield {
          type: 'finish',
          finishReason,
          usage: { inputTokens: line.prompt_eval_count ?? 0, outputTokens: line.eval_count ?? 0 },
        };
      }
      return;
    }
  }
  throw protocolError(ctx, 'stream ended before a `done: true` line');
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
