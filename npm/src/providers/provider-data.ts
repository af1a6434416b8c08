/**
 * What a provider keeps of one answer to give the core as its tool calls' `providerData`
 * (DeepSeek's `reasoning_content`, OpenRouter's `reasoning_details`, Gemini's signatures,
 * Anthropic's thinking blocks), counted as it is gathered against the bound the core puts on
 * it. The core sees that data only when the provider gives it, with a call's first piece or once
 * the answer ended; until then only this count stands between a server that streams reasoning
 * without end and the page's memory (the stall timeout does not: reasoning is progress).
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
 * The bytes one answer's kept data would take as JSON, counted as the core counts them (UTF-8,
 * escaped as `JSON.stringify` and serde_json escape), less the keys and brackets a provider
 * wraps them in: never more than the core will count, so a response the core would keep is
 * never refused here. Past {@link MAX_PROVIDER_DATA_BYTES} the answer fails at once, as the
 * core would fail it once given the data, but before the rest of it streams in.
 */
export class ProviderDataBudget {
  #bytes = 0;

  constructor(private readonly ctx: HttpContext) {}

  /** Counts `bytes` more (fewer, when negative: a value replaced by a shorter one) kept for
   *  `what`, the field that grew; a `provider_protocol` error once past the bound. */
  add(bytes: number, what: string): void {
    this.#bytes += bytes;
    if (this.#bytes > MAX_PROVIDER_DATA_BYTES) {
      throw protocolError(this.ctx, `${what} took the model's response past ${MAX_PROVIDER_DATA_BYTES} bytes of provider data to send back; at most ${MAX_PROVIDER_DATA_BYTES} are kept`);
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
