// `useCoreWasm` (browser entry): the core's wasm from a URL the app serves, for bundlers that
// copy no assets. Run in Node through the browser entry, over real HTTP; its own file, since
// the core loads once per process.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createServer } from 'node:http';
import { readFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { createAgent, CrucibleError, useCoreWasm, type ModelProvider } from '../src/browser.js';

/** A test double: answers every request with "hi". */
const sayingHi: ModelProvider = {
  id: 'double:hi',
  async *stream() {
    yield { type: 'text', delta: 'hi' };
    yield { type: 'finish', finishReason: 'stop' };
  },
};

test('useCoreWasm loads the core from the URL given, once, and is refused once the core has loaded', async () => {
  const wasm = readFileSync(new URL('../wasm/crucible_core_bg.wasm', import.meta.url));
  const asked: string[] = [];
  const server = createServer((request, response) => {
    asked.push(request.url ?? '');
    response.writeHead(200, { 'content-type': 'application/wasm' }).end(wasm);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const { port } = server.address() as AddressInfo;
    useCoreWasm(`http://127.0.0.1:${port}/assets/crucible_core_bg.wasm`);
    const agent = await createAgent({ model: sayingHi });
    assert.equal((await agent.run('x')).text, 'hi');
    await (await createAgent({ model: sayingHi })).close();
    assert.deepEqual(asked, ['/assets/crucible_core_bg.wasm'], 'fetched from there, once for every agent');
    assert.throws(() => useCoreWasm('/elsewhere.wasm'), (e: unknown) => e instanceof CrucibleError && e.code === 'invalid_config' && /before the first createAgent/.test(e.message));
    await agent.close();
  } finally {
    server.close();
  }
});
