/**
 * What a Node service holding many agents keeps once their forged code has stopped running:
 * resident memory of agents that each forged once (their default sandboxes' Workers started),
 * right after and once `sandboxIdleTimeoutMs` has passed; against the baseline of the same
 * agents with `sandboxIdleTimeoutMs: Infinity` (Workers kept until `close()`, as before).
 *
 * The model and judge are test doubles that answer at once (no LLM is involved).
 *
 * Run: cd npm && npm run bench:idle   (= node --expose-gc --import tsx ../bench/sandbox-idle.bench.ts)
 * Env: BENCH_AGENTS (default 10), BENCH_IDLE_MS (default 10000: longer than the
 * forging takes, so no agent's Workers retire before all have forged).
 */

import { createAgent, type Agent } from '../npm/src/node.js';
import { SLUGIFY_FORGE } from '../npm/test/support/forge-fixtures.js';
import { judge, model, rssMB, settle } from './memory-support.js';

const agentCount = Number(process.env.BENCH_AGENTS ?? 10);
const idleMs = Number(process.env.BENCH_IDLE_MS ?? 10_000);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** RSS added by the agents (MB): after each forged once, and `idleMs` + 1 s later. */
async function measure(label: string, sandboxIdleTimeoutMs: number): Promise<[number, number]> {
  await settle();
  const before = rssMB();
  const agents: Agent[] = [];
  for (let i = 0; i < agentCount; i++) {
    const agent = await createAgent({ model, agentId: `${label}-${i}`, emergent: { enabled: true, judge, sandboxIdleTimeoutMs } });
    const forged = await agent.forge(SLUGIFY_FORGE);
    if (!forged.success) throw new Error(`a forge failed: ${forged.reason}`);
    agents.push(agent);
  }
  await settle();
  const busy = rssMB() - before;
  await sleep(idleMs + 1000);
  await settle();
  const idle = rssMB() - before;
  for (const agent of agents) await agent.close();
  console.log(`${label.padEnd(28)} after forging ${busy.toFixed(0).padStart(5)} MB   ${((idleMs + 1000) / 1000).toFixed(0)} s later ${idle.toFixed(0).padStart(5)} MB`);
  return [busy, idle];
}

await (await createAgent({ model, agentId: 'warm-up', emergent: { enabled: true, judge } })).close();
console.log(`${agentCount} agents, each forged once; rss added, measured after GC`);
const [, kept] = await measure('baseline: idle Infinity', Infinity);
const [, retired] = await measure(`sandboxIdleTimeoutMs ${idleMs}`, idleMs);
console.log(`idle agents: ${kept.toFixed(0)} MB kept with the baseline, ${retired.toFixed(0)} MB once their Workers retired (${(kept - retired).toFixed(0)} MB returned)`);
