/**
 * What a provider keeps of one answer to give the core as its tool calls' `providerData`
 * (DeepSeek's `reasoning_content`, OpenRouter's `reasoning_details`, Gemini's signatures,
 * Anthropic's thinking blocks, Ollama's `thinking`), counted as it is gathered against the
 * bound the core puts on it. The core sees that data only when the provider gives it, with a
 * call's first piece or once the answer ended; until then only this count stands between a
 * server that streams reasoning without end and the page's memory (the stall timeout does not:
 * reasoning is progress).
 *
 * @module
 */

import { protocolError, type HttpContext } from './http.js';

/**
 * Most bytes of JSON the `providerData` of one response's tool calls may hold together: the
 * core's `MAX_PROVIDER_DATA_BYTES` (`src/model/assemble.rs`), which fails a response past it as
 * `provider_protocol`. The tests hold the core to this number.
 */
export const MAX_PROVIDER_DATA_BYTES = 512 * 1024;

/**
 * The most bytes of reasoning one answer may stream, kept or not: the core's
 * `MAX_RESPONSE_BYTES` (`src/model/assemble.rs`), its bound on an answer's text and arguments.
 * Reasoning is progress for the stall timeout, so without this a server could stream it for
 * ever.
 */
export const MAX_STREAMED_REASONING_BYTES = 8 * 1024 * 1024;

/**
 * The bytes one answer's kept data would take as JSON, counted as the core counts them (UTF-8,
 * escaped as `JSON.stringify` and serde_json escape), less the keys and brackets a provider
 * wraps them in: never more than the core will count, so a response the core would keep is
 * never refused here. Past {@link MAX_PROVIDER_DATA_BYTES} nothing more is kept, and the answer
 * fails as soon as a tool call needs what was not ({@link ProviderDataBudget.assertKept}), as the
 * core would fail it once given the data, but before the rest of it streams in. An answer with
 * no call to give it to (a final answer that thought at length) loses only what nobody sends
 * back. Past {@link MAX_STREAMED_REASONING_BYTES}, kept or not, the answer fails at once.
 */
export class ProviderDataBudget {
  #kept = 0;
  #streamed = 0;
  /** The field that took the kept data past the bound, once one did. */
  #over: string | undefined;

  constructor(private readonly ctx: HttpContext) {}

  /**
   * Counts `bytes` more for `what`, the field that grew (fewer, when negative: a value replaced
   * by a shorter one). True when the caller may keep them; false once the answer's kept data is
   * past the bound, from then on. A `provider_protocol` error once the answer streamed more
   * than {@link MAX_STREAMED_REASONING_BYTES} in all.
   */
  add(bytes: number, what: string): boolean {
    this.#streamed += Math.max(bytes, 0);
    if (this.#streamed > MAX_STREAMED_REASONING_BYTES) {
      throw protocolError(this.ctx, `the model's response streamed more than ${MAX_STREAMED_REASONING_BYTES} bytes of reasoning`);
    }
    if (this.#over !== undefined) return false;
    this.#kept += bytes;
    if (this.#kept <= MAX_PROVIDER_DATA_BYTES) return true;
    this.#over = what;
    return false;
  }

  /** A `provider_protocol` error when a tool call needs the answer's data and not all of it
   *  could be kept. */
  assertKept(): void {
    if (this.#over !== undefined) {
      throw protocolError(this.ctx, `${this.#over} took the model's response past ${MAX_PROVIDER_DATA_BYTES} bytes of provider data to send back; at most ${MAX_PROVIDER_DATA_BYTES} are kept`);
    }
  }
}

/** The bytes of `value`'s JSON text in UTF-8. */
export function jsonBytes(value: unknown): number {
  return utf8Bytes(JSON.stringify(value) ?? '');
}

/** The bytes `text` adds inside a JSON string already counted: a piece appended to it. */
export function appendedBytes(text: string): number {
  return jsonBytes(text) - 2;
}

/** UTF-8 length of a string `JSON.stringify` made (its lone surrogates escaped already). */
function utf8Bytes(text: string): number {
  let bytes = text.length;
  for (let i = 0; i < text.length; i++) {
    const code = text.charCodeAt(i);
    if (code < 0x80) continue;
    if (code < 0x800) bytes += 1;
    // A surrogate pair: two UTF-16 units, four bytes.
    else if (code >= 0xd800 && code <= 0xdbff) {
      bytes += 2;
      i++;
    } else bytes += 2;
  }
  return bytes;
}
