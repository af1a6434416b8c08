/**
 * BENCH DOUBLE — a zero-latency OpenAI-compatible `/chat/completions` server for the agent-loop
 * benchmark. It is stateless: the number of `tool` messages in a request says how far the
 * conversation is, so every client that replays the conversation gets the same script:
 *
 *   requests 1–10 — one streamed tool call `step({"n": k})` (name and id in the first delta,
 *                   arguments split over three deltas, then `finish_reason: tool_calls`)
 *   request 11    — a streamed final text of four deltas (`finish_reason: stop`)
 *
 * followed by the `include_usage` chunk and `[DONE]`, each SSE event in its own `write`.
 *
 * It is deliberately smaller than `npm/test/support/mock-llm-server.ts` (no request log, no
 * message views, no fault injection) and runs in its own process, so its CPU time stays off
 * the measured client's event loop. Run: `node --import tsx bench/agent-loop-server.ts`;
 * prints `{"baseURL": …}` once listening. `GET /stats` answers
 * `{ requests, connections, serverMs }` (TCP connections opened; time from request start to
 * `end()`, summed) and resets them.
 */

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { pathToFileURL } from 'node:url';

/** Tool calls per conversation before the final answer. */
export const TOOL_TURNS = 10;
/** The one tool the scripted model calls. */
export const TOOL_NAME = 'step';
/** The final answer's deltas, joined. */
export const FINAL_TEXT = 'Done after ten steps.';

const FINAL_DELTAS = ['Done ', 'after ', 'ten ', 'steps.'];
const HEADERS = { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', connection: 'keep-alive' };

let requests = 0;
let connections = 0;
let serverNs = 0n;

const server = createServer((req, res) => {
  const started = process.hrtime.bigint();
  handle(req, res)
    .catch((error: unknown) => {
      if (!res.headersSent) res.writeHead(500, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: { message: `agent-loop-server: ${String(error)}`, code: 500 } }));
    })
    .finally(() => {
      requests++;
      serverNs += process.hrtime.bigint() - started;
    });
});

server.on('connection', () => connections++);

async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
  if (req.method === 'GET' && req.url === '/stats') {
    const stats = { requests, connections, serverMs: Number(serverNs) / 1e6 };
    requests = -1; // this GET is counted by `finally`
    connections = 0;
    serverNs = 0n;
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(stats));
    return;
  }
  const parts: Buffer[] = [];
  for await (const part of req) parts.push(part as Buffer);
  const body = JSON.parse(Buffer.concat(parts).toString('utf8')) as { model?: string; messages?: Array<{ role?: string }> };
  const turn = (body.messages ?? []).filter((m) => m.role === 'tool').length;
  const model = body.model ?? 'bench';
  const id = `chatcmpl-bench-${turn}`;
  const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1, model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

  const events = [chunk({ role: 'assistant', content: '' })];
  if (turn < TOOL_TURNS) {
    const args = JSON.stringify({ n: turn });
    const a = Math.floor(args.length / 3);
    const b = Math.floor((2 * args.length) / 3);
    events.push(chunk({ tool_calls: [{ index: 0, id: `call_${turn}`, type: 'function', function: { name: TOOL_NAME, arguments: '' } }] }));
    for (const piece of [args.slice(0, a), args.slice(a, b), args.slice(b)]) {
      events.push(chunk({ tool_calls: [{ index: 0, function: { arguments: piece } }] }));
    }
    events.push(chunk({}, 'tool_calls'));
  } else {
    for (const content of FINAL_DELTAS) events.push(chunk({ content }));
    events.push(chunk({}, 'stop'));
  }
  events.push(`data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created: 1, model, choices: [], usage: { prompt_tokens: 50 + 20 * turn, completion_tokens: 10, total_tokens: 60 + 20 * turn } })}\n\n`);
  events.push('data: [DONE]\n\n');

  res.writeHead(200, HEADERS);
  for (const event of events) res.write(event);
  res.end();
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  server.keepAliveTimeout = 60_000;
  server.listen(Number(process.env.PORT ?? 0), '127.0.0.1', () => {
    const { port } = server.address() as AddressInfo;
    process.stdout.write(`${JSON.stringify({ baseURL: `http://127.0.0.1:${port}/v1` })}\n`);
  });
  process.once('SIGTERM', () => server.close(() => process.exit(0)));
  process.once('SIGINT', () => server.close(() => process.exit(0)));
}
