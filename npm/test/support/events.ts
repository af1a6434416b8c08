/** Test helper: every event of an agent's stream, read to its end. */
import type { AgentEvent } from '../../src/node.js';

export async function allEvents(stream: AsyncIterable<AgentEvent>): Promise<AgentEvent[]> {
  const events: AgentEvent[] = [];
  for await (const e of stream) events.push(e);
  return events;
}
