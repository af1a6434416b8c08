/**
 * What an agent with emergent capabilities costs a Node service before it forges anything:
 * `createAgent` latency and resident memory, for the default sandbox (one per agent, its
 * Workers started by the first forged code that runs) and for one sandbox shared by every
 * agent. Then the first sandbox forge of a fresh agent, which pays for starting its Workers.
 *
 * The model and judge are test doubles that answer at once (no LLM is involved); the core
 * and the sandbox module are loaded by a warm-up agent first, as in a running service.
 *
 * Run: cd npm && npm run bench:startup   (= node --expose-gc --import tsx ../bench/agent-startup.bench.ts)
 * Env: BENCH_AGENTS (default 10).
 */

import { createAgent, createSandbox, type Agent } from '../npm/src/node.js';
import { SLUGIFY_FORGE } from '../npm/test/support/forge-fixtures.js';
import { judge, model, rssMB, settle } from './memory-support.js';

const agentCount = Number(process.env.BENCH_AGENTS ?? 10);

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function measure(label: string, emergent: Parameters<typeof createAgent>[0]['emergent']) {
  await settle();
  const before = rssMB();
  const agents: Agent[] = [];
  const times: number[] = [];
  for (let i = 0; i < agentCount; i++) {
    const started = performance.now();
    agents.push(await createAgent({ model, agentId: `${label}-${i}`, emergent }));
    times.push(performance.now() - started);
  }
  await settle();
  const perAgent = (rssMB() - before) / agentCount;
  const started = performance.now();
  const forged = await agents[0]!.forge(SLUGIFY_FORGE);
  const firstForge = performance.now() - started;
  if (!forged.success) throw new Error(`the first forge failed: ${forged.reason}`);
  for (const agent of agents) await agent.close();
  console.log(`${label.padEnd(16)} createAgent median ${median(times).toFixed(2).padStart(7)} ms   rss per agent ${perAgent.toFixed(1).padStart(5)} MB   first sandbox forge ${firstForge.toFixed(0).padStart(4)} ms`);
}

await (await createAgent({ model, agentId: 'warm-up', emergent: { enabled: true, judge } })).close();
console.log(`${agentCount} agents each; rss measured after GC`);
await measure('default sandbox', { enabled: true, judge });
const shared = await createSandbox();
await measure('shared sandbox', { enabled: true, judge, sandbox: shared });
await shared.close();
