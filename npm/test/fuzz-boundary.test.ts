// Property tests of the emergent API's boundary: generated hostile input (fast-check) against
// `agent.forge`, `agent.tools.call`, `agent.emergent.import` and the rest of the registry API.
// After every case: the promise settled, a failure is a CrucibleError with a known code and no
// trace of a wasm trap, and nothing was lost (the kept tools are listed and answer, a
// known-good forge succeeds). A fixed seed by default; FC_SEED, FC_RUNS and FC_STATS=1 explore
// (see test/support/fuzz-arbitraries.ts). Runs and model output: fuzz-boundary-runs.test.ts;
// options and stores: fuzz-boundary-config.test.ts.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { createSandbox, type Agent } from '../src/node.js';
import type { ForgeRequest } from '../src/emergent/types.js';
import { SLUGIFY_FORGE } from './support/forge-fixtures.js';
import { anyInput, forgeRequest, forgeRequestOnePartOdd, hostileString, hugeString, jsonTextOf, nonJson, oddNumber, path, replacedAt, sandboxCode } from './support/fuzz-arbitraries.js';
import {
  assertForgeResult, assertStillServing, assertTyped, check, emergentAgent, errorText, failOnUnhandledRejections, forgeKeptTools, KEEP, label, settles, SHOUT_FORGE, Tally,
} from './support/fuzz-harness.js';

failOnUnhandledRejections();

const SLUGIFY = SLUGIFY_FORGE as unknown as Record<string, unknown>;
const SHOUT = SHOUT_FORGE as unknown as Record<string, unknown>;

describe('generated hostile input at the emergent API', () => {
  let agent: Agent;
  before(async () => {
    agent = await emergentAgent();
    await forgeKeptTools(agent);
  });
  after(() => agent.close());

  test('agent.forge resolves every request, however malformed, with a ForgeResult, and the agent keeps serving', async () => {
    const request = fc.oneof(
      { weight: 3, arbitrary: forgeRequest(SHOUT) },
      { weight: 3, arbitrary: forgeRequest(SLUGIFY) },
      { weight: 4, arbitrary: forgeRequestOnePartOdd(SLUGIFY, SHOUT) },
      { weight: 1, arbitrary: anyInput },
      // As a model sends it: JSON text.
      { weight: 1, arbitrary: forgeRequest(SHOUT).map(jsonTextOf) },
    );
    let cases = 0;
    const outcomes = new Tally('forge outcomes');
    await check(
      fc.asyncProperty(request, fc.array(anyInput, { maxLength: 2 }), async (req, callArgs) => {
        const session = `fz-${++cases}`;
        const outcome = await settles(() => agent.forge(req as never, { sessionId: session }), 'agent.forge');
        assert.ok(outcome.ok, `agent.forge rejected: ${outcome.ok ? '' : errorText(outcome.error)}`);
        const res = outcome.value;
        assertForgeResult(res, 'agent.forge');
        outcomes.add(res.success ? 'registered' : `${res.category}: ${res.reason.slice(0, 40)}`);
        if (res.success) {
          // A tool registered with odd schemas or steps is called too: its schemas are checked
          // and its pipeline runs on inputs its tests did not try.
          for (const input of [(req as ForgeRequest).testCases?.[0]?.input, ...callArgs]) {
            const call = await settles(() => agent.tools.call(res.tool.name, input, { sessionId: session }), "a forged tool's call");
            if (!call.ok) assertTyped(call.error, `the forged tool ${res.tool.name}`);
          }
        }
        await agent.endSession(session);
        await assertStillServing(agent, 'after a generated forge');
      }),
      200,
    );
    outcomes.report();
  });

  test('agent.tools.call answers any arguments on compose, sandbox, host and missing tools with a result or a typed error', async () => {
    const name = fc.oneof({ weight: 4, arbitrary: fc.constantFrom('shout', 'slugify', 'upper', 'add', 'nope', 'forge_tool') }, { weight: 1, arbitrary: hostileString });
    const args = fc.oneof(
      { weight: 3, arbitrary: anyInput },
      { weight: 2, arbitrary: fc.record({ text: anyInput }, { requiredKeys: [] }) },
      { weight: 1, arbitrary: fc.record({ text: hugeString }) },
    );
    const outcomes = new Tally('call outcomes');
    await check(
      fc.asyncProperty(name, args, async (tool, input) => {
        const outcome = await settles(() => agent.tools.call(tool, input, KEEP), 'agent.tools.call');
        if (!outcome.ok) assertTyped(outcome.error, `tools.call(${JSON.stringify(tool)})`);
        outcomes.add(outcome.ok ? `${tool}: ok` : `${tool}: ${label(outcome.error, 50)}`);
        await assertStillServing(agent, 'after a generated call');
      }),
      80,
    );
    outcomes.report();
  });

  test('agent.emergent.import answers arbitrary text and mutated packages (YAML and JSON, both formats) with a result or a typed error', async () => {
    const yamlPackages = [await agent.emergent.export('slugify', KEEP), await agent.emergent.export('shout', KEEP)];
    const slugInfo = agent.tools.list(KEEP).find((t) => t.name === 'slugify')!;
    // The JSON form of the same package (JSON is YAML): every field as the YAML export has it.
    const jsonPackage = JSON.stringify({
      format: 'crucible.tool.v1', name: slugInfo.name, description: slugInfo.description, version: slugInfo.version, hash: slugInfo.hash, mode: 'sandbox',
      inputSchema: slugInfo.inputSchema, outputSchema: slugInfo.outputSchema, implementation: slugInfo.implementation, testCases: SLUGIFY_FORGE.testCases,
      redacted: false, verdict: slugInfo.verdict, provenance: { agentId: 'default', sessionId: 'keep', scope: null, tier: 'session', createdAt: slugInfo.createdAt },
    });
    // The packages @framers/agentos writes, as its own exporter writes them.
    const ao = await import('@framers/agentos/emergent');
    const peerTool = {
      id: 'emergent_slugify_1', name: 'slugify', description: SLUGIFY_FORGE.description, inputSchema: SLUGIFY_FORGE.inputSchema, outputSchema: SLUGIFY_FORGE.outputSchema,
      implementation: { ...SLUGIFY_FORGE.implementation, allowlist: [] }, tier: 'session', createdBy: 'peer-agent', createdAt: '2026-11-01T00:00:00.000Z',
      judgeVerdicts: [], usageStats: { totalUses: 3, successCount: 3, failureCount: 0, avgExecutionTimeMs: 1, confidenceScore: 1, lastUsedAt: null }, source: 'forged',
    };
    const agentosPackages = [
      ao.serializeEmergentToolPackage(ao.buildEmergentToolPackage(peerTool as never)),
      ao.serializeEmergentToolPackage(ao.buildEmergentToolPackage(peerTool as never), 'json'),
    ];
    // The mutations start from packages that import.
    for (const pkg of [...yamlPackages, jsonPackage]) assert.ok((await agent.emergent.import(pkg, { sessionId: 'imp-base' })).success, pkg.slice(0, 80));
    for (const pkg of agentosPackages) assert.ok((await agent.emergent.import(pkg, { sessionId: 'imp-base', testCases: SLUGIFY_FORGE.testCases })).success, pkg.slice(0, 80));
    await agent.endSession('imp-base');

    const packages = [...yamlPackages, jsonPackage, ...agentosPackages];
    const yamlNoise = fc.constantFrom(
      '&a ', '*a', '<<: *a\n', '!!binary ', '!!js/function ', '!<tag:x> ', '? ', '---\n', '...\n', '%YAML 1.2\n', '%TAG ! tag:x\n', '- ', ': ', '|\n', '>-\n', '{', '[', '"', "'", '#',
      '\t', '\n  ', '\u2028', '\u0085', '\ufeff', '\ud800', '\u0000', '~', 'null', '1e999', '0x1F', '.inf', '2001-12-14t21:59:43.10-05:00',
    );
    type Edit = readonly ['insert' | 'replace', number, string] | readonly ['delete' | 'repeat', number, number] | readonly ['truncate', number];
    const edit: fc.Arbitrary<Edit> = fc.oneof(
      fc.tuple(fc.constantFrom('insert' as const, 'replace' as const), fc.nat(), fc.oneof(yamlNoise, hostileString)),
      fc.tuple(fc.constant('delete' as const), fc.nat(), fc.integer({ min: 1, max: 40 })),
      fc.tuple(fc.constant('truncate' as const), fc.nat()),
      // A line repeated: past the 2 MiB a package may be, and aliases multiplied.
      fc.tuple(fc.constant('repeat' as const), fc.nat(), fc.integer({ min: 2, max: 2000 })),
    );
    const applied = (text: string, e: Edit): string => {
      const i = e[1] % (text.length + 1);
      switch (e[0]) {
        case 'insert': return text.slice(0, i) + e[2] + text.slice(i);
        case 'replace': return text.slice(0, i) + e[2] + text.slice(i + e[2].length);
        case 'delete': return text.slice(0, i) + text.slice(i + e[2]);
        case 'truncate': return text.slice(0, i);
        case 'repeat': {
          const end = text.indexOf('\n', i);
          const line = text.slice(text.lastIndexOf('\n', i - 1) + 1, end === -1 ? text.length : end + 1);
          // Edits compound: each stays within about 3 MB.
          return (text.slice(0, i) + line.repeat(Math.min(e[2], Math.floor(3_000_000 / Math.max(line.length, 1)))) + text.slice(i)).slice(0, 3_000_000);
        }
      }
    };
    const jsonForms = [jsonPackage, agentosPackages[1]!, JSON.stringify(SHOUT_FORGE)];
    const pkg = fc.oneof(
      { weight: 4, arbitrary: fc.tuple(fc.nat(packages.length - 1), fc.array(edit, { minLength: 1, maxLength: 4 })).map(([which, edits]) => edits.reduce(applied, packages[which]!)) },
      { weight: 3, arbitrary: fc.tuple(fc.nat(jsonForms.length - 1), path, anyInput).map(([which, steps, value]) => jsonTextOf(replacedAt(JSON.parse(jsonForms[which]!), steps, value))) },
      { weight: 1, arbitrary: hostileString },
      { weight: 1, arbitrary: hugeString },
    );
    const testCases = fc.oneof({ weight: 3, arbitrary: fc.constant(undefined) }, { weight: 2, arbitrary: fc.constant(SLUGIFY_FORGE.testCases) }, { weight: 1, arbitrary: anyInput });
    let cases = 0;
    const outcomes = new Tally('import outcomes');
    await check(
      fc.asyncProperty(pkg, testCases, async (text, given) => {
        const sessionId = `imp-${++cases}`;
        const outcome = await settles(() => agent.emergent.import(text, { sessionId, testCases: given as never }), 'agent.emergent.import');
        if (outcome.ok) assertForgeResult(outcome.value, 'import');
        else assertTyped(outcome.error, 'import');
        outcomes.add(outcome.ok ? (outcome.value.success ? 'imported' : `${outcome.value.category}: ${outcome.value.reason.slice(0, 50)}`) : label(outcome.error));
        await agent.endSession(sessionId);
        await assertStillServing(agent, 'after a generated import');
      }),
      200,
    );
    outcomes.report();
  });

  test('the rest of the registry API (promotion, approval, demotion, rollback, export, list, sessions) answers any arguments with a result or a typed error', async () => {
    const name = fc.oneof({ weight: 4, arbitrary: fc.constantFrom('shout', 'slugify', 'upper', 'nope', 'forge_tool') }, { weight: 1, arbitrary: hostileString }, { weight: 1, arbitrary: anyInput });
    const session = fc.oneof({ weight: 6, arbitrary: fc.constant<unknown>({ sessionId: 'scratch' }) }, { weight: 1, arbitrary: fc.record({ sessionId: anyInput }) }, { weight: 1, arbitrary: anyInput });
    const none = fc.constant(undefined);
    const call = fc.oneof(
      fc.tuple(fc.constant('requestPromotion'), name, fc.oneof(fc.constantFrom('session', 'agent', 'shared', 'Agent', ''), anyInput), session),
      fc.tuple(fc.constant('approve'), fc.oneof(fc.constantFrom('approval_1', ''), anyInput), none, none),
      fc.tuple(fc.constant('deny'), fc.oneof(fc.constantFrom('approval_1', ''), anyInput), anyInput, none),
      fc.tuple(fc.constant('demote'), name, session, none),
      fc.tuple(fc.constant('rollback'), name, fc.oneof(fc.nat(3), oddNumber, anyInput), session),
      fc.tuple(fc.constant('export'), name, session, none),
      fc.tuple(fc.constant('list'), session, none, none),
      fc.tuple(fc.constant('endSession'), anyInput, none, none),
      fc.tuple(fc.constant('history'), anyInput, none, none),
      fc.tuple(fc.constant('discardRun'), anyInput, none, none),
    );
    const api: Record<string, (a: unknown, b: unknown, c: unknown) => Promise<unknown>> = {
      requestPromotion: (a, b, c) => agent.emergent.requestPromotion(a as never, b as never, c as never),
      approve: (a) => agent.emergent.approve(a as never),
      deny: (a, b) => agent.emergent.deny(a as never, b as never),
      demote: (a, b) => agent.emergent.demote(a as never, b as never),
      rollback: (a, b, c) => agent.emergent.rollback(a as never, b as never, c as never),
      export: (a, b) => agent.emergent.export(a as never, b as never),
      // Synchronous: these may throw where they are called.
      list: async (a) => agent.tools.list(a as never),
      history: async (a) => agent.history(a as never),
      endSession: (a) => agent.endSession(a as never),
      discardRun: (a) => agent.discardRun(a as never),
    };
    // Copies of the kept tools in a session of their own, for promotions and demotions to act on.
    await forgeKeptTools(agent, { sessionId: 'scratch' });
    const outcomes = new Tally('registry API outcomes');
    await check(
      fc.asyncProperty(call, async ([method, a, b, c]) => {
        const outcome = await settles(() => api[method]!(a, b, c), method);
        if (!outcome.ok) assertTyped(outcome.error, method);
        outcomes.add(outcome.ok ? `${method}: ok` : `${method}: ${label(outcome.error, 50)}`);
        await assertStillServing(agent, `after ${method}`);
      }),
      1000,
    );
    outcomes.report();
    await agent.endSession('scratch');
  });
});

describe('generated hostile input at the sandbox', () => {
  test('sandbox.execute settles every request with a SandboxResult or a typed error, and the next execution runs', async () => {
    // A short deadline: looping code costs a case little.
    const sandbox = await createSandbox({ timeoutMs: 500, poolSize: 2 });
    const request = fc.oneof(
      { weight: 6, arbitrary: fc.record({ code: sandboxCode, input: anyInput, allowlist: fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 2, arbitrary: fc.array(fc.constantFrom('fetch', 'crypto', 'eval', ''), { maxLength: 3 }) }, { weight: 1, arbitrary: anyInput }) }, { requiredKeys: ['code'] }) },
      { weight: 1, arbitrary: fc.record({ code: anyInput, input: anyInput }, { requiredKeys: [] }) },
      { weight: 1, arbitrary: anyInput },
      { weight: 1, arbitrary: nonJson },
    );
    const statuses = new Set(['ok', 'error', 'timeout', 'memory', 'rejected']);
    const outcomes = new Tally('sandbox outcomes');
    try {
      await check(
        fc.asyncProperty(request, fc.oneof({ weight: 6, arbitrary: fc.constant(undefined) }, { weight: 1, arbitrary: anyInput }, { weight: 1, arbitrary: fc.record({ signal: nonJson }) }), async (req, options) => {
          const outcome = await settles(() => sandbox.execute(req as never, options as never), 'sandbox.execute');
          if (outcome.ok) {
            const { status, error } = outcome.value;
            assert.ok(statuses.has(status), `status ${String(status)}`);
            // The guest's own words may say anything; the host's (the codes) name no trap.
            if (error) assert.doesNotMatch(`${error.code}`, /unreachable|panic/i, JSON.stringify(error).slice(0, 300));
            outcomes.add(status === 'ok' ? 'ok' : `${status}: ${error?.code}`);
          } else {
            assertTyped(outcome.error, 'sandbox.execute');
            outcomes.add(label(outcome.error));
          }
          const next = await sandbox.execute({ code: 'function execute(input) { return { twice: input.n * 2 }; }', input: { n: 21 } });
          assert.deepEqual(next.output, { twice: 42 }, `the next execution: ${JSON.stringify(next).slice(0, 300)}`);
        }),
        100,
      );
    } finally {
      await sandbox.close();
    }
    outcomes.report();
  });
});
