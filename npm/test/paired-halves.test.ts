// Property test of PairedHalves (npm/src/providers/paired-halves.ts): a provider's text and
// call arguments, cut anywhere (between the halves of a surrogate pair too) and interleaved,
// come out as the same text, with no pair left split between two deltas of a kind.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { PairedHalves } from '../src/providers/paired-halves.js';
import { iterations } from './support/seeded.js';

type Step = { done: boolean; value?: { type: string; delta?: string; index?: number; id?: string; argumentsDelta?: string } };

/** Every step the agent's adapter would hand the core for `steps`, queued ones included. */
function through(steps: Step[]): Step[] {
  const halves = new PairedHalves();
  const out: Step[] = [];
  for (const step of steps) {
    out.push(halves.join(step));
    for (let queued = halves.takeQueued(); queued !== undefined; queued = halves.takeQueued()) out.push(queued as Step);
  }
  return out;
}

const isHigh = (unit: number) => unit >= 0xd800 && unit <= 0xdbff;
const isLow = (unit: number) => unit >= 0xdc00 && unit <= 0xdfff;

/** `text` cut at `cuts` (positions in UTF-16 units, any of them). */
function pieces(text: string, cuts: number[]): string[] {
  const at = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((a, b) => a - b);
  const out: string[] = [];
  let from = 0;
  for (const cut of [...at, text.length]) {
    out.push(text.slice(from, cut));
    from = cut;
  }
  return out;
}

test('text and arguments cut anywhere come out whole, and no surrogate pair stays split between deltas', () => {
  const text = fc.string({ unit: fc.constantFrom('a', 'é', '🌍', '😀', '\ud800', '\udc00', '"'), maxLength: 40 });
  const cuts = fc.array(fc.nat(), { maxLength: 12 });
  fc.assert(
    fc.property(text, cuts, text, cuts, fc.boolean(), (said, saidCuts, args, argCuts, endsWithDone) => {
      const textSteps: Step[] = pieces(said, saidCuts).map((delta) => ({ done: false, value: { type: 'text', delta } }));
      const callSteps: Step[] = pieces(args, argCuts).map((argumentsDelta, i) => ({ done: false, value: { type: 'tool_call', index: 0, ...(i === 0 ? { id: 'c1' } : {}), argumentsDelta } }));
      // Interleaved: text and the call's pieces take turns.
      const steps: Step[] = [];
      for (let i = 0; i < Math.max(textSteps.length, callSteps.length); i++) steps.push(...[textSteps[i], callSteps[i]].filter((s): s is Step => s !== undefined));
      steps.push(endsWithDone ? { done: true } : { done: false, value: { type: 'finish' } });
      const out = through(steps);
      const of = (type: string) => out.filter((s) => s.value?.type === type).map((s) => (type === 'text' ? s.value!.delta! : s.value!.argumentsDelta!));
      assert.equal(of('text').join(''), said);
      assert.equal(of('tool_call').join(''), args);
      for (const kind of [of('text'), of('tool_call')]) {
        for (let i = 0; i + 1 < kind.length; i++) {
          const [end, next] = [kind[i]!, kind.slice(i + 1).find((d) => d !== '') ?? ''];
          assert.ok(!(end !== '' && isHigh(end.charCodeAt(end.length - 1)) && isLow(next.charCodeAt(0))), `a pair split between ${JSON.stringify(end)} and ${JSON.stringify(next)}`);
        }
      }
      // The end comes last, after every half held back.
      assert.deepEqual(out.at(-1), steps.at(-1));
    }),
    { numRuns: iterations(500) },
  );
});
