// Property tests of what an agent is built from: `createAgent` options of any shape, and a
// store holding corrupt or foreign records (another build's, edited by hand). Each case
// builds a serving agent or fails with a typed error, and the core the agents share keeps
// serving. A fixed seed by default; FC_SEED, FC_RUNS and FC_STATS=1 explore.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { createAgent, memoryStore, tool, type JsonValue } from '../src/node.js';
import { anyInput, hostileString, jsonish, jsonTextOf, oddNumber, path, replacedAt } from './support/fuzz-arbitraries.js';
import {
  add, approvingJudge, assertRunsServe, assertTyped, check, emergentAgent, failOnUnhandledRejections, forgeKeptTools, KEEP, label, ScriptedChatModel, settles, SHOUT_FORGE, Tally, upper,
} from './support/fuzz-harness.js';

failOnUnhandledRejections();

test('createAgent builds a serving agent or refuses its options with a typed error', async () => {
  const model = new ScriptedChatModel();
  const value = fc.oneof({ weight: 3, arbitrary: anyInput }, { weight: 2, arbitrary: oddNumber }, { weight: 1, arbitrary: fc.constant(undefined) });
  const agentOptions = ['instructions', 'tools', 'maxTurns', 'maxSteps', 'maxParallelTools', 'maxResultBytes', 'returns', 'maxOutputRetries', 'temperature', 'maxTokens', 'toolChoice', 'resetToolChoice', 'store', 'agentId', 'emergent'];
  const emergentOptions = [
    'enabled', 'judge', 'promotionJudge', 'maxSessionTools', 'maxAgentTools', 'sandboxTimeoutMs', 'sandboxMemoryMB', 'sandboxIdleTimeoutMs', 'promotionThreshold', 'autoPromote', 'promotionRetryUses', 'allowedSandboxAPIs',
    'fetchDomainAllowlist', 'persistSandboxSource', 'sandbox', 'statsFlushEvery', 'auditCapacity',
  ];
  // Options a dictionary of odd values rarely hits: schemas and tools that do not compile,
  // names the core refuses, limits at their edges.
  const pointed = fc.constantFrom<Record<string, unknown>>(
    { toolChoice: 'required' }, { toolChoice: { tool: 'upper' } }, { toolChoice: { tool: 'nope' } }, { toolChoice: { tool: 5 } }, { toolChoice: 'sometimes' },
    { returns: { type: 'object', properties: { a: { $ref: '#' } } } }, { returns: { pattern: '(' } }, { returns: true }, { returns: 'string' },
    { tools: [upper, upper] }, { tools: [{ ...upper, name: 'bad name' }] }, { tools: [{ ...upper, inputSchema: { type: 'string' } }] },
    { tools: [{ ...upper, inputSchema: { type: 'object', properties: { text: { pattern: '(' } } } }] }, { tools: [{ name: 'x', execute: () => 1 }] },
    { tools: [{ ...upper, outputSchema: { $ref: '#/nope' } }] }, { tools: [{ ...upper, needsApproval: 'yes' }] },
    { agentId: '' }, { agentId: 'a/b' }, { agentId: 'x'.repeat(129) }, { agentId: '\ud800' }, { instructions: 'x'.repeat(2_000_000) },
    { emergent: { enabled: true, judge: { model: approvingJudge }, sandbox: { execute: 5 } } }, { emergent: { enabled: true, sandboxMemoryMB: 1 } }, { emergent: { enabled: true, sandboxTimeoutMs: -1 } }, { emergent: { enabled: true, sandboxIdleTimeoutMs: 0 } },
    { emergent: { enabled: true, allowedSandboxAPIs: ['fetch', 'eval'] } }, { emergent: { enabled: true, promotionThreshold: { uses: -1, confidence: 2 } } },
    { emergent: { enabled: true, judge: { model: approvingJudge, maxTokens: 0 } } }, { emergent: { enabled: true, fetchDomainAllowlist: ['*.example.com', 'https://x', 'a:b:c'] } },
    { emergent: { enabled: true, statsFlushEvery: 0, auditCapacity: 0, maxSessionTools: 0 } },
  );
  const options = fc.oneof(
    { weight: 3, arbitrary: fc.dictionary(fc.oneof(fc.constantFrom(...agentOptions), hostileString), value, { maxKeys: 4 }) },
    {
      weight: 2,
      arbitrary: fc.record({
        emergent: fc.oneof(fc.dictionary(fc.oneof(fc.constantFrom(...emergentOptions), hostileString), value, { maxKeys: 4 }).map((e) => ({ enabled: true, ...e })), anyInput),
      }),
    },
    { weight: 2, arbitrary: pointed },
  );
  const provider = fc.oneof(
    { weight: 6, arbitrary: fc.constant<unknown>(model) },
    { weight: 1, arbitrary: anyInput },
    { weight: 1, arbitrary: fc.constant<unknown>({ id: 5, stream: () => 1 }) },
    { weight: 1, arbitrary: fc.constant<unknown>({ stream: model.stream }) },
  );
  const outcomes = new Tally('createAgent outcomes');
  await check(
    fc.asyncProperty(options, provider, async (given, m) => {
      const created = await settles(() => createAgent({ tools: [upper], ...given, model: m } as never), 'createAgent');
      if (!created.ok) {
        // Options and a provider whose getters or Proxy traps throw are invalid_config too.
        assertTyped(created.error, 'createAgent');
        outcomes.add(label(created.error, 50));
        return;
      }
      outcomes.add('created');
      const agent = created.value;
      try {
        model.plain();
        const run = await settles(() => agent.run('hi', { sessionId: 'probe' }), 'a run of the created agent');
        if (!run.ok) assertTyped(run.error, 'a run of the created agent');
      } finally {
        const closed = await settles(() => agent.close(), 'close');
        if (!closed.ok) assertTyped(closed.error, 'close');
      }
    }),
    800,
  );
  outcomes.report();
  // The core the refused and the closed agents shared still serves a new one.
  const agent = await emergentAgent(model);
  await assertRunsServe(agent, model, 'after generated options');
  await agent.close();
});

test('a store holding corrupt or foreign records opens with a typed error or serves', async () => {
  const model = new ScriptedChatModel();
  // Records as a real agent writes them: tools in the agent and shared tiers, their stats, the
  // audit trail, forge stats, a paused run's state.
  const source = memoryStore();
  const refund = tool({ name: 'refund', description: 'Refunds', inputSchema: { type: 'object', properties: { order: { type: 'number' } } }, needsApproval: true, execute: () => ({ ok: true }) });
  const tools = [upper, add, refund];
  const writer = await createAgent({ model, tools, store: source, agentId: 'bot', emergent: { enabled: true, judge: { model: approvingJudge }, persistSandboxSource: true, autoPromote: false } });
  await forgeKeptTools(writer);
  for (const name of ['shout', 'slugify']) {
    for (let i = 0; i < 5; i++) await writer.tools.call(name, { text: `use ${i}` }, KEEP);
    const promoted = await writer.emergent.requestPromotion(name, 'agent', KEEP);
    assert.equal(promoted.status, 'promoted', JSON.stringify(promoted));
  }
  const pending = await writer.emergent.requestPromotion('shout', 'shared');
  await writer.emergent.approve(pending.approval!.id);
  await writer.tools.call('slugify', { text: 'A B' });
  model.play([{ chunk: { type: 'tool_call', index: 0, id: 'call_r', name: 'refund', argumentsDelta: '{"order":1}' } }, { chunk: { type: 'finish', finishReason: 'tool_calls' } }]);
  assert.equal((await writer.run('refund 1')).status, 'paused');
  await writer.emergent.flushStats();
  await writer.close();
  const records = await source.scan('');
  for (const kind of ['agent/bot/tool/', 'shared/tool/', 'agent/bot/stats/', 'agent/bot/audit/', 'agent/bot/run/']) {
    assert.ok(records.some(([key]) => key.startsWith(kind)), `a record under ${kind}: ${records.map(([k]) => k).join(', ')}`);
  }

  const asJson = (value: unknown): JsonValue => JSON.parse(jsonTextOf(value) || 'null') as JsonValue;
  // The store refuses keys with lone surrogates itself; what lies under a key is the point.
  const wellFormed = (key: string) => key.replace(/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/g, '\uFFFD');
  const edit = fc.oneof(
    // A field of a record replaced (a record of an older or newer build, edited by hand).
    fc.tuple(fc.nat(records.length - 1), path, fc.oneof(jsonish, oddNumber, fc.constantFrom<unknown>(null, [], {}, '', -1, 2 ** 53))).map(([which, steps, value]) => {
      const [key, record] = records[which]!;
      return { key, update: (old: JsonValue | undefined) => asJson(replacedAt(old ?? record, steps, value)) };
    }),
    // A record of its own under a key the registry or the runs read.
    fc.tuple(
      fc.constantFrom('agent/bot/tool/', 'agent/bot/stats/', 'shared/tool/', 'shared/stats/', 'agent/bot/audit/', 'agent/bot/forge-name/', 'agent/bot/approval/', 'agent/bot/forge-stats', 'agent/bot/run/'),
      fc.oneof(fc.constantFrom('shout', 'x', '0000000000000001', '', '../a'), hostileString),
      jsonish,
    ).map(([prefix, name, value]) => ({ key: wellFormed(prefix + name), update: () => asJson(value) })),
  );
  const outcomes = new Tally('corrupt store outcomes');
  await check(
    fc.asyncProperty(fc.array(edit, { minLength: 1, maxLength: 3 }), async (edits) => {
      const entries = new Map(records);
      for (const { key, update } of edits) entries.set(key, update(entries.get(key)));
      const store = memoryStore();
      await store.batch([...entries].map(([key, value]) => ({ type: 'put' as const, key, value })));
      const opened = await settles(() => createAgent({ model, tools, store, agentId: 'bot', emergent: { enabled: true, judge: { model: approvingJudge }, autoPromote: false } }), 'createAgent on a corrupt store');
      if (!opened.ok) {
        assertTyped(opened.error, 'createAgent on a corrupt store');
        outcomes.add(label(opened.error));
        return;
      }
      outcomes.add('opened');
      const agent = opened.value;
      try {
        const [run] = await agent.storedRuns();
        const operations: [string, () => Promise<unknown>][] = [
          ['tools.list', async () => agent.tools.list()],
          ['call shout', () => agent.tools.call('shout', { text: 'hi' })],
          ['call slugify', () => agent.tools.call('slugify', { text: 'Hi You' })],
          ['stats', async () => agent.emergent.stats()],
          ['audit', async () => agent.emergent.audit()],
          ['pendingApprovals', async () => agent.emergent.pendingApprovals()],
          ['export', () => agent.emergent.export('shout')],
          ['demote', () => agent.emergent.demote('slugify')],
          ['rollback', () => agent.emergent.rollback('shout', 1)],
          ['forge', () => agent.forge({ ...SHOUT_FORGE, name: 'probe_shout' }, { sessionId: 'probe' })],
          ['resume', async () => run && agent.resume(run.runId, { approvals: run.pendingApprovals.map((a) => ({ id: a.id, approved: true })) })],
        ];
        for (const [what, operation] of operations) {
          const done = await settles(operation, what);
          if (!done.ok) assertTyped(done.error, `${what} on a corrupt store`);
        }
        await assertRunsServe(agent, model, 'on a corrupt store');
      } finally {
        const closed = await settles(() => agent.close(), 'close');
        if (!closed.ok) assertTyped(closed.error, 'close');
      }
    }),
    60,
  );
  outcomes.report();
});
