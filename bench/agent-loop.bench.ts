/**
 * Agent-loop benchmark: the runtime's own cost per step of a 10-tool-call loop, with model
 * time taken out, against the Vercel AI SDK doing the same loop in the same run.
 *
 * Every conversation is 11 model requests to the same zero-latency server (a separate
 * process, `agent-loop-server.ts`): ten streamed tool calls `step({n})`, each executed by a
 * trivial host tool and sent back, then a streamed final text. Three clients replay it:
 *
 *   raw fetch  — the floor: `fetch` + a minimal SSE reader + message bookkeeping; no runtime
 *   AI SDK     — baseline: `streamText` + `@ai-sdk/openai-compatible`, `stopWhen: stepCountIs(11)`,
 *                the full stream consumed
 *   Crucible   — `agent.run()` over the streaming `openai()` provider
 *
 * Rounds run one conversation per client, in a rotating order, after a warm-up. A step is one
 * model request (11 per conversation). Overhead per step = (client − raw fetch) of the same
 * round, median over rounds, for wall time and for this process's CPU time (the server's CPU
 * is in the other process). Bar: Crucible / AI SDK ≤ 1.0×.
 *
 * It also prints the gzipped size (level 9) of every `.wasm` that `npm pack` would ship.
 * Bar: ≤ 2.5 MB in total.
 *
 * Run: cd npm && npm run bench:agent   (= node --import tsx ../bench/agent-loop.bench.ts)
 * Env: BENCH_ROUNDS (default 300), BENCH_WARMUP (default 40), BENCH_ONLY=crucible|ai-sdk|raw
 *      (profile one client: node --cpu-prof --import tsx ../bench/agent-loop.bench.ts).
 */

import { execFileSync, spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { cpus, loadavg } from 'node:os';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { gzipSync } from 'node:zlib';
import { createAgent, openai, tool } from '../npm/src/node.js';
import { FINAL_TEXT, TOOL_NAME, TOOL_TURNS } from './agent-loop-server.js';

// Dev dependencies live in npm/node_modules; resolve them from there, not from bench/.
const npmDir = fileURLToPath(new URL('../npm/', import.meta.url));
const fromNpm = createRequire(new URL('../npm/package.json', import.meta.url));
const load = async <T>(name: string): Promise<T> => (await import(pathToFileURL(fromNpm.resolve(name)).href)) as T;
const versionOf = (name: string): string => {
  const main = fromNpm.resolve(name);
  const root = main.slice(0, main.lastIndexOf(`node_modules/${name}/`) + `node_modules/${name}/`.length);
  return (JSON.parse(readFileSync(`${root}package.json`, 'utf8')) as { version: string }).version;
};
type AiModule = typeof import('../npm/node_modules/ai');
type CompatModule = typeof import('../npm/node_modules/@ai-sdk/openai-compatible');
const ai = await load<AiModule>('ai');
const compat = await load<CompatModule>('@ai-sdk/openai-compatible');
(globalThis as { AI_SDK_LOG_WARNINGS?: boolean }).AI_SDK_LOG_WARNINGS = false;

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 300);
const WARMUP = Number(process.env.BENCH_WARMUP ?? 40);
const ONLY = process.env.BENCH_ONLY;
const STEPS = TOOL_TURNS + 1; // model requests per conversation
const SYSTEM = 'You are a benchmark. Call the step tool until told otherwise.';
const PROMPT = 'Run the ten steps.';
const STEP_SCHEMA = {
  type: 'object',
  properties: { n: { type: 'integer', description: 'Step number' } },
  required: ['n'],
  additionalProperties: false,
} as const;
const DESCRIPTION = 'Runs one step of the benchmark';
const executeStep = async ({ n }: { n: number }) => ({ ok: true, n });

// ---------------------------------------------------------------------------------------------
// The server, in its own process

const serverProcess = spawn(process.execPath, ['--import', 'tsx', fileURLToPath(new URL('./agent-loop-server.ts', import.meta.url))], {
  cwd: npmDir,
  stdio: ['ignore', 'pipe', 'inherit'],
});
const baseURL = await new Promise<string>((resolve, reject) => {
  let out = '';
  serverProcess.stdout!.on('data', (piece: Buffer) => {
    out += piece.toString();
    const line = out.split('\n')[0];
    if (out.includes('\n')) resolve((JSON.parse(line!) as { baseURL: string }).baseURL);
  });
  serverProcess.once('exit', (code) => reject(new Error(`agent-loop-server exited with ${code}`)));
});
const serverStats = async () => (await (await fetch(`${baseURL.replace(/\/v1$/, '')}/stats`)).json()) as { requests: number; connections: number; serverMs: number };

// ---------------------------------------------------------------------------------------------
// The three clients. Each `run()` does one whole conversation and checks that it really was one.

interface Client {
  name: string;
  run(i: number): Promise<void>;
}

let toolRuns = 0;
function expectConversation(name: string, text: string, modelSteps: number, toolsBefore: number): void {
  if (text !== FINAL_TEXT || modelSteps !== STEPS || toolRuns - toolsBefore !== TOOL_TURNS) {
    throw new Error(`${name}: expected ${STEPS} steps, ${TOOL_TURNS} tool runs and "${FINAL_TEXT}"; got ${modelSteps}, ${toolRuns - toolsBefore}, ${JSON.stringify(text)}`);
  }
}

function rawFetchClient(): Client {
  const url = `${baseURL}/chat/completions`;
  const tools = [{ type: 'function', function: { name: TOOL_NAME, description: DESCRIPTION, parameters: STEP_SCHEMA } }];
  const name = 'raw fetch (floor)';
  return {
    name,
    async run() {
      const before = toolRuns;
      const messages: unknown[] = [{ role: 'system', content: SYSTEM }, { role: 'user', content: PROMPT }];
      for (let request = 1; ; request++) {
        const response = await fetch(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: 'Bearer none' },
          body: JSON.stringify({ model: 'bench', messages, tools, stream: true, stream_options: { include_usage: true } }),
        });
        const decoder = new TextDecoder();
        let buffer = '';
        let text = '';
        let id = '';
        let toolName = '';
        let args = '';
        for await (const bytes of response.body as unknown as AsyncIterable<Uint8Array>) {
          buffer += decoder.decode(bytes, { stream: true });
          let end: number;
          while ((end = buffer.indexOf('\n\n')) >= 0) {
            const event = buffer.slice(0, end);
            buffer = buffer.slice(end + 2);
            if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
            const delta = (JSON.parse(event.slice(6)) as { choices: Array<{ delta?: { content?: string; tool_calls?: Array<{ id?: string; function?: { name?: string; arguments?: string } }> } }> }).choices[0]?.delta;
            if (delta?.content) text += delta.content;
            for (const call of delta?.tool_calls ?? []) {
              if (call.id) id = call.id;
              if (call.function?.name) toolName = call.function.name;
              args += call.function?.arguments ?? '';
            }
          }
        }
        if (!toolName) {
          expectConversation(name, text, request, before);
          return;
        }
        toolRuns++;
        const result = await executeStep(JSON.parse(args) as { n: number });
        messages.push(
          { role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name: toolName, arguments: args } }] },
          { role: 'tool', tool_call_id: id, content: JSON.stringify(result) },
        );
      }
    },
  };
}

function aiSdkClient(): Client {
  const model = compat.createOpenAICompatible({ name: 'bench', baseURL, apiKey: 'none', includeUsage: true }).chatModel('bench');
  const tools = {
    [TOOL_NAME]: ai.tool({
      description: DESCRIPTION,
      inputSchema: ai.jsonSchema<{ n: number }>(STEP_SCHEMA),
      execute: async (input: { n: number }) => {
        toolRuns++;
        return executeStep(input);
      },
    }),
  };
  const name = `AI SDK ${versionOf('ai')} streamText`;
  return {
    name,
    async run() {
      const before = toolRuns;
      const result = ai.streamText({ model, instructions: SYSTEM, prompt: PROMPT, tools, stopWhen: ai.stepCountIs(STEPS) });
      for await (const part of result.fullStream) if (part.type === 'error') throw part.error;
      expectConversation(name, await result.text, (await result.steps).length, before);
    },
  };
}

async function crucibleClient(): Promise<Client> {
  const step = tool({
    name: TOOL_NAME,
    description: DESCRIPTION,
    inputSchema: STEP_SCHEMA,
    execute: async (input: { n: number }) => {
      toolRuns++;
      return executeStep(input);
    },
  });
  const agent = await createAgent({ model: openai({ baseURL, apiKey: 'none', model: 'bench' }), instructions: SYSTEM, tools: [step] });
  const name = 'Crucible agent.run';
  return {
    name,
    async run(i) {
      const before = toolRuns;
      const sessionId = `bench-${i}`;
      const result = await agent.run(PROMPT, { sessionId });
      agent.endSession(sessionId);
      expectConversation(name, result.text, result.turns, before);
    },
  };
}

// ---------------------------------------------------------------------------------------------
// Measuring

const raw = rawFetchClient();
const aiSdk = aiSdkClient();
const crucible = await crucibleClient();
const keys = { raw, 'ai-sdk': aiSdk, crucible } as const;
const clients: Client[] = ONLY ? [keys[ONLY as keyof typeof keys]] : [raw, aiSdk, crucible];
if (clients.some((c) => !c)) throw new Error(`BENCH_ONLY must be one of ${Object.keys(keys).join(', ')}`);

interface Sample {
  wallMs: number;
  cpuMs: number;
}
const samples = new Map<Client, Sample[]>(clients.map((c) => [c, []]));
const serverSide = new Map(clients.map((c) => [c, { requests: 0, connections: 0, serverMs: 0 }]));

async function measure(client: Client, i: number): Promise<Sample> {
  const cpu = process.cpuUsage();
  const start = performance.now();
  await client.run(i);
  const wallMs = performance.now() - start;
  const used = process.cpuUsage(cpu);
  return { wallMs, cpuMs: (used.user + used.system) / 1000 };
}

let conversation = 0;
for (let round = 0; round < WARMUP; round++) for (const client of clients) await measure(client, conversation++);
await serverStats(); // resets the server's counters
const started = performance.now();
for (let round = 0; round < ROUNDS; round++) {
  // Rotate the order so no client always runs right after another (GC debt, cache state).
  for (let k = 0; k < clients.length; k++) {
    const client = clients[(round + k) % clients.length]!;
    samples.get(client)!.push(await measure(client, conversation++));
    const stats = await serverStats(); // outside the timed part
    const seen = serverSide.get(client)!;
    seen.requests += stats.requests;
    seen.connections += stats.connections;
    seen.serverMs += stats.serverMs;
  }
  if ((round + 1) % 50 === 0) console.error(`round ${round + 1}/${ROUNDS}`);
}
const elapsedS = (performance.now() - started) / 1000;
serverProcess.kill('SIGTERM');

const median = (xs: number[]): number => {
  const s = [...xs].sort((a, b) => a - b);
  const m = s.length >> 1;
  return s.length % 2 ? s[m]! : (s[m - 1]! + s[m]!) / 2;
};
const perStep = (client: Client, key: keyof Sample) => median(samples.get(client)!.map((s) => s[key])) / STEPS;
// Paired with the same round's raw-fetch conversation, so slow phases of the machine cancel out.
const overheadPerStep = (client: Client, key: keyof Sample) => {
  const base = samples.get(raw);
  if (!base) return NaN;
  return median(samples.get(client)!.map((s, r) => s[key] - base[r]![key])) / STEPS;
};

// ---------------------------------------------------------------------------------------------
// Report

const us = (ms: number) => (Number.isNaN(ms) ? '—' : `${(ms * 1000).toFixed(0)} µs`);
console.log(
  `Node ${process.version}, ${cpus().length} CPUs (load ${loadavg()[0]!.toFixed(2)}), @ai-sdk/openai-compatible ${versionOf('@ai-sdk/openai-compatible')}`,
);
console.log(
  `${ROUNDS} rounds × ${clients.length} clients after ${WARMUP} warm-up rounds, ${elapsedS.toFixed(1)} s; ` +
    `a conversation = ${STEPS} streamed requests (${TOOL_TURNS} tool calls + final text); per step = per request\n`,
);
const rows = [['client', 'wall/step', 'overhead/step', 'CPU/step', 'CPU overhead/step']];
for (const client of clients) {
  const isRaw = client === raw;
  rows.push([
    client.name,
    us(perStep(client, 'wallMs')),
    isRaw ? 'floor' : us(overheadPerStep(client, 'wallMs')),
    us(perStep(client, 'cpuMs')),
    isRaw ? 'floor' : us(overheadPerStep(client, 'cpuMs')),
  ]);
}
const widths = rows[0]!.map((_, c) => Math.max(...rows.map((r) => r[c]!.length)));
for (const row of rows) console.log(row.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]!) : cell.padStart(widths[c]!))).join('  '));
console.log('\nserver side (other process), per conversation:');
for (const client of clients) {
  const seen = serverSide.get(client)!;
  console.log(
    `  ${client.name.padEnd(widths[0]!)}  ${(seen.requests / ROUNDS).toFixed(1)} requests, ${(seen.connections / ROUNDS).toFixed(1)} new TCP connections, ` +
      `${us(seen.serverMs / Math.max(1, seen.requests))} server time per request`,
  );
}
if (clients.includes(aiSdk) && clients.includes(crucible) && clients.includes(raw)) {
  const wall = overheadPerStep(crucible, 'wallMs') / overheadPerStep(aiSdk, 'wallMs');
  const cpu = overheadPerStep(crucible, 'cpuMs') / overheadPerStep(aiSdk, 'cpuMs');
  const total = perStep(crucible, 'wallMs') / perStep(aiSdk, 'wallMs');
  console.log(`Crucible / AI SDK, overhead per step: wall ${wall.toFixed(2)}×, CPU ${cpu.toFixed(2)}× (bar ≤ 1.0×: ${wall <= 1 ? 'met' : 'NOT met'})`);
  console.log(`Crucible / AI SDK, whole wall time per step (HTTP + server included): ${total.toFixed(2)}×`);
}

// The wasm that ships: whatever `npm pack` would put in the tarball, gzipped at level 9.
const pack = JSON.parse(execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], { cwd: npmDir, encoding: 'utf8' })) as Array<{ files: Array<{ path: string; size: number }> }>;
const wasm = pack[0]!.files.filter((f) => f.path.endsWith('.wasm'));
let gzTotal = 0;
console.log(`\nwasm in the packed tarball (${wasm.length} file${wasm.length === 1 ? '' : 's'}, gzip -9):`);
for (const file of wasm) {
  const gz = gzipSync(readFileSync(`${npmDir}${file.path}`), { level: 9 }).length;
  gzTotal += gz;
  console.log(`  ${file.path}: ${(file.size / 1e6).toFixed(2)} MB raw, ${(gz / 1e6).toFixed(3)} MB gzipped`);
}
console.log(`  total gzipped: ${(gzTotal / 1e6).toFixed(3)} MB (bar ≤ 2.5 MB: ${gzTotal <= 2.5e6 ? 'met' : 'NOT met'})`);
