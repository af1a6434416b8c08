// What the Anthropic Messages API test doubles (anthropic-thinking, anthropic-caching) read
// from a request body alike.

/** How many tool results the conversation of a Messages API request holds so far. */
export function toolResultsSoFar(body: { messages: Array<{ content: string | Array<{ type: string }> }> }): number {
  return body.messages.flatMap((m) => (typeof m.content === 'string' ? [] : m.content)).filter((b) => b.type === 'tool_result').length;
}
