// Fixtures of the emergent tests: a correct sandbox forge request and the judge test double's
// verdict reply (served by the mock LLM server).
import type { ForgeRequest } from '../../src/emergent/types.js';
import type { MockReply } from './mock-llm-server.js';

/** The issue-3 `slugify` tool as a forge request, with two passing test cases. */
export const SLUGIFY_FORGE: ForgeRequest = {
  name: 'slugify',
  description: 'Turn text into a URL slug',
  inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  outputSchema: { type: 'object', properties: { slug: { type: 'string' } }, required: ['slug'] },
  implementation: {
    mode: 'sandbox',
    code: "function execute(input){const s=input.text.toLowerCase().replace(/[^a-z0-9]+/g,'-').replace(/^-|-$/g,'');return {slug:s};}",
  },
  testCases: [
    { input: { text: 'Hello World!' }, expectedOutput: { slug: 'hello-world' } },
    { input: { text: 'Rust & Wasm' }, expectedOutput: { slug: 'rust-wasm' } },
  ],
};

/** slugify that spins in a native regex (no loop limit counts it) on the input "spin", until
 *  the sandbox's deadline; its tests pass. */
export const SPINNER_FORGE: ForgeRequest = {
  ...SLUGIFY_FORGE,
  name: 'spinner',
  implementation: { mode: 'sandbox', code: "function execute(input){ if (input.text === 'spin') /(a+)+$/.test('a'.repeat(40) + 'b'); return { slug: input.text }; }" },
  testCases: [
    { input: { text: 'a' }, expectedOutput: { slug: 'a' } },
    { input: { text: 'b' }, expectedOutput: { slug: 'b' } },
  ],
};

/** The judge's answer: a verdict JSON that approves (or not, with the given correctness). */
export function verdictReply(approved: boolean, correctness = 0.95): MockReply {
  return {
    text: JSON.stringify({ approved, safety: 0.95, correctness, determinism: 0.95, boundedness: 0.9, confidence: 0.9, reasoning: approved ? 'ok' : 'wrong output' }),
  };
}
