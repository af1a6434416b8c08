/**
 * The provider boundary: what the agent core asks of a model, and the chunks a provider
 * streams back. Providers do the HTTP; the core assembles tool calls from the chunks.
 * These shapes mirror `src/model/` in the Rust core (camelCase on the wire).
 */

/** Token counts reported by the provider for one model call. */
export interface Usage {
  inputTokens: number;
  outputTokens: number;
}

/** A tool call as the model produced it. `arguments` is the raw JSON text. */
export interface ToolCall {
  id: string;
  name: string;
  arguments: string;
  /**
   * What the provider that produced the call gave with it to be sent back when the
   * conversation goes to the model again (see {@link ModelChunk}): opaque to the runtime, which
   * stores it with the conversation (durable run state, session history) and hands it back
   * here, so it survives a restart. Absent when the provider gave none.
   */
  providerData?: unknown;
}

/** Provider-neutral chat message. */
export type ChatMessage =
  | { role: 'system'; content: string }
  | { role: 'user'; content: string }
  | { role: 'assistant'; content: string; toolCalls?: ToolCall[] }
  | { role: 'tool'; toolCallId: string; name: string; content: string; /** The call failed; `content` is its error. */ isError?: boolean };

/** A tool the model may call. `inputSchema` is JSON Schema. */
export interface ToolDefinition {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
}

/** One model call. */
export interface ModelRequest {
  messages: ChatMessage[];
  tools: ToolDefinition[];
  temperature?: number;
  maxTokens?: number;
  /** Ask for a JSON answer, optionally matching a schema (see {@link ResponseFormat}). */
  responseFormat?: ResponseFormat;
  /** Whether the model may, must or must not call a tool this turn (absent: `auto`). */
  toolChoice?: ToolChoice;
}

/**
 * The answer format a request asks for. `'json'`: any JSON object (OpenAI-compatible
 * `response_format` `json_schema` with an open object schema, Ollama `format: "json"`).
 * `{ jsonSchema }`: a JSON object matching `schema` (OpenAI-compatible `json_schema` with that
 * schema, Ollama `format: schema`); the core's judge asks for its verdict this way, so servers
 * that constrain decoding (llama.cpp's among them) cannot return a verdict with a missing or
 * mistyped key. The `anthropic` provider does not send it (the Messages API's own structured
 * outputs, `output_config.format`, are not used yet); there the prompt carries the format. OpenAI's
 * own API holds to the schema only in strict mode, which is not asked for.
 */
export type ResponseFormat = 'json' | { jsonSchema: { name: string; schema: Record<string, unknown> } };

/**
 * Whether a model call may (`auto`), must (`required`, or `{ tool }` for one tool) or must not
 * (`none`) call a tool. OpenAI-compatible servers get `tool_choice` (llama.cpp's server turns
 * `required` and a named tool into a grammar over the argument schemas, so small models write
 * complete calls); Anthropic gets `tool_choice` `auto`/`any`/`tool`/`none`. Ollama's API has no
 * such field: `none` sends no tools and `{ tool }` sends only that tool, but a call cannot be
 * forced there (`required` is not enforced).
 */
export type ToolChoice = 'auto' | 'required' | 'none' | { tool: string };

/**
 * A streamed piece of the model's answer.
 * - `text`: a text delta.
 * - `tool_call`: a piece of tool call number `index` (0-based within this response). The
 *   first piece of a call carries `id` and `name`; `argumentsDelta` pieces concatenate to the
 *   raw JSON arguments. A provider that receives whole calls emits one piece per call.
 *   `providerData` is one JSON value the provider needs back with the call on later turns
 *   (`openai()`: DeepSeek's `reasoning_content`, Gemini's thought signature, OpenRouter's
 *   `reasoning_details`; `ollama()`: a tool-call turn's `thinking`); the last piece of a call
 *   that has one sets the call's
 *   {@link ToolCall.providerData}, so a provider may give it in a piece of its own once the
 *   answer ended (one naming the call by `id` and no `name` reaches that call even among calls
 *   sharing an index). The runtime never reads it; it round-trips it through stored state, at
 *   most 512 KiB of JSON per response (more fails the response as `provider_protocol`). The
 *   providers here count what they gather for it as it streams: past that bound they keep no
 *   more, and fail the response as soon as a call needs what was not kept (a final answer's
 *   reasoning is dropped instead: nothing sends it back); past 8 MiB of reasoning streamed,
 *   kept or not, they fail it at once. Reasoning is progress to the stall timeout, and
 *   without end would otherwise fill memory, or hold the response open, for as long as it
 *   lasted.
 * - `finish`: the last chunk, with the finish reason and usage when the provider reports it.
 */
export type ModelChunk =
  | { type: 'text'; delta: string }
  | { type: 'tool_call'; index: number; id?: string; name?: string; argumentsDelta: string; providerData?: unknown }
  | { type: 'finish'; finishReason: string; usage?: Usage };

/** Per-call options. */
export interface ModelCallOptions {
  /** Aborting stops the in-flight fetch; the iterator then throws an `AbortError`. */
  signal?: AbortSignal;
}

/**
 * A model behind a provider. `stream` issues one HTTP request (retrying per the provider's
 * retry policy before any chunk was yielded) and yields chunks as they arrive.
 * Errors are `ProviderError` (HTTP, network, timeout, protocol) or `AbortError`.
 */
export interface ModelProvider {
  /** Stable id used for usage accounting, e.g. `openai:qwen`. */
  readonly id: string;
  stream(request: ModelRequest, options?: ModelCallOptions): AsyncIterable<ModelChunk>;
}

/** Retry policy for 408, 409, 429 and 5xx answers (or what `x-should-retry` says) and network failures. */
export interface RetryOptions {
  /** Retries after the first attempt. Default 2. */
  maxRetries?: number;
  /** First backoff in ms, doubled each retry (with jitter); `Retry-After` wins when present. Default 500. */
  initialDelayMs?: number;
  /**
   * Longest single wait between attempts. Default 8000. A `Retry-After` asking for longer is
   * not cut short (the server would refuse the early retry too): the call fails at once with
   * the `ProviderError`, whose `retryAfterMs` says when to try again.
   */
  maxDelayMs?: number;
}

/**
 * Options every fetch-based provider takes. The factories check them when called and throw a
 * `CrucibleError` with code `invalid_config` for options they cannot use (no `model`, a
 * `baseURL` that is not an absolute http(s) URL, a timeout or retry setting that is not a
 * usable number).
 */
export interface ProviderOptions {
  model: string;
  baseURL?: string;
  apiKey?: string;
  /**
   * Extra request headers. Names are compared without case: one here replaces the provider's
   * own (`content-type`, Anthropic's `anthropic-version`), except the key's header, which
   * `apiKey` sets when given. A header whose value is `undefined` or `null` is not sent.
   */
  headers?: Record<string, string | null | undefined>;
  /**
   * Longest stall in ms: until the answer starts, then between two of its pieces (events or
   * lines with data: a streamed answer may take longer in all while it makes progress, but
   * keep-alives alone do not hold it open, nor do pieces that carry nothing, such as empty
   * deltas; a reasoning model's thinking is progress). Default 120000.
   */
  timeoutMs?: number;
  retry?: RetryOptions;
  /** Use streaming (SSE / NDJSON). Default true. */
  stream?: boolean;
  /** Custom fetch (tests, proxies). Default `globalThis.fetch`. */
  fetch?: typeof globalThis.fetch;
  /**
   * Fields added to every request body, for what this provider does not map: `top_p`, `seed`,
   * Anthropic's `thinking` (or {@link AnthropicOptions.thinking}, which also fits the token
   * limit and temperature to it), vLLM's `chat_template_kwargs`, OpenRouter's `provider`. Added
   * after the provider's own fields, so one named here replaces the provider's (`model`,
   * `messages`… too: that is yours to decide).
   */
  extraBody?: Record<string, unknown>;
}

/** Options of {@link openai}: the transport's, and what reasoning models need. */
export interface OpenAIOptions extends ProviderOptions {
  /**
   * The model is a reasoning model (OpenAI's o-series and gpt-5 families). Those refuse
   * `max_tokens` and any `temperature` but the default, so their requests carry
   * `max_completion_tokens` and no temperature. Default: guessed from the model name (`o1…`,
   * `o3…`, `o4…`, `gpt-5…`); set it for deployments named otherwise (Azure).
   */
  reasoningModel?: boolean;
  /**
   * `reasoning_effort` sent with every request (OpenAI: `minimal`, `low`, `medium`, `high`).
   * A reasoning model's hidden reasoning counts against the request's token limit: a forge
   * judge on one wants a low effort, or a larger `emergent.judge.maxTokens` than its 512.
   */
  reasoningEffort?: string;
  /**
   * Ask for token counts in streamed answers (`stream_options: { include_usage: true }`).
   * Default true. Some OpenAI-compatible APIs refuse the field (Mistral, Azure AI Foundry):
   * there a refusal that names it is answered by sending the request once more without it,
   * and the provider leaves it out from then on; `false` leaves it out from the start. Without
   * it, a streamed answer has usage only when the server reports it unasked.
   */
  streamUsage?: boolean;
}

/** Options of {@link anthropic}: the transport's, and extended thinking. */
export interface AnthropicOptions extends ProviderOptions {
  /**
   * Extended thinking: the model reasons before it answers or calls a tool. Two forms, as the
   * API has them (https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking,
   * https://platform.claude.com/docs/en/build-with-claude/adaptive-thinking):
   *
   * - `{ budgetTokens }`: up to that many tokens of thinking (at least 1024, the API's minimum).
   *   Requests carry `thinking: { type: 'enabled', budget_tokens }` and a `max_tokens` of the
   *   request's own limit (or `ANTHROPIC_DEFAULT_MAX_TOKENS`, 4096) plus the budget, since the
   *   API counts thinking against `max_tokens` and wants it above the budget. Deprecated by
   *   the API on Claude Opus 4.6 and Sonnet 4.6, refused from Opus 4.7 on.
   * - `{ type: 'adaptive', effort? }`: the model decides whether and how much to think, the
   *   recommended form from Claude Opus 4.6 and Sonnet 4.6 on (older models refuse it).
   *   Requests carry `thinking: { type: 'adaptive' }` and, with `effort`, `output_config: {
   *   effort }`, which guides how many tokens the whole answer spends, thinking included
   *   (`high`, the API's default, thinks almost always; `max` and `xhigh` only some models
   *   take). There is no budget to add: `max_tokens` stays the request's limit (or 4096) and
   *   bounds thinking and answer together, so an answer that thinks long may stop at it
   *   (finish reason `max_tokens`). Give the agent, and a forge judge on such a model (it asks
   *   for 512 tokens), a larger `maxTokens`, or a lower effort.
   *
   * Either way no `temperature` is sent, which the API refuses with thinking on (the forge
   * judge asks for 0), and the API refuses a `toolChoice` that forces a call (`required`,
   * `{ tool }`). Thinking is never answer text; its blocks go back with the tool calls they
   * came with, as the API requires (see {@link anthropic}), and count toward the 512 KiB a
   * response's calls may keep (see {@link ModelChunk}). Thinking counts as progress for
   * `timeoutMs`. `extraBody.thinking` and `extraBody.output_config` replace what this sends,
   * but not the token limit or temperature. Anything else is `invalid_config`.
   */
  thinking?: AnthropicThinking;
  /**
   * Prompt caching (https://platform.claude.com/docs/en/build-with-claude/prompt-caching):
   * `true`, or `{ ttl }` to choose how long an unused entry lives (`'5m'`, the API's default,
   * or `'1h'`, whose writes cost twice the input price instead of 1.25 times). Reads of a cached
   * prefix cost a tenth of the input price, and an agent sends the same tools and instructions
   * with every turn, and each turn's conversation again with a little more. Off by default:
   * without it requests carry no `cache_control`.
   *
   * With it, a request marks up to four breakpoints (`cache_control`, the API's limit): the
   * last tool definition, the system prompt (sent as one text block), the last block of the
   * conversation's last message, so the next turn reads this one's prefix, and that of the
   * message before the last assistant turn, where the previous turn's request ended, so it is
   * read even after a turn of more than 20 blocks (the API looks back no further from a
   * breakpoint). A request with no tools and no assistant turn yet, as the forge judge's and
   * the promotion panel's are, is not expected to be continued: only its system prompt is
   * marked, since writing the rest to the cache would cost more and never be read. A prefix
   * shorter than the model's minimum (1024 to 4096 tokens) is not cached, without error.
   * `usage.inputTokens` counts cached tokens too, read or written.
   *
   * `extraBody` still wins: a `tools`, `system` or `messages` there replaces this provider's,
   * breakpoints and all, and the `cache_control` blocks it holds (a top-level `cache_control`,
   * the API's automatic caching, among them) are counted against the four, this provider
   * leaving out its own as needed (the previous turn's first, then the tools', the system
   * prompt's, the last message's). A 1-hour `ttl` needed the `anthropic-beta:
   * extended-cache-ttl-2025-04-11` header while it was in beta: a gateway that still asks for
   * it gets it through `headers`. Anything else is `invalid_config`.
   */
  promptCaching?: boolean | AnthropicPromptCaching;
}

/** {@link AnthropicOptions.promptCaching} with a lifetime for the entries it writes. */
export interface AnthropicPromptCaching {
  /** How long a cache entry lives unused (each read renews it). Left out, the API's default of
   *  5 minutes applies. */
  ttl?: '5m' | '1h';
}

/** {@link AnthropicOptions.thinking}: a thinking budget, or adaptive thinking. */
export type AnthropicThinking = { budgetTokens: number } | { type: 'adaptive'; effort?: AnthropicEffort };

/** How much an answer with adaptive thinking may spend (the API's `output_config.effort`). */
export type AnthropicEffort = 'low' | 'medium' | 'high' | 'xhigh' | 'max';

/** Options of {@link ollama}: the transport's, and Ollama's model options. */
export interface OllamaOptions extends ProviderOptions {
  /**
   * Ollama model options sent with every request (`num_ctx`, `top_k`, `seed`, …); a request's
   * own temperature and token limit win over the same keys here. Ollama's default context
   * (2,048 or 4,096 tokens, by version) silently drops the start of longer conversations, and
   * an agent's instructions and tool descriptions come first: set `num_ctx` to what the model
   * supports.
   */
  options?: Record<string, unknown>;
  /** How long Ollama keeps the model loaded after a request (`keep_alive`: `"10m"`, seconds, `-1` for ever). */
  keepAlive?: string | number;
  /**
   * Whether a thinking model (qwen3, deepseek-r1, gpt-oss…) thinks before it answers, sent as
   * the request's `think` (https://docs.ollama.com/capabilities/thinking): `true` or `false`, or
   * a level, `'low'`, `'medium'` or `'high'`, for models that take levels (gpt-oss, whose
   * default is `'medium'`). Ollama refuses `true` for a model that cannot think. Left out, no
   * `think` is sent and the model's default applies. `extraBody.think` replaces it (a level
   * another model defines goes there). Anything else is `invalid_config`.
   *
   * The model's thinking (`message.thinking`) is never answer text, and counts as progress for
   * `timeoutMs`. A tool-call turn's thinking goes back with that turn's assistant message, as
   * Ollama's docs ask, whether it came through this option or not: it travels as the calls'
   * `providerData`, within the 512 KiB a response's calls may keep (see {@link ModelChunk}).
   */
  think?: boolean | 'low' | 'medium' | 'high';
}
