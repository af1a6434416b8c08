import { SLUGIFY_FORGE } from './test/support/forge-fixtures.js';
const { createSandbox } = await import('/work/main/npm/src/node.js');
const sb: any = await createSandbox({ poolSize: 1 });
const code = (SLUGIFY_FORGE.implementation as any).code;
const seq: number[] = [];
for (let i = 0; i < 4000; i++) { const s = performance.now(); await sb.execute({ code, input: { text: 'Hello World! ' + (i % 10) }, allowlist: [] }); seq.push(performance.now() - s); }
const med = (x: number[]) => { const s = [...x].sort((a, b) => a - b); return (s[s.length >> 1] * 1000).toFixed(0); };
console.log('sequential median us', med(seq));
await sb.close(); 
