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

import { createAgent, type Agent, type ModelProvider } from '../npm/src/node.js';
import { SLUGIFY_FORGE, verdictReply } from '../npm/test/support/forge-fixtures.js';

const agentCount = Number(process.env.BENCH_AGENTS ?? 10);
const idleMs = Number(process.env.BENCH_IDLE_MS ?? 10_000);

/** A model double: every request gets one text reply. */
const answering = (text: string): ModelProvider => ({
  id: 'double',
  async *stream() {
    yield { type: 'text', delta: text };
    yield { type: 'finish', finishReason: 'stop' };
  },
});
const model = answering('ok');
const judge = { model: answering(String(verdictReply(true).text)) };

const gc = (globalThis as { gc?: () => void }).gc;
const settle = async () => {
  for (let i = 0; i < 3; i++) {
    gc?.();
    await new Promise((r) => setTimeout(r, 200));
  }
};
const rssMB = () => process.memoryUsage().rss / 1e6;
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
