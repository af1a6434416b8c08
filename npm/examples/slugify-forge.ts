// The example tool the demo forges (the terminal demo and the demo page): a correct sandbox
// `slugify` with two test cases. Plain data, so both the Node script and the page's bundle
// can import it.
export const SLUGIFY_EXAMPLE = {
  name: 'slugify',
  description: 'Turns text into a URL slug: lowercase words joined by hyphens',
  inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
  outputSchema: { type: 'object', properties: { slug: { type: 'string' } }, required: ['slug'] },
  implementation: {
    mode: 'sandbox' as const,
    code: "function execute(input) { const s = input.text.toLowerCase().replace(/[^a-z0-9]+/g, '-').replace(/^-|-$/g, ''); return { slug: s }; }",
  },
  testCases: [
    { input: { text: 'Hello World!' }, expectedOutput: { slug: 'hello-world' } },
    { input: { text: 'Rust & Wasm' }, expectedOutput: { slug: 'rust-wasm' } },
  ],
};
