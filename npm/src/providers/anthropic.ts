/**
 * Anthropic Messages API provider (`POST {baseURL}/v1/messages`; a `baseURL` ending in `/v1` is
 * taken as well, as the Vercel AI SDK writes it).
 *
 * Wire format: https://docs.anthropic.com/en/api/messages and
 * https://docs.anthropic.com/en/api/messages-streaming
 *
 * Extended thinking (https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking):
 * `thinking` and `redacted_thinking` blocks are no answer text. The API wants those of a turn
 * with tool calls back with that turn, unchanged and before its `tool_use` blocks (else 400), so
 * they travel with the calls as their `providerData` ({@link Echo}). Adaptive thinking gives the
 * same blocks, between calls too, and wants them back the same way ("The round-trip rules are
 * identical": https://platform.claude.com/docs/en/build-with-claude/thinking-tool-workflows).
 *
 * Server tools (web search, code execution, the MCP connector; given in `extraBody.tools`) run
 * within the answer: their `server_tool_use` / `mcp_tool_use` blocks and their result blocks are
 * no calls of the agent's and no answer text, so both parsers read past them. They are not kept:
 * a turn goes back as its text and the agent's calls (with their thinking), so on later turns the
 * model no longer sees what its server tools found, only what it wrote of it.
 *
 * Prompt caching (https://platform.claude.com/docs/en/build-with-claude/prompt-caching), with
 * the `promptCaching` option: `cache_control` breakpoints on a tool definition, a system block
 * and content blocks, placed for agent loops ({@link markBreakpoints}).
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
  mergeHeaders,
  checkProviderOptions,
  repliesWithJson,
  optionError,
  type HttpContext,
} from './http.js';
import { isRecord } from '../errors.js';
import type { AnthropicEffort, AnthropicOptions, AnthropicPromptCaching, ChatMessage, ModelChunk, ModelProvider, ModelRequest, ProviderOptions, ToolCall, Usage } from './types.js';
import { lazyText, loose, WireReader, type WireObject } from './wire.js';
import { appendedBytes, jsonBytes, ProviderDataBudget } from './provider-data.js';

/** Default endpoint. */
export const ANTHROPIC_DEFAULT_BASE_URL = 'https://api.anthropic.com';
/** The API version this provider's wire mapping was written against. */
export const ANTHROPIC_VERSION = '2023-06-01';
/** The Messages API requires `max_tokens`; used when the request does not set `maxTokens`.
 *  4096 is the largest every Claude 3+ model allows: a lower cap cut `forge_tool` calls (whole
 *  programs in their arguments) off mid-argument. */
export const ANTHROPIC_DEFAULT_MAX_TOKENS = 4096;

/** The least `budget_tokens` the API takes. */
const MIN_THINKING_BUDGET = 1024;

/** The `output_config.effort` levels of the API (https://platform.claude.com/docs/en/build-with-claude/effort). */
const EFFORTS: readonly AnthropicEffort[] = ['low', 'medium', 'high', 'xhigh', 'max'];

/** "You can define up to 4 cache breakpoints" (prompt caching docs); a fifth is refused with 400. */
const MAX_BREAKPOINTS = 4;

/** The cache lifetimes the API takes in `cache_control.ttl`. */
const CACHE_TTLS: readonly NonNullable<AnthropicPromptCaching['ttl']>[] = ['5m', '1h'];

/** The options of this provider beyond every provider's (a misspelt one is refused). */
const ANTHROPIC_OPTIONS = Object.keys({ thinking: true, promptCaching: true } satisfies Record<Exclude<keyof AnthropicOptions, keyof ProviderOptions>, true>);

/**
 * Creates a provider for the Anthropic Messages API.
 *
 * With extended thinking on (the `thinking` option, or `extraBody.thinking`), the API wants the
 * thinking blocks of a turn with tool calls sent back with it. The provider gives each call the
 * blocks that came before it as its `providerData` ({@link Echo}), which the runtime keeps with
 * the conversation and hands back: a run resumed in another process, or with another provider
 * object, still sends them. Thinking is never answer text; it is progress for `timeoutMs`.
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
export function anthropic(options: AnthropicOptions): ModelProvider {
  checkProviderOptions('anthropic', options, ANTHROPIC_OPTIONS);
  const thinking = thinkingOption(options.thinking);
  // Thinking turned on through `extraBody` constrains a request as the option does.
  const thinkingOn = thinking !== undefined || thinkingIn(options.extraBody);
  const caching = promptCachingOption(options.promptCaching, options.extraBody);
  // A version in `headers` (in any case) replaces the default; the key replaces one there.
  const headers = mergeHeaders({ 'anthropic-version': ANTHROPIC_VERSION }, options.headers, options.apiKey ? { 'x-api-key': options.apiKey } : undefined);
  return postProvider({
    name: 'anthropic',
    options,
    defaultBaseURL: ANTHROPIC_DEFAULT_BASE_URL,
    // The official SDKs take the host (`https://api.anthropic.com`), the Vercel AI SDK the
    // host and `/v1`: both reach `/v1/messages`, not a 404 at `/v1/v1/messages`.
    path: /\/v1\/*(?:[?#]|$)/.test(options.baseURL ?? '') ? 'messages' : 'v1/messages',
    headers,
    toWire: (model, request, streaming) => toWireRequest(model, request, streaming, thinking, thinkingOn, caching),
    parse: async function* (ctx, response, streaming) {
      // A server that ignores `stream` (or answers an error as plain JSON with status 200)
      // sends one JSON body: read as events it would be an empty stream, its message lost.
      if (streaming && !repliesWithJson(response)) yield* parseStream(ctx, readSse(ctx, response));
      else yield* parseMessage(ctx, await readJson(ctx, response));
    },
  });
}

/** Whether `extraBody` turns thinking on (`thinking: { type: 'enabled' | 'adaptive', … }`). */
function thinkingIn(extraBody: Record<string, unknown> | undefined): boolean {
  const thinking = loose(extraBody?.thinking);
  return thinking !== undefined && thinking.type !== 'disabled';
}

/** What the `thinking` option asks of every request. */
type Thinking = { type: 'enabled'; budgetTokens: number } | { type: 'adaptive'; effort?: AnthropicEffort };

/** The `thinking` option, checked (`null` is not given, as elsewhere). */
function thinkingOption(value: unknown): Thinking | undefined {
  if (value == null) return undefined;
  if (!isRecord(value)) {
    throw optionError('anthropic', 'thinking', `{ budgetTokens } (a whole number of tokens, at least ${MIN_THINKING_BUDGET}) or { type: 'adaptive' }`, value);
  }
  if (value.type == null) {
    const budget = value.budgetTokens;
    if (Number.isSafeInteger(budget) && (budget as number) >= MIN_THINKING_BUDGET) return { type: 'enabled', budgetTokens: budget as number };
    throw optionError('anthropic', 'thinking.budgetTokens', `a whole number of tokens, at least ${MIN_THINKING_BUDGET} (as in { budgetTokens: 4096 })`, budget);
  }
  if (value.type !== 'adaptive') throw optionError('anthropic', 'thinking.type', `'adaptive' (or left out, with budgetTokens)`, value.type);
  // Anything beside the effort (a budget given out of habit) would not be sent: refused instead.
  for (const key of Object.keys(value)) {
    if (key !== 'type' && key !== 'effort') throw optionError('anthropic', `thinking.${key}`, `left out: adaptive thinking takes \`effort\` only`, value[key]);
  }
  const { effort } = value;
  if (effort == null) return { type: 'adaptive' };
  if (!EFFORTS.includes(effort as AnthropicEffort)) throw optionError('anthropic', 'thinking.effort', `one of ${EFFORTS.map((e) => `'${e}'`).join(', ')}`, effort);
  return { type: 'adaptive', effort: effort as AnthropicEffort };
}

/** A breakpoint's `cache_control`, as the API takes it. */
interface CacheControl {
  type: 'ephemeral';
  ttl?: AnthropicPromptCaching['ttl'];
}

/** What the `promptCaching` option asks of every request. */
interface Caching {
  control: CacheControl;
  /** Breakpoints this provider may mark: the API's four less those `extraBody` sends. */
  budget: number;
  /** Body fields `extraBody` replaces: a breakpoint marked in them would never be sent. */
  replaced: ReadonlySet<string>;
}

/** The `promptCaching` option, checked (`null` is not given, as elsewhere), with what
 *  `extraBody` leaves of the four breakpoints. */
function promptCachingOption(value: unknown, extraBody: Record<string, unknown> | undefined): Caching | undefined {
  if (value == null || value === false) return undefined;
  const control: CacheControl = { type: 'ephemeral' };
  if (isRecord(value)) {
    // Anything beside the lifetime would not be sent: refused instead.
    for (const key of Object.keys(value)) {
      if (key !== 'ttl') throw optionError('anthropic', `promptCaching.${key}`, 'left out: promptCaching takes `ttl` only', value[key]);
    }
    if (value.ttl != null) {
      if (!(CACHE_TTLS as readonly unknown[]).includes(value.ttl)) throw optionError('anthropic', 'promptCaching.ttl', `one of ${CACHE_TTLS.map((t) => `'${t}'`).join(', ')}`, value.ttl);
      control.ttl = value.ttl as CacheControl['ttl'];
    }
  } else if (value !== true) {
    throw optionError('anthropic', 'promptCaching', `true, false or { ttl: '5m' | '1h' }`, value);
  }
  const budget = Math.max(0, MAX_BREAKPOINTS - breakpointsIn(extraBody));
  return { control, budget, replaced: new Set(Object.keys(extraBody ?? {})) };
}

/** How many `cache_control` fields `value` holds, at any depth, as its JSON would (an object
 *  met twice counts twice; a cycle, which JSON cannot hold, ends the walk there): what
 *  `extraBody` sends counts against the API's four as much as this provider's own. A top-level
 *  one (automatic caching) counts too: the API places it on a block of its choosing. */
function breakpointsIn(value: unknown, within = new Set<object>()): number {
  if (typeof value !== 'object' || value === null || within.has(value)) return 0;
  within.add(value);
  let count = 0;
  for (const [key, field] of Object.entries(value)) count += key === 'cache_control' ? (field == null ? 0 : 1) : breakpointsIn(field, within);
  within.delete(value);
  return count;
}

// ---------------------------------------------------------------------------------------------
// Request mapping

/** A thinking block as the API sent it, to go back unchanged: its text and its `signature`,
 *  or a `redacted_thinking` block's encrypted `data`. */
type ThinkingBlock = { type: 'thinking'; thinking: string; signature?: string } | { type: 'redacted_thinking'; data: string };

/** A tool call's `providerData` from this provider: the thinking blocks the answer gave since
 *  the call before it (the first call: since the answer's start), in the order they came. */
interface Echo {
  thinking: ThinkingBlock[];
}

type WireBlock =
  | ThinkingBlock
  | { type: 'text'; text: string; cache_control?: CacheControl }
  | { type: 'tool_use'; id: string; name: string; input: unknown; cache_control?: CacheControl }
  | { type: 'tool_result'; tool_use_id: string; content: string; is_error?: true; cache_control?: CacheControl };

interface WireTool {
  name: string;
  description: string;
  input_schema: Record<string, unknown>;
  cache_control?: CacheControl;
}

interface WireMessage {
  role: 'user' | 'assistant';
  content: string | WireBlock[];
}

function toWireRequest(
  model: string,
  request: ModelRequest,
  streaming: boolean,
  thinking: Thinking | undefined,
  thinkingOn: boolean,
  caching: Caching | undefined,
): Record<string, unknown> {
  const system: string[] = [];
  const messages: WireMessage[] = [];
  const ids = new WireIds();
  for (const message of request.messages) {
    if (message.role === 'system') {
      // The Messages API has no system role; instructions live in the top-level `system`.
      system.push(message.content);
      continue;
    }
    if (message.role === 'tool') {
      // `is_error` tells the model the call failed, as the API documents (the error is the content).
      const block: WireBlock = { type: 'tool_result', tool_use_id: ids.ofResult(message.toolCallId), content: message.content, ...(message.isError ? { is_error: true } : {}) };
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
    messages.push(toWireMessage(message, ids));
  }

  const maxTokens = request.maxTokens ?? ANTHROPIC_DEFAULT_MAX_TOKENS;
  const body: Record<string, unknown> = {
    model,
    // Thinking counts against `max_tokens`, which must exceed a budget: the request's limit is
    // kept for the answer, as the Vercel AI SDK does. Adaptive thinking has no budget to add;
    // `max_tokens` bounds thinking and answer together there.
    max_tokens: thinking?.type === 'enabled' ? maxTokens + thinking.budgetTokens : maxTokens,
    messages,
  };
  if (thinking?.type === 'enabled') body.thinking = { type: 'enabled', budget_tokens: thinking.budgetTokens };
  if (thinking?.type === 'adaptive') {
    body.thinking = { type: 'adaptive' };
    if (thinking.effort !== undefined) body.output_config = { effort: thinking.effort };
  }
  const systemText = system.join('\n\n');
  // Only a block can carry `cache_control`; an empty one would be refused.
  const systemBlocks: Extract<WireBlock, { type: 'text' }>[] | undefined = caching && systemText.trim() ? [{ type: 'text', text: systemText }] : undefined;
  if (system.length > 0) body.system = systemBlocks ?? systemText;
  const choice = request.toolChoice;
  // With thinking on the API refuses a choice that forces a call ("Thinking may not be enabled
  // when tool_choice forces tool use"): a named tool is then the only one offered and a
  // required call is asked for as `auto`, as the `ollama` provider maps them.
  const named = thinkingOn && typeof choice === 'object' ? request.tools.filter((tool) => tool.name === choice.tool) : [];
  const offered = named.length > 0 ? named : request.tools;
  const tools: WireTool[] = offered.map((tool) => ({
    name: tool.name,
    description: tool.description,
    input_schema: tool.inputSchema,
  }));
  if (caching) markBreakpoints(caching, request, tools, systemBlocks, messages);
  if (request.tools.length > 0) {
    body.tools = tools;
    if (choice !== undefined) {
      if (thinkingOn) body.tool_choice = { type: choice === 'none' ? 'none' : 'auto' };
      else body.tool_choice = typeof choice === 'object' ? { type: 'tool', name: choice.tool } : { type: choice === 'required' ? 'any' : choice };
    }
  }
  // "Thinking isn't compatible with temperature or top_k modifications" (extended thinking,
  // feature compatibility): a temperature other than 1 is refused with 400, adaptive or not.
  if (request.temperature !== undefined && !thinkingOn) body.temperature = request.temperature;
  if (streaming) body.stream = true;
  return body;
}

/**
 * Marks the request's cache breakpoints, at most the four the API takes (fewer when `extraBody`
 * sends some), in the order they matter to an agent loop, which sends the same tools and
 * instructions with every turn and each turn's conversation again with a little more:
 *
 * 1. The end of the conversation (the last block of its last message): the next turn's request
 *    starts with all of this one, and reads it from the cache up to here.
 * 2. The system prompt, after the tools: a new run of the agent, or another agent with the same
 *    tools and instructions, reads them from the cache before its conversation differs.
 * 3. The last tool definition: what stays when only the instructions change.
 * 4. The end of the message before the last assistant turn, where the previous turn's request
 *    put its breakpoint 1: "The automatic prefix checking only looks back approximately 20
 *    content blocks from each explicit breakpoint", and a turn with ten parallel calls adds
 *    more (its `tool_use` and `tool_result` blocks), after which breakpoint 1 alone would find
 *    nothing and write the whole conversation again.
 *
 * Breakpoints cost nothing in themselves; writing a prefix to the cache costs 1.25 times its
 * input price (twice with a 1-hour `ttl`), reading it a tenth. So a request that no turn will
 * continue, one with no tools and no assistant turn yet (the forge judge's and the promotion
 * panel's are such), marks its system prompt only: a conversation breakpoint there would write
 * the whole prompt at a premium for no read.
 */
function markBreakpoints(caching: Caching, request: ModelRequest, tools: WireTool[], systemBlocks: Extract<WireBlock, { type: 'text' }>[] | undefined, messages: WireMessage[]): void {
  const { control, replaced } = caching;
  const continued = request.tools.length > 0 || messages.some((m) => m.role === 'assistant');
  let lastAssistant = messages.length - 1;
  while (lastAssistant >= 0 && messages[lastAssistant]!.role !== 'assistant') lastAssistant--;
  const marks: Array<() => boolean> = [];
  if (continued && !replaced.has('messages')) marks.push(() => markConversationEnd(messages, messages.length - 1, control));
  if (systemBlocks && !replaced.has('system')) marks.push(() => mark(systemBlocks.at(-1)!, control));
  if (tools.length > 0 && !replaced.has('tools')) marks.push(() => mark(tools.at(-1)!, control));
  if (continued && lastAssistant > 0 && !replaced.has('messages')) marks.push(() => markConversationEnd(messages, lastAssistant - 1, control));
  let left = caching.budget;
  for (const next of marks) {
    if (left === 0) break;
    if (next()) left--;
  }
}

/** Puts `control` on `target`; false when it carries one already (two breakpoints that fall on
 *  one block are one). */
function mark(target: { cache_control?: CacheControl }, control: CacheControl): boolean {
  if (target.cache_control) return false;
  target.cache_control = { ...control };
  return true;
}

/**
 * Marks the last block, up to message `from`, that can carry `cache_control`. "Thinking blocks
 * cannot be cached directly with `cache_control`" and "Empty text blocks cannot be cached" (the
 * API refuses a whitespace-only one anyway): a breakpoint is then put on the block before, which
 * caches a prefix a little shorter. A message's string content becomes one text block to carry
 * it, which the API reads as the same content ("shorthand for an array of one content block of
 * type "text"", Messages API), so the cached prefix matches the next request's, where it is a
 * string again. False when nothing up to there can carry one, or the block found already does.
 */
function markConversationEnd(messages: WireMessage[], from: number, control: CacheControl): boolean {
  for (let m = from; m >= 0; m--) {
    const message = messages[m]!;
    if (typeof message.content === 'string') {
      if (!message.content.trim()) continue;
      message.content = [{ type: 'text', text: message.content, cache_control: { ...control } }];
      return true;
    }
    for (let b = message.content.length - 1; b >= 0; b--) {
      const block = message.content[b]!;
      if (isThinkingType(block.type) || (block.type === 'text' && !block.text.trim())) continue;
      return mark(block as { cache_control?: CacheControl }, control);
    }
  }
  return false;
}

function toWireMessage(message: Extract<ChatMessage, { role: 'user' | 'assistant' }>, ids: WireIds): WireMessage {
  // Thinking of a turn without tool calls is not kept. "Preserving thinking blocks" (extended
  // thinking docs): during tool use the blocks must come back complete and unmodified, but "you
  // can omit thinking and redacted_thinking blocks from prior assistant role turns" (which the
  // API leaves out of the context anyway; models from Opus 4.5 on would keep what is sent).
  if (message.role === 'user' || !message.toolCalls?.length) return { role: message.role, content: message.content };
  const [first, ...rest] = message.toolCalls;
  // With thinking on, the API wants an assistant turn with tool calls to start with its
  // thinking ("a final assistant message must start with a thinking block"), and each run of
  // consecutive thinking blocks as the model gave it: the first call's blocks come before the
  // text, every other call's right before its own tool_use.
  const blocks: WireBlock[] = [...echoedThinking(first!)];
  // The API rejects empty (and whitespace-only) text blocks.
  if (message.content.trim()) blocks.push({ type: 'text', text: message.content });
  blocks.push(toolUse(first!, ids));
  for (const call of rest) blocks.push(...echoedThinking(call), toolUse(call, ids));
  return { role: 'assistant', content: blocks };
}

function toolUse(call: ToolCall, ids: WireIds): WireBlock {
  return { type: 'tool_use', id: ids.ofCall(call.id), name: call.name, input: argumentsObject(call.arguments) };
}

/**
 * The ids the tool calls of one request go by. The API takes `^[a-zA-Z0-9_-]+$`, unique in the
 * request, and a conversation begun on another provider can hold neither (Kimi-K2's
 * `functions.get_weather:0`, or servers that number calls per answer: `call_0` every turn).
 * Other characters become `_`, and an id used before in the request gets a suffix; a result
 * goes by the id of its call, the latest one given that id (results follow their calls).
 * Anthropic's own ids pass unchanged, so a cached prefix stays the same from turn to turn.
 */
class WireIds {
  readonly #used = new Set<string>();
  readonly #latest = new Map<string, string>();

  ofCall(id: string): string {
    const base = id.replace(/[^a-zA-Z0-9_-]/g, '_') || 'call';
    let wire = base;
    for (let n = 2; this.#used.has(wire); n++) wire = `${base}_${n}`;
    this.#used.add(wire);
    this.#latest.set(id, wire);
    return wire;
  }

  ofResult(id: string): string {
    return this.#latest.get(id) ?? (id.replace(/[^a-zA-Z0-9_-]/g, '_') || 'call');
  }
}

/** The thinking blocks a call's `providerData` holds ({@link Echo}), or none when it holds
 *  something else: what another provider gave (after a switch of providers) or an edited state.
 *  A block changed or made up would be refused by the API with the whole request; none at all
 *  is what a turn without thinking sends. */
function echoedThinking(call: ToolCall): ThinkingBlock[] {
  const echo = loose(call.providerData);
  if (!echo || !Array.isArray(echo.thinking)) return [];
  const blocks: ThinkingBlock[] = [];
  for (const entry of echo.thinking as unknown[]) {
    const block = loose(entry);
    if (block?.type === 'thinking' && typeof block.thinking === 'string' && (block.signature === undefined || typeof block.signature === 'string')) {
      blocks.push({ type: 'thinking', thinking: block.thinking, ...(block.signature !== undefined && { signature: block.signature }) });
    } else if (block?.type === 'redacted_thinking' && typeof block.data === 'string') {
      blocks.push({ type: 'redacted_thinking', data: block.data });
    } else {
      return [];
    }
  }
  return blocks;
}

// ---------------------------------------------------------------------------------------------
// Response mapping

async function* parseStream(ctx: HttpContext, events: AsyncIterable<EventSourceMessage>): AsyncGenerator<ModelChunk> {
  let inputTokens: number | undefined;
  let outputTokens: number | undefined;
  let stopReason: string | undefined;
  // Content blocks are numbered across every type; tool calls are numbered on their own.
  const callByBlock = new Map<number, number>();
  // Every block started but text blocks. Server tools (`server_tool_use`, `mcp_tool_use`) stream
  // their input as a client call does, but the API runs them itself, within this answer: their
  // input is no call of ours, and a delta for one is read past rather than taken for garbage.
  const startedBlocks = new Set<number>();
  const thinking = new TurnThinking(ctx);
  // A tool_use block's `input` as it came at its start, until a delta says the input streams:
  // the API sends `{}` there and streams the input, but proxies send it whole and stream none.
  // Given at the block's stop, or when another block starts (a block is whole by then): a
  // server that stops no block holds one block's input here, not every one's.
  const inputAtStart = new Map<number, string>();
  const flushInputAtStart = function* (block: number): Generator<ModelChunk> {
    const input = inputAtStart.get(block);
    inputAtStart.delete(block);
    const index = callByBlock.get(block);
    if (input !== undefined && index !== undefined) yield { type: 'tool_call', index, argumentsDelta: input };
  };

  for await (const message of events) {
    const event = expectObject(ctx, parseJson(ctx, message.data), message.data);
    const read = new WireReader(ctx, message.data);
    const type = typeof event.type === 'string' ? event.type : message.event;
    switch (type) {
      case 'message_start': {
        const usage = read.object(read.object(event.message, 'message')?.usage, 'message.usage');
        inputTokens = promptTokens(read, usage) ?? inputTokens;
        outputTokens = read.count(usage?.output_tokens) ?? outputTokens;
        break;
      }
      case 'content_block_start': {
        for (const held of [...inputAtStart.keys()]) yield* flushInputAtStart(held);
        const block = read.object(event.content_block, 'content_block');
        const blockType = read.string(block?.type, 'content_block.type');
        const text = read.string(block?.text, 'content_block.text');
        // A text block's deltas are taken whatever their index: it is not read, so one a server
        // gets wrong fails nothing.
        const started = blockType === 'text' ? undefined : read.index(event.index, 'index');
        if (started !== undefined) startedBlocks.add(started);
        if (blockType === 'text' && text) yield { type: 'text', delta: text };
        if (block && isThinkingType(blockType)) thinking.start(read, started, block, 'content_block');
        if (block && blockType === 'tool_use') {
          const index = callByBlock.size;
          const blockIndex = started ?? index;
          callByBlock.set(blockIndex, index);
          const input = loose(block.input);
          if (input && Object.keys(input).length > 0) inputAtStart.set(blockIndex, JSON.stringify(input));
          yield thinking.withCall(toolUseChunk(read, block, index, ''));
        }
        break;
      }
      case 'content_block_stop': {
        const block = read.index(event.index, 'index');
        if (block !== undefined) yield* flushInputAtStart(block);
        break;
      }
      case 'content_block_delta': {
        const delta = read.object(event.delta, 'delta');
        const deltaType = read.string(delta?.type, 'delta.type');
        const text = read.string(delta?.text, 'delta.text');
        const json = read.string(delta?.partial_json, 'delta.partial_json');
        if (deltaType === 'text_delta' && text) yield { type: 'text', delta: text };
        if ((deltaType === 'thinking_delta' || deltaType === 'signature_delta') && delta) {
          const block = read.index(event.index, 'index');
          if (!thinking.delta(read, block, delta)) throw protocolError(ctx, `${deltaType} for unknown block ${String(block)}`, undefined, message.data);
        }
        if (deltaType === 'input_json_delta' && json) {
          const block = read.index(event.index, 'index');
          const index = block === undefined ? undefined : callByBlock.get(block);
          if (index !== undefined) {
            inputAtStart.delete(block!);
            yield { type: 'tool_call', index, argumentsDelta: json };
          } else if (block === undefined || !startedBlocks.has(block)) {
            throw protocolError(ctx, `input_json_delta for unknown block ${String(block)}`, undefined, message.data);
          }
        }
        break;
      }
      case 'message_delta': {
        stopReason = read.string(read.object(event.delta, 'delta')?.stop_reason, 'delta.stop_reason') ?? stopReason;
        const usage = loose(event.usage);
        outputTokens = read.count(usage?.output_tokens) ?? outputTokens;
        // Newer API versions also report final input tokens here; a 0 would mean "unknown", and
        // a proxy that leaves out the cache counts here must not shrink the total.
        inputTokens = Math.max(promptTokens(read, usage) ?? 0, inputTokens ?? 0) || inputTokens;
        break;
      }
      case 'message_stop':
        for (const block of [...inputAtStart.keys()]) yield* flushInputAtStart(block);
        yield finishChunk(stopReason, inputTokens, outputTokens);
        return;
      case 'error':
        throw errorEvent(ctx, event, message.data);
      default:
        // `ping` and event types added after this mapping was written carry nothing we need.
        break;
    }
  }
  throw protocolError(ctx, 'stream ended before `message_stop`');
}

async function* parseMessage(ctx: HttpContext, json: unknown): AsyncGenerator<ModelChunk> {
  // Quoted only by an error: made then, not for every reply.
  const raw = lazyText(json);
  const message = expectObject(ctx, json, raw);
  const read = new WireReader(ctx, raw);
  if (message.type === 'error') throw errorEvent(ctx, message, raw(), false);
  if (!Array.isArray(message.content)) throw protocolError(ctx, 'message has no `content` array', undefined, raw());
  let index = 0;
  const thinking = new TurnThinking(ctx);
  for (const [position, entry] of message.content.entries()) {
    const block = read.object(entry, `content[${position}]`);
    const blockType = read.string(block?.type, 'content[].type');
    const text = read.string(block?.text, 'content[].text');
    if (blockType === 'text' && text) yield { type: 'text', delta: text };
    if (block && isThinkingType(blockType)) thinking.start(read, undefined, block, 'content[]');
    if (block && blockType === 'tool_use') yield thinking.withCall(toolUseChunk(read, block, index++, JSON.stringify(block.input ?? {})));
  }
  const usage = loose(message.usage);
  yield finishChunk(read.string(message.stop_reason, 'stop_reason'), promptTokens(read, usage), read.count(usage?.output_tokens));
}

function isThinkingType(blockType: string | undefined): blockType is ThinkingBlock['type'] {
  return blockType === 'thinking' || blockType === 'redacted_thinking';
}

/**
 * The thinking blocks of one answer, streamed or whole, gathered for the tool calls they come
 * before. A block is whole before the next one starts (a `thinking` block's text comes in
 * `thinking_delta`s, its signature in one `signature_delta` just before its stop; a
 * `redacted_thinking` block's `data` comes whole at its start), so a call's blocks are all known
 * at its own start and go as the `providerData` of its first piece. Interleaved thinking (a beta
 * for Claude 4 models) puts blocks between calls: each call takes those since the call before.
 * Blocks after the last call, or in an answer without calls, are not kept (see `toWireMessage`),
 * but they are gathered, and counted with the rest ({@link ProviderDataBudget}), until it is
 * known whether a call follows: thinking past the core's bound fails the answer when a call
 * that needs it starts, and only then.
 */
class TurnThinking {
  /** Blocks since the last call, in order. */
  private pending: ThinkingBlock[] = [];
  /** The `thinking` blocks being streamed, by content block index. */
  private readonly streaming = new Map<number, Extract<ThinkingBlock, { type: 'thinking' }>>();
  private readonly budget: ProviderDataBudget;

  constructor(ctx: HttpContext) {
    this.budget = new ProviderDataBudget(ctx);
  }

  start(read: WireReader, blockIndex: number | undefined, wire: WireObject, where: string): void {
    if (wire.type === 'redacted_thinking') {
      this.keep({ type: 'redacted_thinking', data: read.string(wire.data, `${where}.data`) ?? '' });
      return;
    }
    const block: ThinkingBlock = { type: 'thinking', thinking: read.string(wire.thinking, `${where}.thinking`) ?? '' };
    const signature = read.string(wire.signature, `${where}.signature`);
    if (signature !== undefined) block.signature = signature;
    this.keep(block);
    if (blockIndex !== undefined) this.streaming.set(blockIndex, block);
  }

  /** Adds a `thinking_delta` or `signature_delta` to its block; false when no thinking block
   *  has that index. */
  delta(read: WireReader, blockIndex: number | undefined, delta: WireObject): boolean {
    const block = blockIndex === undefined ? undefined : this.streaming.get(blockIndex);
    if (!block) return false;
    if (delta.type === 'thinking_delta') {
      const text = read.string(delta.thinking, 'delta.thinking') ?? '';
      if (this.budget.add(appendedBytes(text), 'thinking blocks')) block.thinking += text;
    }
    // The signature comes whole: one that came with the block's start (as a proxy may send it)
    // is replaced, not extended.
    else {
      const signature = read.string(delta.signature, 'delta.signature');
      if (signature !== undefined && this.budget.add(jsonBytes(signature) - (block.signature === undefined ? 0 : jsonBytes(block.signature)), 'thinking blocks')) {
        block.signature = signature;
      }
    }
    return true;
  }

  private keep(block: ThinkingBlock): void {
    if (this.budget.add(jsonBytes(block), 'thinking blocks')) this.pending.push(block);
  }

  /** `chunk`, the first piece of a call, with the blocks since the call before as its
   *  `providerData`; copies, which no later delta can change. */
  withCall(chunk: Extract<ModelChunk, { type: 'tool_call' }>): ModelChunk {
    // Thinking past the bound was not all kept, and this call would go back without it.
    this.budget.assertKept();
    if (this.pending.length === 0) return chunk;
    const echo: Echo = { thinking: this.pending.map((block) => ({ ...block })) };
    this.pending = [];
    this.streaming.clear();
    return { ...chunk, providerData: echo };
  }
}

/** The prompt's tokens: `input_tokens` counts only those after the last cache breakpoint, so
 *  tokens read from or written to the prompt cache are added (`undefined` when none is given). */
function promptTokens(read: WireReader, usage: WireObject | undefined): number | undefined {
  const counts = [usage?.input_tokens, usage?.cache_creation_input_tokens, usage?.cache_read_input_tokens].map((n) => read.count(n));
  return counts.every((n) => n === undefined) ? undefined : counts.reduce<number>((sum, n) => sum + (n ?? 0), 0);
}

function toolUseChunk(read: WireReader, block: WireObject, index: number, argumentsDelta: string): Extract<ModelChunk, { type: 'tool_call' }> {
  const chunk: Extract<ModelChunk, { type: 'tool_call' }> = { type: 'tool_call', index, argumentsDelta };
  const id = read.string(block.id, 'content_block.id');
  const name = read.string(block.name, 'content_block.name');
  if (id) chunk.id = id;
  if (name) chunk.name = name;
  return chunk;
}

/** An `error` event, or a whole-body error (`retryable` only decided by its type when streamed). */
function errorEvent(ctx: HttpContext, event: WireObject, raw: string, streamed = true) {
  const error = loose(event.error) ?? {};
  const errorType = typeof error.type === 'string' ? error.type : 'error';
  const detail = typeof error.message === 'string' ? error.message : '';
  return streamedError(ctx, `${errorType}: ${detail}`, {
    status: streamed && errorType === 'overloaded_error' ? 529 : undefined,
    retryable: streamed && /overloaded_error|api_error|rate_limit_error/.test(errorType),
    body: raw,
  });
}

function finishChunk(stopReason: string | undefined, inputTokens?: number, outputTokens?: number): ModelChunk {
  const finishReason = stopReason ?? 'end_turn';
  if (inputTokens === undefined && outputTokens === undefined) return { type: 'finish', finishReason };
  const usage: Usage = { inputTokens: inputTokens ?? 0, outputTokens: outputTokens ?? 0 };
  return { type: 'finish', finishReason, usage };
}
