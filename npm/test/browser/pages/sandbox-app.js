// Sandbox page for test/browser-sandbox.test.ts and test/browser-emergent.test.ts: called by
// name through `callInPage` with JSON arguments. Loaded behind an import map that points
// `crucible-agents` at dist/browser.js, or bundled by Vite. Plain JavaScript on purpose.
import { createAgent, createSandbox, indexedDbStore, openai } from 'crucible-agents';

// A secret on the host realm: no sandbox result may ever contain it.
window.HOST_SECRET = 'host-secret-7f3a';

let sandbox;
const heap = () => performance.memory?.usedJSHeapSize ?? 0;

window.sandboxStart = async (options) => {
  await sandbox?.close();
  const started = performance.now();
  sandbox = await createSandbox(options);
  return { startMs: performance.now() - started };
};

window.sandboxClose = async () => {
  await sandbox?.close();
  sandbox = undefined;
};

/**
 * One execution, timed in the page, then the probe that must succeed afterwards. `request` may
 * be JSON text: `callInPage` passes arguments as JavaScript source, where a `"__proto__"` key
 * would set a prototype instead of staying an own key as JSON input must.
 */
window.sandboxRun = async (request, probe) => {
  if (typeof request === 'string') request = JSON.parse(request);
  const heapBefore = heap();
  const started = performance.now();
  const result = await sandbox.execute(request);
  const wallMs = performance.now() - started;
  const after = probe ? await sandbox.execute(probe) : undefined;
  return { result, wallMs, probe: after, heapGrowth: heap() - heapBefore, stats: sandbox.stats() };
};

/** Several executions at once (the pool serves them in parallel). */
window.sandboxRunAll = async (requests) => {
  const results = await Promise.all(requests.map((r) => sandbox.execute(r)));
  return { results, stats: sandbox.stats() };
};

const median = (xs) => {
  const s = [...xs].sort((a, b) => a - b);
  return s.length % 2 ? s[(s.length - 1) / 2] : (s[s.length / 2 - 1] + s[s.length / 2]) / 2;
};

/** Median per-call latency of `code` over `n` sequential calls (after `warmup` calls). */
window.sandboxBench = async ({ code, inputs, n, warmup }) => {
  for (let i = 0; i < warmup; i++) await sandbox.execute({ code, input: inputs[i % inputs.length] });
  const times = [];
  let failures = 0;
  let sample;
  const all = performance.now();
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    const r = await sandbox.execute({ code, input: inputs[i % inputs.length] });
    times.push(performance.now() - t);
    if (r.status !== 'ok') failures++;
    sample ??= r.output;
  }
  const meanMs = (performance.now() - all) / n;
  const sorted = [...times].sort((a, b) => a - b);
  return { meanMs, crossOriginIsolated: self.crossOriginIsolated, medianMs: median(times), p90Ms: sorted[Math.floor(n * 0.9)], minMs: sorted[0], failures, sample };
};

/**
 * Kills a worker with an infinite loop `rounds` times; for each, the time from the timeout
 * result until the pool's replacement worker reported ready (`stats().lastReplacementMs`,
 * measured by the pool from the kill) and until the next execution on a 1-worker pool succeeded.
 */
window.sandboxReplaceTimes = async ({ rounds, timeoutMs }) => {
  await sandbox?.close();
  sandbox = await createSandbox({ poolSize: 1, timeoutMs });
  const replacement = [];
  const nextCall = [];
  for (let i = 0; i < rounds; i++) {
    const killed = sandbox.stats().workersKilled;
    const r = await sandbox.execute({ code: 'function execute(){ for(;;){} }' });
    if (r.status !== 'timeout' || sandbox.stats().workersKilled !== killed + 1) throw new Error(`not killed: ${JSON.stringify(r)}`);
    const t = performance.now();
    const next = await sandbox.execute({ code: 'function execute(){ return 1; }' });
    nextCall.push(performance.now() - t);
    if (next.output !== 1) throw new Error(`next call failed: ${JSON.stringify(next)}`);
    replacement.push(sandbox.stats().lastReplacementMs);
  }
  return { replacementMedianMs: median(replacement), nextCallMedianMs: median(nextCall), replacement, nextCall };
};

// ---- issue 5: an agent forges a sandbox tool, promotes it, and finds it again after a reload

const model = (baseURL, name) => openai({ baseURL, apiKey: 'x', model: name, retry: { maxRetries: 0 } });

/** The store with reads that answer `ms` later (as a slow disk would), so two tabs' flushes overlap. */
function slowReads(store, ms) {
  return ms ? { ...store, get: async (key) => { const value = await store.get(key); await new Promise((r) => setTimeout(r, ms)); return value; } } : store;
}

async function makeAgent({ chatURL, judgeURL, storeName, agentId, slowReadsMs }, store = slowReads(indexedDbStore({ name: storeName }), slowReadsMs)) {
  return createAgent({
    model: model(chatURL, 'chat'),
    store,
    agentId,
    emergent: {
      enabled: true,
      judge: { model: model(judgeURL, 'judge') },
      promotionThreshold: { uses: 2, confidence: 0.8 },
      persistSandboxSource: true,
    },
  });
}

window.forgeAndPromote = async (config, forgeRequest) => {
  const agent = await makeAgent(config);
  try {
    const promotions = [];
    agent.on((e) => e.type === 'tool.promoted' && promotions.push(e));
    const forged = await agent.forge(forgeRequest, { sessionId: 's1' });
    if (!forged.success) return { forged };
    const calls = [];
    for (const text of ['Hello World!', 'Rust & Wasm']) calls.push(await agent.tools.call(forgeRequest.name, { text }, { sessionId: 's1' }));
    // The second successful use reaches the threshold: the tool promotes itself to the agent tier,
    // in the background of that call.
    await agent.emergent.settled();
    const promoted = { status: promotions.some((e) => e.name === forgeRequest.name && e.toTier === 'agent') ? 'promoted' : 'not promoted' };
    const listed = agent.tools.list({ sessionId: 's1' }).map((t) => ({ name: t.name, tier: t.tier, calls: t.stats.calls }));
    return { forged: { success: forged.success, tier: forged.tool.tier, tests: forged.tests.map((t) => t.passed) }, calls, promoted, listed };
  } finally {
    await agent.close();
  }
};

// The calls' count in the store before and after one more call and a `pagehide`, read
// through another store object while the agent is still open (its close() would flush).
window.callThenHidePage = async (config, name, text) => {
  const agent = await makeAgent(config);
  const storedCalls = () => window.storedAgentCalls(config, name);
  try {
    const before = await storedCalls();
    await agent.tools.call(name, { text }, { sessionId: 'hide' });
    dispatchEvent(new PageTransitionEvent('pagehide', { persisted: false }));
    const deadline = Date.now() + 5000;
    let after = await storedCalls();
    while (after === before && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 50));
      after = await storedCalls();
    }
    return { before, after };
  } finally {
    await agent.close();
  }
};

/** The calls of the agent-tier tool `name` as the store holds them (read past the agent). */
window.storedAgentCalls = async (config, name) => {
  const record = await indexedDbStore({ name: config.storeName }).get(`agent/${config.agentId}/stats/${name}`);
  return record?.calls ?? record?.data?.calls ?? null;
};

window.reopenAndCall = async (config, name, text) => {
  const agent = await makeAgent(config);
  try {
    const listed = agent.tools.list({ sessionId: 'after-reload' }).map((t) => ({ name: t.name, tier: t.tier }));
    const output = text === null ? undefined : await agent.tools.call(name, { text }, { sessionId: 'after-reload' });
    return { listed, output };
  } finally {
    await agent.close();
  }
};

// Two agents on one store object are one runtime: a shared-tier approval made through the
// owner is visible to the other agent without reloading it.
window.shareAcrossRuntime = async (config, name, text) => {
  const store = indexedDbStore({ name: config.storeName });
  const owner = await makeAgent(config, store);
  const other = await makeAgent({ ...config, agentId: 'other-bot' }, store);
  try {
    const before = other.tools.list({ sessionId: 'z' }).map((t) => [t.name, t.tier]);
    const pending = await owner.emergent.requestPromotion(name, 'shared');
    await owner.emergent.approve(pending.approval.id);
    const after = other.tools.list({ sessionId: 'z' }).map((t) => [t.name, t.tier]);
    return { before, after, output: await other.tools.call(name, { text }, { sessionId: 'z' }) };
  } finally {
    await Promise.all([owner.close(), other.close()]);
  }
};

// Agents kept open across calls, for tests with two tabs.
const held = new Map();
window.holdAgent = async (key, config) => {
  held.set(key, await makeAgent(config));
  return true;
};
/** holdAgent that may be refused: `opened`, or the error's code. */
window.tryHoldAgent = async (key, config) => {
  try {
    await window.holdAgent(key, config);
    return 'opened';
  } catch (error) {
    return error.code ?? String(error);
  }
};
window.heldTools = (key) => held.get(key).tools.list({ sessionId: 'z' }).map((t) => [t.name, t.tier]);
window.heldCall = (key, name, text) => held.get(key).tools.call(name, { text }, { sessionId: 'z' });
/** Forges `forgeRequest`, uses it until it promotes itself to the agent tier, then to shared. */
window.heldForgeAndShare = async (key, forgeRequest) => {
  const agent = held.get(key);
  if (!(await agent.forge(forgeRequest, { sessionId: 'z' })).success) return 'not forged';
  for (const text of ['a b', 'c d']) await agent.tools.call(forgeRequest.name, { text }, { sessionId: 'z' });
  await agent.emergent.settled(); // the automatic promotion runs in the background of the call
  const pending = await agent.emergent.requestPromotion(forgeRequest.name, 'shared');
  return (await agent.emergent.approve(pending.approval.id)).tier;
};
window.heldFlush = async (key) => {
  await held.get(key).emergent.flushStats();
  return true;
};
/** The calls of the shared tool `name` as the store holds them (read by a fresh agent). */
window.storedSharedCalls = async (config, name) => {
  const probe = await makeAgent({ ...config, agentId: `probe-${Date.now()}` });
  try {
    return probe.tools.list({ sessionId: 'z' }).find((t) => t.name === name && t.tier === 'shared')?.stats.calls;
  } finally {
    await probe.close();
  }
};
/** Forges `forgeRequest`, calls it with `text`, closes the agent while the call runs: how the
 *  call ended (its value, or the error's code). */
window.callCutByClose = async (config, forgeRequest, text) => {
  const agent = await makeAgent(config);
  try {
    if (!(await agent.forge(forgeRequest, { sessionId: 'z' })).success) return 'not forged';
    const calling = agent.tools.call(forgeRequest.name, { text }, { sessionId: 'z' }).then((value) => ({ value }), (error) => ({ code: error.code }));
    await new Promise((resolve) => setTimeout(resolve, 200));
    await agent.close();
    return await calling;
  } finally {
    await agent.close();
  }
};

window.releaseAgent = async (key) => {
  await held.get(key)?.close();
  held.delete(key);
  return true;
};

/** createSandbox that is expected to fail: reports the error and how long failing took. */
window.sandboxStartError = async (options) => {
  const started = performance.now();
  try {
    const s = await createSandbox(options);
    await s.close();
    return { failed: false, ms: performance.now() - started };
  } catch (error) {
    return { failed: true, name: error.name, message: error.message, cause: String(error.cause?.message ?? error.cause), ms: performance.now() - started };
  }
};

/**
 * Closes a lazy sandbox while its Workers start and reports the timers of `startTimeoutMs` it
 * left pending (timers are counted through a wrapped setTimeout while it runs).
 */
window.startTimersLeftByClose = async (startTimeoutMs) => {
  const pending = new Set();
  const { setTimeout: realSet, clearTimeout: realClear } = window;
  window.setTimeout = (fn, ms, ...rest) => {
    const id = realSet((...a) => {
      pending.delete(id);
      fn(...a);
    }, ms, ...rest);
    if (ms === startTimeoutMs) pending.add(id);
    return id;
  };
  window.clearTimeout = (id) => {
    pending.delete(id);
    realClear(id);
  };
  try {
    const s = await createSandbox({ lazy: true, poolSize: 2, startTimeoutMs });
    const running = s.execute({ code: 'function execute(input) { return input; }', input: { a: 1 } });
    await s.close();
    await running;
    return pending.size;
  } finally {
    window.setTimeout = realSet;
    window.clearTimeout = realClear;
  }
};
