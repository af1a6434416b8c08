/**
 * Model providers over `fetch`: OpenAI-compatible Chat Completions, Anthropic Messages and
 * Ollama's native chat API. Each factory returns a `ModelProvider` whose `id` is
 * `"<provider>:<model>"` and whose failures are `ProviderError` or `AbortError`.
 *
 * @module
 */

export { openai, OPENAI_DEFAULT_BASE_URL } from './openai.js';
export { anthropic, ANTHROPIC_DEFAULT_BASE_URL, ANTHROPIC_DEFAULT_MAX_TOKENS, ANTHROPIC_VERSION } from './anthropic.js';
export { ollama, OLLAMA_DEFAULT_BASE_URL } from './ollama.js';
export type {
  ChatMessage,
  ModelCallOptions,
  ModelChunk,
  ModelProvider,
  ModelRequest,
  ProviderOptions,
  OpenAIOptions,
  AnthropicOptions,
  OllamaOptions,
  RetryOptions,
  ToolCall,
  ResponseFormat,
  ToolChoice,
  ToolDefinition,
  Usage,
} from './types.js';
