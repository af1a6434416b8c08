// Durable runs: a tool with needsApproval pauses the run; the state survives the process and
// another process resumes it by run id with the approval.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { getEventListeners } from 'node:events';
import { IDBFactory, IDBKeyRange } from 'fake-indexeddb';
import { AbortError, AgentRunError, createAgent, indexedDbStore, memoryStore, openai, StoreError, tool, type ModelProvider, type Store } from '../src/node.js';
import { startMockLlmServer, type MockLlmServer } from './support/mock-llm-server.js';

const run = promisify(execFile);

/** A refund tool that asks a person every time, and records the orders it refunded. */
function approvedRefund(executed: number[]) {
  return tool({
    name: 'refund',
    description: 'Refund an order',
    inputSchema: { type: 'object', properties: { order: { type: 'integer' } }, required: ['order'] },
    needsApproval: true,
    execute: ({ order }: { order: number }) => {
      executed.push(order);
      return { refunded: order };
    },
  });
}
let server: MockLlmServer;
let dir: string;
before(async () => {
  server = await startMockLlmServer({ replies: [] });
  dir = await mkdtemp(join(tmpdir(), 'crucible-durable-'));
});
after(async () => {
  await server.close();
  await rm(dir, { recursive: true, force: true });
});

async function child(...args: string[]): Promise<any> {
  const { stdout } = await run(process.execPath, ['--import', 'tsx', 'test/support/durable-run.ts', ...args], { timeout: 60_000 });
  return JSON.parse(stdout.trim().split('\n').at(-1)!);
}

test('a paused run resumes in a fresh process with the approval', { timeout: 120_000 }, async () => {
  server.reset();
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 42, amount: 99 } }] }, { text: 'Refunded order 42.' });
  const path = join(dir, 'store');
  const paused = await child('start', path, server.openaiBaseURL);
  assert.equal(paused.status, 'paused');
  assert.deepEqual(paused.refunds, [], 'nothing executed before approval');
  assert.equal(paused.approvals.length, 1);
  assert.deepEqual(paused.approvals[0].arguments, { order: 42, amount: 99 });

  const resumed = await child('resume', path, server.openaiBaseURL, paused.runId, paused.approvals[0].id);
  assert.equal(resumed.status, 'completed');
  assert.equal(resumed.output, 'Refunded order 42.');
  assert.deepEqual(resumed.refunds, [42]);
  const last = server.requests.at(-1)!;
  assert.ok(last.messages.some((m) => m.role === 'user' && m.content === 'Refund order 42'), 'the resumed model call carries the original conversation');
});

test('a denial reaches the model, and a small refund needs no approval', async () => {
  server.reset();
  const executed: number[] = [];
  const refund = tool({
    name: 'refund',
    description: 'Refund an order',
    inputSchema: { type: 'object', properties: { order: { type: 'integer' }, amount: { type: 'number' } }, required: ['order', 'amount'] },
    needsApproval: ({ amount }: { order: number; amount: number }) => amount > 10,
    execute: ({ order }: { order: number; amount: number }) => {
      executed.push(order);
      return { refunded: order };
    },
  });
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' }), tools: [refund], store: memoryStore() });
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 1, amount: 5 } }] }, { text: 'ok' });
  const small = await agent.run('small');
  assert.equal(small.status, 'completed');
  assert.deepEqual(executed, [1]);

  // The run's own stream asks for the decision (as the README's event list says), then pauses.
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 2, amount: 500 } }] });
  const asked: string[] = [];
  for await (const e of agent.stream('big')) {
    asked.push(e.type);
    if (e.type === 'approval.requested') assert.equal(e.approval.kind, 'tool_call');
  }
  assert.deepEqual(asked, ['agent.start', 'step.start', 'tool.call', 'approval.requested', 'agent.paused']);
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 2, amount: 500 } }] }, { text: 'Denied, sorry.' });
  const paused = await agent.run('big');
  assert.equal(paused.status, 'paused');
  const events: string[] = [];
  for await (const e of agent.resumeStream(paused, { approvals: [{ id: paused.pendingApprovals[0]!.id, approved: false, reason: 'too large' }] })) events.push(e.type);
  assert.deepEqual(executed, [1]);
  assert.ok(events.includes('tool.execute.error'));
  assert.match(server.requests.at(-1)!.messages.at(-1)!.content, /denied.*too large/);
});

test('a paused run is resumed once: a second resume, at once or later, is invalid_resume and the refund runs once', async () => {
  const executed: number[] = [];
  const refund = tool({
    name: 'refund',
    description: 'Refund an order',
    inputSchema: { type: 'object', properties: { order: { type: 'integer' }, amount: { type: 'number' } }, required: ['order', 'amount'] },
    needsApproval: true,
    execute: async ({ order }: { order: number; amount: number }) => {
      executed.push(order);
      return { refunded: order };
    },
  });
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' }), tools: [refund], store: memoryStore() });
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 7, amount: 500 } }] }, { text: 'Refunded order 7.' });
  const paused = await agent.run('Refund order 7');
  const approvals = [{ id: paused.pendingApprovals[0]!.id, approved: true }];
  // Both started before either finished: by run id (from the store) and from the state object.
  const [byId, byState] = await Promise.allSettled([agent.resume(paused.runId, { approvals }), agent.resume(paused, { approvals })]);
  assert.equal(byId.status === 'fulfilled' && byId.value.output, 'Refunded order 7.');
  assert.equal(byState.status === 'rejected' && (byState.reason as { code?: string }).code, 'invalid_resume', String(byState.status === 'rejected' && byState.reason));
  // Later, from the state object kept since the pause: the run completed, nothing to resume.
  await assert.rejects(agent.resume(paused, { approvals }), { code: 'invalid_resume', message: /resumed to its end already/ });
  assert.deepEqual(executed, [7]);
  await agent.close();
});

test('runs paused before a restart and resumed after it keep what the new process added to their session, and bring their own conversation once', async () => {
  server.reset();
  const store = memoryStore();
  const model = openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' });
  const before = await createAgent({ model, tools: [approvedRefund([])], store });
  server.enqueue({ text: 'my secret is 1234' }, { toolCalls: [{ name: 'refund', arguments: { order: 42 } }] }, { toolCalls: [{ name: 'refund', arguments: { order: 43 } }] });
  await before.run('remember this');
  const paused = [await before.run('Refund order 42'), await before.run('Refund order 43')];
  assert.deepEqual(paused.map((p) => p.status), ['paused', 'paused']);
  await before.close();

  // The restart: a new agent over the same store, whose session starts afresh.
  const after = await createAgent({ model, tools: [approvedRefund([])], store });
  server.enqueue({ text: 'hello' }, { text: 'Refunded 42.' }, { text: 'Refunded 43.' }, { text: 'done' });
  await after.run('hi');
  for (const p of paused) assert.equal((await after.resume(p.runId, { approvals: [{ id: p.pendingApprovals[0]!.id, approved: true }] })).status, 'completed');
  await after.run('what now');
  const inputs = (messages: Array<{ role: string; content?: unknown }>) => messages.filter((m) => m.role === 'user').map((m) => m.content);
  assert.deepEqual(inputs(server.requests.at(-1)!.messages), ['hi', 'remember this', 'Refund order 42', 'Refund order 43', 'what now']);
  assert.deepEqual(inputs(after.history() as Array<{ role: string; content?: unknown }>), ['hi', 'remember this', 'Refund order 42', 'Refund order 43', 'what now']);
  await after.close();
});

test('a state object resumed under another run id is invalid_resume: nothing runs, and the run still resumes', async () => {
  const executed: number[] = [];
  const refund = approvedRefund(executed);
  // Without a store the state object is what runs.
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' }), tools: [refund] });
  server.reset();
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 9 } }] }, { text: 'Refunded order 9.' });
  const paused = await agent.run('Refund order 9');
  assert.equal(paused.status, 'paused');
  const approvals = [{ id: paused.pendingApprovals[0]!.id, approved: true }];
  // Before, the core ran the state's run while the stream waited under the other id: the refund
  // ran, its events went to no stream, and resume failed with `internal`.
  await assert.rejects(agent.resume({ runId: 'run_other', state: paused.state }, { approvals }), {
    code: 'invalid_resume',
    message: new RegExp(`the state given is of run \`${paused.runId}\`, not of \`run_other\``),
  });
  assert.deepEqual(executed, [], 'nothing ran');
  const done = await agent.resume(paused, { approvals });
  assert.equal(done.status === 'completed' && done.output, 'Refunded order 9.');
  assert.deepEqual(executed, [9]);
  await agent.close();
});

test('storedRuns lists paused and interrupted runs; discardRun drops one for good', async () => {
  const refund = tool({
    name: 'refund',
    description: 'Refund an order',
    inputSchema: { type: 'object', properties: { order: { type: 'integer' }, amount: { type: 'number' } }, required: ['order', 'amount'] },
    needsApproval: true,
    execute: ({ order }: { order: number; amount: number }) => ({ refunded: order }),
  });
  const store = memoryStore();
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } }), tools: [refund], store });
  assert.deepEqual(await agent.storedRuns(), []);
  server.reset();
  // One run pauses for approval; another is interrupted between steps by a model failure.
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 8, amount: 500 } }] });
  const paused = await agent.run('Refund order 8', { sessionId: 's1' });
  server.enqueue({ toolCalls: [{ name: 'refund_status', arguments: {} }] }, { status: 500 });
  await assert.rejects(agent.run('Check it', { sessionId: 's2' }), { code: 'provider_http' });
  const stored = await agent.storedRuns();
  assert.deepEqual(stored.map((r) => [r.sessionId, r.status, r.pendingApprovals.length]).sort(), [['s1', 'paused', 1], ['s2', 'interrupted', 0]]);
  assert.equal(stored.find((r) => r.status === 'paused')!.pendingApprovals[0]!.id, paused.pendingApprovals[0]!.id);

  const interrupted = stored.find((r) => r.status === 'interrupted')!;
  assert.equal(await agent.discardRun(interrupted.runId), true);
  assert.equal(await agent.discardRun(interrupted.runId), false, 'already gone');
  await assert.rejects(agent.resume(interrupted.runId), { code: 'invalid_resume' });
  assert.deepEqual((await agent.storedRuns()).map((r) => r.runId), [paused.runId]);
  await assert.rejects(agent.discardRun(42 as never), { code: 'invalid_argument' });
  await agent.close();
});

test('storedRuns shows a run that is going in this process as running, and its saved status once it ends', async () => {
  const store = memoryStore();
  const seen: string[] = [];
  let agent: Awaited<ReturnType<typeof createAgent>> | undefined;
  const lookup = tool({
    name: 'lookup',
    description: 'Look an order up',
    inputSchema: { type: 'object', properties: {} },
    execute: async () => {
      seen.push(...(await agent!.storedRuns()).map((r) => r.status));
      return { found: true };
    },
  });
  agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } }), tools: [lookup], store });
  server.reset();
  server.enqueue({ toolCalls: [{ name: 'lookup', arguments: {} }] }, { text: ['Found.'] });
  const done = await agent.run('Find it', { sessionId: 's1' });
  assert.equal(done.text, 'Found.');
  assert.deepEqual(seen, ['running'], 'the run saved its step before the call and holds its claim');
  assert.deepEqual(await agent.storedRuns(), [], 'a completed run leaves nothing behind');
  await agent.close();
});

test('storedRuns shows a run another tab is driving as running while it holds the run, and its saved status once it lets go', async () => {
  const store = indexedDbStore({ name: 'runs', indexedDB: new IDBFactory(), IDBKeyRange });
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } }), store });
  server.reset();
  server.enqueue({ status: 500 });
  const failed = await agent.run('Check it').catch((e: unknown) => e as AgentRunError);
  assert.ok(failed instanceof AgentRunError && failed.code === 'provider_http', String(failed));
  assert.deepEqual((await agent.storedRuns()).map((r) => r.status), ['interrupted']);
  // Another tab resumes the run: it holds the run's store lock for as long as it drives it.
  const release = await store.lock!(`run:default/${failed.runId}`);
  assert.deepEqual((await agent.storedRuns()).map((r) => r.status), ['running'], 'not offered for resuming while another tab runs it');
  release();
  assert.deepEqual((await agent.storedRuns()).map((r) => r.status), ['interrupted']);
  await agent.close();
});

test('storedRuns asks the store for run locks 32 at a time, not one after another, and gives back each lock it gets, even when one tryLock fails', async () => {
  const inner = memoryStore();
  let [inFlight, mostInFlight, given, givenBack] = [0, 0, 0, 0];
  let [heldElsewhere, failing] = [new Set<string>(), new Set<string>()];
  // A store whose tryLock takes a timer's turn to answer, as a lock manager across tabs does.
  const store: Store = {
    get: (key) => inner.get(key),
    put: (key, value) => inner.put(key, value),
    delete: (key) => inner.delete(key),
    scan: (prefix) => inner.scan(prefix),
    batch: (ops) => inner.batch(ops),
    close: () => inner.close(),
    async tryLock(name) {
      mostInFlight = Math.max(mostInFlight, ++inFlight);
      await new Promise((resolve) => setTimeout(resolve, 1));
      inFlight--;
      if (failing.has(name)) throw new Error('lock manager gone');
      if (heldElsewhere.has(name)) return undefined;
      given++;
      return () => void givenBack++;
    },
  };
  const down: ModelProvider = {
    id: 'test-double:down',
    async *stream() {
      throw new Error('down');
    },
  };
  const agent = await createAgent({ model: down, store });
  for (let i = 0; i < 40; i++) await assert.rejects(agent.run(`try ${i}`));
  const listed = await agent.storedRuns();
  assert.equal(listed.length, 40);
  assert.deepEqual(listed.map((r) => r.runId), listed.map((r) => r.runId).sort(), 'in run id order');
  assert.deepEqual(new Set(listed.map((r) => r.status)), new Set(['interrupted']));
  assert.equal(mostInFlight, 32, 'the first 32 were asked for at once, and no more');
  assert.deepEqual([given, givenBack], [40, 40]);

  // One held by another tab is running, in its place; one whose tryLock fails fails the listing,
  // and the locks the others got are given back all the same.
  const lockOf = (i: number) => `run:default/${listed[i]!.runId}`;
  [heldElsewhere, given, givenBack] = [new Set([lockOf(3), lockOf(35)]), 0, 0];
  assert.deepEqual((await agent.storedRuns()).flatMap((r, i) => (r.status === 'running' ? [i] : [])), [3, 35]);
  [failing, given, givenBack] = [new Set([lockOf(5)]), 0, 0];
  await assert.rejects(agent.storedRuns(), (e: unknown) => e instanceof StoreError && /lock manager gone/.test(e.message));
  await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(givenBack, given);
  await agent.close();
});

test('an aborted run is listed as interrupted under its AbortError runId and resumes from its last saved step', async () => {
  const controller = new AbortController();
  const looked: number[] = [];
  const lookup = tool({
    name: 'lookup',
    description: 'Look an order up',
    inputSchema: { type: 'object', properties: {} },
    // Ignores its signal: the abort ends the run at once and the call's result is discarded.
    execute: async () => {
      looked.push(looked.length + 1);
      controller.abort();
      await new Promise((resolve) => setTimeout(resolve, 50));
      return { found: true };
    },
  });
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm', retry: { maxRetries: 0 } }), tools: [lookup], store: memoryStore() });
  server.reset();
  server.enqueue({ toolCalls: [{ name: 'lookup', arguments: {} }] });
  const aborted = await agent.run('Find it', { signal: controller.signal }).catch((e: unknown) => e as AbortError);
  assert.ok(aborted instanceof AbortError, String(aborted));
  assert.deepEqual((await agent.storedRuns()).map((r) => [r.runId, r.status, r.turns]), [[aborted.runId, 'interrupted', 0]]);
  // The abort cut the step short, so it was not saved: the model is asked again from the
  // last saved step (here the run's start), and could call the tool again (at-least-once).
  server.enqueue({ text: ['Found.'] });
  const done = await agent.resume(aborted.runId!);
  assert.equal(done.text, 'Found.');
  assert.deepEqual(server.requests.at(-1)!.messages.map((m) => m.role), ['user']);
  assert.deepEqual(looked, [1]);
  assert.deepEqual(await agent.storedRuns(), []);
  await agent.close();
});

test('a resume whose signal was aborted before it began runs nothing, names its run, and the run resumes afterwards', async () => {
  server.reset();
  const executed: number[] = [];
  const refund = approvedRefund(executed);
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' }), tools: [refund], store: memoryStore() });
  server.enqueue({ toolCalls: [{ name: 'refund', arguments: { order: 9 } }] }, { text: 'Refunded order 9.' });
  const paused = await agent.run('refund 9');
  const approvals = [{ id: paused.pendingApprovals[0]!.id, approved: true }];
  await assert.rejects(agent.resume(paused.runId, { approvals, signal: AbortSignal.abort() }), (e: unknown) => {
    assert.ok(e instanceof AbortError, String(e));
    assert.equal(e.runId, paused.runId);
    return true;
  });
  assert.deepEqual(executed, []);
  assert.equal((await agent.resume(paused.runId, { approvals })).output, 'Refunded order 9.');
  assert.deepEqual(executed, [9]);
  await agent.close();
});

test('a stream dropped mid-read without being closed takes its listener off the caller signal once the run ends', async () => {
  server.reset();
  const agent = await createAgent({ model: openai({ baseURL: server.openaiBaseURL, apiKey: 'x', model: 'm' }) });
  const signal = new AbortController().signal;
  for (let i = 0; i < 20; i++) {
    server.enqueue({ text: ['a', 'b'] });
    const stream = agent.stream('?', { signal })[Symbol.asyncIterator]();
    await stream.next(); // agent.start, then dropped: no return(), no further reads
  }
  // The runs end on their own; what they registered goes with them.
  for (let i = 0; i < 100 && getEventListeners(signal, 'abort').length > 0; i++) await new Promise((resolve) => setTimeout(resolve, 20));
  assert.equal(getEventListeners(signal, 'abort').length, 0, 'no abort listener is left on the caller signal');
  await agent.close();
});

test('a store write that never settles holds a run only until it is aborted, and close() still settles', async () => {
  const answers = { id: 'test-double:answers', async *stream() { yield { type: 'text' as const, delta: 'hi' }; yield { type: 'finish' as const, finishReason: 'stop' as const }; } };
  // A run saves its state with `put` (with `batch` once its starting conversation is stored
  // apart) and forgets it with `batch`.
  for (const stuck of ['put', 'batch'] as const) {
    const base = memoryStore();
    let hang = false;
    const store = { ...base, get: base.get.bind(base), put: base.put.bind(base), delete: base.delete.bind(base), scan: base.scan.bind(base), batch: base.batch.bind(base) };
    store[stuck] = (...args: never[]) => (hang ? new Promise<never>(() => {}) : (base[stuck] as (...a: never[]) => Promise<void>)(...args));
    const agent = await createAgent({ model: answers, store });
    hang = true;
    const controller = new AbortController();
    const run = agent.run('hi', { signal: controller.signal });
    setTimeout(() => controller.abort(), 100);
    const outcome = await Promise.race([run.then(() => 'completed', (e: unknown) => (e instanceof AbortError ? 'aborted' : String(e))), new Promise((r) => setTimeout(() => r('still pending'), 2000))]);
    assert.equal(outcome, 'aborted', `a stuck store.${stuck}`);
    const closing = await Promise.race([agent.close().then(() => 'closed'), new Promise((r) => setTimeout(() => r('close() still pending'), 2000))]);
    assert.equal(closing, 'closed', `a stuck store.${stuck}`);
  }
});

test('discardRun right after an abort deletes the state its run was still writing: it does not come back once the write lands', async () => {
  const base = memoryStore();
  let slow = false;
  // A store that takes 50 ms to write (a disk, a network store): the abort lands first.
  const store: Store = { ...base, get: base.get.bind(base), delete: base.delete.bind(base), scan: base.scan.bind(base), batch: base.batch.bind(base), put: async (key, value) => {
    if (slow) await new Promise((resolve) => setTimeout(resolve, 50));
    return base.put(key, value);
  } };
  const controller = new AbortController();
  const stop = tool({ name: 'stop', description: 'Stops', inputSchema: { type: 'object', properties: {} }, execute: () => {
    slow = true;
    controller.abort();
    return 'stopped';
  } });
  const model: ModelProvider = { id: 'test-double:stops', async *stream() { yield { type: 'tool_call', index: 0, id: 'c1', name: 'stop', argumentsDelta: '{}' }; yield { type: 'finish', finishReason: 'tool_calls' }; } };
  const agent = await createAgent({ model, tools: [stop], store });
  const aborted = await agent.run('go', { signal: controller.signal }).catch((e: unknown) => e);
  assert.ok(aborted instanceof AbortError && aborted.runId, String(aborted));
  assert.equal(await agent.discardRun(aborted.runId), true);
  await new Promise((resolve) => setTimeout(resolve, 150));
  assert.deepEqual(await agent.storedRuns(), [], 'nothing came back');
  assert.deepEqual(await base.scan(`agent/default/run/`), []);
  await agent.close();
});

test('a save an abort left out that never settles holds no discard, no listing and no other run', async () => {
  const base = memoryStore();
  let stuck = false;
  const store: Store = { ...base, get: base.get.bind(base), delete: base.delete.bind(base), scan: base.scan.bind(base), batch: base.batch.bind(base), put: (key, value) => (stuck ? new Promise<never>(() => {}) : base.put(key, value)) };
  const controller = new AbortController();
  const stop = tool({ name: 'stop', description: 'Stops', inputSchema: { type: 'object', properties: {} }, execute: () => {
    stuck = true;
    controller.abort();
    return 'stopped';
  } });
  let turn = 0;
  const model: ModelProvider = { id: 'test-double:stops', async *stream() {
    if (turn++ === 0) yield { type: 'tool_call', index: 0, id: 'c1', name: 'stop', argumentsDelta: '{}' };
    else yield { type: 'text', delta: 'Done.' };
    yield { type: 'finish', finishReason: turn === 1 ? 'tool_calls' : 'stop' };
  } };
  const agent = await createAgent({ model, tools: [stop], store });
  const aborted = await agent.run('go', { signal: controller.signal }).catch((e: unknown) => e);
  assert.ok(aborted instanceof AbortError && aborted.runId, String(aborted));
  const settles = <T>(work: Promise<T>) => Promise.race([work.then(() => 'settled'), new Promise((r) => setTimeout(() => r('still pending'), 2000))]);
  assert.equal(await settles(agent.storedRuns()), 'settled');
  assert.equal(await settles(agent.discardRun(aborted.runId)), 'settled');
  // A resume of it waits for the write only as long as its signal lets it.
  await assert.rejects(agent.resume(aborted.runId, { signal: AbortSignal.timeout(100) }), AbortError);
  await agent.close();
});
