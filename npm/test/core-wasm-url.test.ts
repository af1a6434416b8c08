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

test('useCoreWasm loads the core from the URL given, once, after failed loads it tries again, and is refused once the core has loaded', async () => {
  const wasm = readFileSync(new URL('../wasm/crucible_core_bg.wasm', import.meta.url));
  const asked: string[] = [];
  // The first answer is a server error, the second an app's HTML fallback page: neither load
  // may stay the page's answer once the right bytes are served.
  const failures = [
    (response: import('node:http').ServerResponse) => response.writeHead(503).end('busy'),
    (response: import('node:http').ServerResponse) => response.writeHead(200, { 'content-type': 'text/html' }).end('<!doctype html><p>app</p>'),
  ];
  const server = createServer((request, response) => {
    asked.push(request.url ?? '');
    const fail = failures.shift();
    if (fail) fail(response);
    else response.writeHead(200, { 'content-type': 'application/wasm' }).end(wasm);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const { port } = server.address() as AddressInfo;
    const url = `http://127.0.0.1:${port}/assets/crucible_core_bg.wasm`;
    useCoreWasm(url);
    for (let failed = 0; failed < 2; failed++) {
      await assert.rejects(createAgent({ model: sayingHi }), (e: unknown) => e instanceof CrucibleError && e.code === 'core_unavailable' && e.message.includes(url) && /tries again/.test(e.message));
    }
    useCoreWasm(url); // after a failed load the URL may still be changed
    const agent = await createAgent({ model: sayingHi });
    assert.equal((await agent.run('x')).text, 'hi');
    await (await createAgent({ model: sayingHi })).close();
    assert.deepEqual(asked, Array(3).fill('/assets/crucible_core_bg.wasm'), 'fetched from there, once for every agent after the failures');
    assert.throws(() => useCoreWasm('/elsewhere.wasm'), (e: unknown) => e instanceof CrucibleError && e.code === 'invalid_config' && /before the first createAgent/.test(e.message));
    await agent.close();
  } finally {
    server.close();
  }
});
