// The README's first example ("Using the package"), read from the README itself so the two
// cannot drift: it type-checks against the package's source, and run against the mock LLM
// server it streams the first answer and resolves run() with the second, as the README says.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile, writeFile, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import * as crucible from '../src/node.js';
import { startMockLlmServer, type MockLlmServer } from './support/mock-llm-server.js';

const npmDir = join(dirname(fileURLToPath(import.meta.url)), '..');
let server: MockLlmServer;
before(async () => {
  server = await startMockLlmServer({ replies: [] });
});
after(() => server.close());

/** The first ```ts block after the "## Using the package" heading. */
async function usageExample(): Promise<string> {
  const readme = await readFile(join(npmDir, '../README.md'), 'utf8');
  const section = readme.slice(readme.indexOf('\n## Using the package'));
  const block = /```ts\n([\s\S]*?)```/.exec(section)?.[1];
  assert.ok(block, 'the README has a ts example under "Using the package"');
  return block;
}

test('the README\'s usage example type-checks against the package', { timeout: 120_000 }, async () => {
  const { default: ts } = await import('typescript');
  const dir = await mkdtemp(join(tmpdir(), 'crucible-readme-'));
  try {
    const file = join(dir, 'example.ts');
    await writeFile(file, `${await usageExample()}\nexport {};\n`);
    const program = ts.createProgram([file], {
      target: ts.ScriptTarget.ES2022,
      module: ts.ModuleKind.ES2022,
      moduleResolution: ts.ModuleResolutionKind.Bundler,
      // The package's own libs (tsconfig.json): its source is checked along with the example.
      lib: ['lib.es2022.d.ts', 'lib.dom.d.ts', 'lib.dom.iterable.d.ts', 'lib.webworker.importscripts.d.ts'],
      types: ['node'],
      typeRoots: [join(npmDir, 'node_modules/@types')],
      strict: true,
      noEmit: true,
      skipLibCheck: true,
      allowImportingTsExtensions: true,
      paths: { 'crucible-agents': [join(npmDir, 'src/node.ts')] },
    });
    const problems = ts.getPreEmitDiagnostics(program).map((d) => `${d.file?.fileName === file ? 'example' : d.file?.fileName}: ${ts.flattenDiagnosticMessageText(d.messageText, '\n')}`);
    assert.deepEqual(problems, []);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('the README\'s usage example streams an answer through a tool call, then run() resolves with the next', async () => {
  server.reset();
  server.enqueue({ toolCalls: [{ name: 'get_weather', arguments: { city: 'Oslo' } }] }, { text: 'It is 21 °C in Oslo.' }, { text: 'Lima too.' });
  const code = (await usageExample())
    .replace(/^import .*$/m, '')
    .replace('http://127.0.0.1:8089/v1', server.openaiBaseURL)
    .replace('process.stdout.write', 'printed.push')
    // What the last line binds is what the example hands its reader.
    .concat('\nreturn { output, usage };');
  const printed: string[] = [];
  const AsyncFunction = Object.getPrototypeOf(async () => undefined).constructor as new (...args: string[]) => (...args: unknown[]) => Promise<{ output: unknown; usage: crucible.RunUsage }>;
  const example = new AsyncFunction('createAgent', 'tool', 'openai', 'printed', code);
  const { output, usage } = await example(crucible.createAgent, crucible.tool, crucible.openai, printed);
  assert.equal(printed.join(''), 'It is 21 °C in Oslo.');
  assert.equal(output, 'Lima too.');
  assert.ok(usage.outputTokens > 0, JSON.stringify(usage));
  // The tool ran with the model's arguments, and the second question continued the session.
  assert.match(server.requests[1]!.messages.at(-1)!.content, /"celsius":21/);
  assert.ok(server.requests[2]!.messages.some((m) => m.role === 'assistant' && m.content === 'It is 21 °C in Oslo.'));
});
