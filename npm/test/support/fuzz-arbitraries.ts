/**
 * fast-check arbitraries of hostile input for the public API's property tests
 * (`fuzz-boundary*.test.ts`): strings with lone surrogates and control characters, JSON values
 * with odd numbers and deep nesting, JavaScript values that have no JSON form or that throw
 * when read, JSON Schemas that loop, refuse to compile or never match, compose steps with
 * references that name nothing, and sandbox code that misbehaves.
 *
 * Every property runs with a fixed seed and a number of cases that keeps it to seconds. To
 * explore: `FC_SEED=<n>` another seed, `FC_RUNS=<n>` cases per property, `FC_STATS=1` prints
 * how the cases ended (to see that generators reach past the first check), `FC_SHRINK=1`
 * shrinks a counterexample (each step replays a case against the live agent, so it is off by
 * default). A failure prints its seed and path.
 */
import fc from 'fast-check';

/** The seed of every property: `FC_SEED`, else a fixed one, so a failure reproduces. */
export const FC_SEED = process.env.FC_SEED === undefined ? 0x5eed : Number(process.env.FC_SEED);

/** fast-check parameters: `FC_RUNS` runs, else `fallback`. Each property's fallback keeps it to
 *  a few seconds; the suite stays fast, a long exploration sets `FC_RUNS`. */
export function fcParams(fallback: number): { seed: number; numRuns: number; endOnFailure: boolean } {
  return { seed: FC_SEED, numRuns: process.env.FC_RUNS === undefined ? fallback : Number(process.env.FC_RUNS), endOnFailure: process.env.FC_SHRINK === undefined };
}

const loneSurrogate = fc.integer({ min: 0xd800, max: 0xdfff }).map((unit) => String.fromCharCode(unit));

/** Characters that break naive text handling: controls, separators YAML folds, a BOM, quotes,
 *  escapes, `$` (a compose reference), emoji (a surrogate pair). */
const specialChar = fc.constantFrom('\u0000', '\u0085', '\u2028', '\u2029', '\ufeff', '\ufffd', '"', "'", '\\', '\n', '\r', '\t', '$', '{', '}', '[', ']', ':', '#', '&', '*', '!', '|', '>', '%', '@', '`', '😀', 'é', ' ');

/** One UTF-16 unit or code point: any code point, a lone surrogate, a special character. */
const hostileUnit = fc.oneof(
  { weight: 4, arbitrary: fc.string({ unit: 'binary', minLength: 1, maxLength: 1 }) },
  { weight: 2, arbitrary: fc.string({ unit: 'binary-ascii', minLength: 1, maxLength: 1 }) },
  { weight: 1, arbitrary: loneSurrogate },
  { weight: 2, arbitrary: specialChar },
);

/** Words the runtime gives meaning to, so generated text reaches past the first lookup. */
export const MEANINGFUL_STRINGS = [
  '', ' ', 'upper', 'add', 'shout', 'slugify', 'forge_tool', 'compose', 'sandbox', 'session', 'agent', 'shared', 'object', 'string', 'number',
  '$input', '$input.text', '$prev', '$prev.text', '$steps', '$steps.up', '$steps.up.text', '$', '$5', 'text $input.text', '__proto__', 'constructor',
  'prototype', 'toString', 'hasOwnProperty', 'null', 'undefined', 'NaN', 'true', '{}', '[]', '{"a":', 'format: crucible.tool.v1', '*x', '&a', '!!binary',
  '```json\n{}\n```', 'function execute(input){return input;}', 'x'.repeat(65), 'a'.repeat(64),
] as const;

/** A short string of hostile units, or a meaningful word. */
export const hostileString = fc.oneof(
  { weight: 6, arbitrary: fc.string({ unit: hostileUnit, maxLength: 24 }) },
  { weight: 3, arbitrary: fc.constantFrom(...MEANINGFUL_STRINGS) },
);

/** A long string (tens of thousands to about a million UTF-16 units), ASCII or not. */
export const hugeString = fc
  .tuple(fc.constantFrom('x', 'é', '😀', '\ud800', 'ab\u0000', '$input.text '), fc.integer({ min: 10_000, max: 1_100_000 }))
  .map(([piece, units]) => piece.repeat(Math.ceil(units / piece.length)));

/** A short label of a value for failure messages (huge strings and deep values shortened). */
export function shown(value: unknown): string {
  let text: string;
  try {
    text = fc.stringify(value);
  } catch (error) {
    text = `(a value that throws when printed: ${String(error)})`;
  }
  return text.length > 300 ? `${text.slice(0, 300)}… (${text.length} characters)` : text;
}

/** Numbers JSON and u32/u64 fields choke on. */
export const oddNumber = fc.oneof(
  fc.constantFrom(0, -0, -1, 1, 0.5, -0.5, 1e-320, 1e308, -1e308, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 53, 2 ** 53 + 2, 2 ** 64, Number.NaN, Infinity, -Infinity, Number.MAX_SAFE_INTEGER, Number.MIN_VALUE),
  fc.double(),
  fc.integer(),
);

/** Any JSON value (as a JS value: numbers may be NaN or infinite, which JSON writes as null). */
export const jsonish: fc.Arbitrary<unknown> = fc.letrec<{ value: unknown }>((tie) => ({
  value: fc.oneof(
    { depthSize: 'small', withCrossShrink: true },
    fc.constant(null),
    fc.boolean(),
    oddNumber,
    hostileString,
    fc.array(tie('value'), { maxLength: 4 }),
    fc.dictionary(hostileString, tie('value'), { maxKeys: 4 }),
  ),
})).value;

/** `[[[…]]]` or `{"a":{"a":…}}` nested `depth` deep. */
export function nested(depth: number, kind: 'array' | 'object'): unknown {
  let value: unknown = 1;
  for (let i = 0; i < depth; i++) value = kind === 'array' ? [value] : { a: value };
  // fast-check's report would print it recursively, past the JS stack; a symbol key is not
  // JSON, so the value crosses the boundary as it is.
  Object.defineProperty(value, fc.toStringMethod, { value: () => `nested(${depth}, '${kind}')` });
  return value;
}

/** A value nested deep: mostly within what `JSON.stringify` writes, sometimes past it. */
export const deeplyNested = fc.tuple(fc.oneof({ weight: 4, arbitrary: fc.integer({ min: 60, max: 3000 }) }, { weight: 1, arbitrary: fc.integer({ min: 3000, max: 20_000 }) }), fc.constantFrom('array', 'object') as fc.Arbitrary<'array' | 'object'>).map(([depth, kind]) => nested(depth, kind));

/** JavaScript values that have no JSON form, or whose reading throws or lies. */
export const nonJson: fc.Arbitrary<unknown> = fc.constantFrom(
  () => undefined,
  () => 10n,
  () => Symbol('s'),
  () => () => 1,
  () => new Date(Number.NaN),
  () => new Map([['a', 1]]),
  () => new Uint8Array(3),
  () => Object.create(null),
  () => {
    const cycle: Record<string, unknown> = { a: 1 };
    cycle.self = cycle;
    return cycle;
  },
  () => ({ toJSON: () => { throw new Error('toJSON throws'); } }),
  () => ({ toJSON: () => 10n }),
  () => ({ get text() { throw new Error('getter throws'); } }),
  () => ({ text: 'fine', get extra() { throw new TypeError('getter throws'); } }),
  () => new Proxy({}, { ownKeys: () => { throw new Error('ownKeys trap throws'); } }),
  () => new Proxy({ text: 'x' }, { get: () => { throw new Error('get trap throws'); } }),
  () => Object.defineProperty({}, 'text', { enumerable: true, get: () => 'x'.repeat(2 ** 20) }),
  () => new Error('an error object'),
  () => Promise.resolve({ text: 'a promise' }),
  () => ({ then: (resolve: (v: unknown) => void) => resolve({ text: 'a thenable' }) }),
  () => [undefined, () => 1, Symbol('in array')],
  () => ({ text: undefined }),
  () => new String('boxed'),
  () => ({ text: { toString: () => { throw new Error('toString throws'); } } }),
).map((make) => make());

/** Anything at all: JSON values, deep nesting, huge strings, values without a JSON form. */
export const anyInput: fc.Arbitrary<unknown> = fc.oneof(
  { weight: 6, arbitrary: jsonish },
  { weight: 2, arbitrary: nonJson },
  { weight: 1, arbitrary: deeplyNested },
  { weight: 1, arbitrary: hugeString },
  { weight: 2, arbitrary: fc.anything({ withBigInt: true, withBoxedValues: true, withDate: true, withMap: true, withSet: true, withTypedArray: true, withSparseArray: true, withNullPrototype: true, withObjectString: true }) },
);

// ---------------------------------------------------------------------------------------------
// JSON Schemas

/** `pattern`s: invalid ones, ECMA-only syntax, catastrophic backtracking, huge repetitions. */
export const regexPattern = fc.oneof(
  fc.constantFrom(
    '(', ')', '[', '[z-a]', '*', 'a**', '\\', '(?<=a)b', '(?<!a)b', '(?=a)', '(?!a)', '(a)\\1', '\\p{Bogus}', '\\p{L}', '\\u{110000}', '\\u{1F600}', '[[:alpha:]]',
    '(a+)+$', '(a|a)*$', '^(a|aa)+$', '^(a+)+\\1$', '(?=(a+))+b', '(.*a){20}', 'a{1000000}', 'a{2147483648}', '(a{1000}){1000}', '.{0,65535}', '[\\s\\S]{1,100000}', '(?i)x', '(?x) a',
    '\\d+\\w*\\b', '^[a-z0-9-]+$', '\\cA', '\\k<x>', '(?<x>a)\\k<x>', '\\Z', '\\z', '\\A', '(?P<n>a)', '[\\d-z]', '\\0', '\\8', '/', '^$', '',
  ),
  hostileString,
);

const refTarget = fc.oneof(
  fc.constantFrom('#', '#/', '#/$defs/a', '#/$defs/b', '#/definitions/a', '#/properties/text', '#/$defs/a/$ref', '#/$defs/%25', '#a', '#/items/0',
    'http://example.com/schema', 'https://json-schema.org/draft/2020-12/schema', 'urn:uuid:1', 'file:///etc/passwd', 'data:application/json,{}', '../x', '//x', 'a b', ':', '#/$defs/a#'),
  hostileString,
);

const typeName = fc.oneof(
  fc.constantFrom('object', 'string', 'number', 'integer', 'array', 'boolean', 'null', 'bogus', 'any', 'Object', ''),
  fc.constantFrom(['string', 'null'], [], ['object', 'object'], [1], 'string,number'),
);

const formatName = fc.constantFrom('email', 'date-time', 'date', 'time', 'uri', 'uri-reference', 'ipv4', 'ipv6', 'hostname', 'regex', 'uuid', 'duration', 'json-pointer', 'bogus', '');

/** JSON Schemas, valid or not: every keyword family with odd operands, `$ref` loops,
 *  boolean schemas, schemas stringified. */
export const oddSchema: fc.Arbitrary<unknown> = fc.letrec<{ schema: unknown }>((tie) => {
  const schema = tie('schema');
  const entry = <T>(key: string, value: fc.Arbitrary<T>) => value.map((v) => [key, v] as const);
  // A few keywords per schema (a record of every optional keyword would nest exponentially).
  const keyword = fc.oneof(
    entry('type', typeName),
    entry('properties', fc.dictionary(fc.oneof(fc.constantFrom('text', 'a', 'b', '__proto__', ''), hostileString), schema, { maxKeys: 2 })),
    entry('required', fc.oneof(fc.array(fc.oneof(fc.constantFrom('text', 'a'), hostileString), { maxLength: 3 }), jsonish)),
    entry('additionalProperties', fc.oneof(fc.boolean(), schema)),
    entry('items', fc.oneof(schema, fc.array(schema, { maxLength: 2 }))),
    entry('prefixItems', fc.array(schema, { maxLength: 2 })),
    entry('pattern', regexPattern),
    entry('patternProperties', fc.dictionary(regexPattern, schema, { maxKeys: 2 })),
    entry('propertyNames', schema),
    entry('format', formatName),
    entry('enum', fc.oneof(fc.array(jsonish, { maxLength: 4 }), jsonish)),
    entry('const', jsonish),
    entry('minLength', oddNumber),
    entry('maxLength', oddNumber),
    entry('minimum', oddNumber),
    entry('maximum', oddNumber),
    entry('exclusiveMinimum', fc.oneof(oddNumber, fc.boolean())),
    entry('multipleOf', oddNumber),
    entry('minItems', oddNumber),
    entry('maxItems', oddNumber),
    entry('uniqueItems', fc.oneof(fc.boolean(), jsonish)),
    entry('minProperties', oddNumber),
    entry('$ref', refTarget),
    entry('$dynamicRef', refTarget),
    entry('$recursiveRef', fc.constant('#')),
    entry('$id', refTarget),
    entry('$anchor', hostileString),
    entry('$schema', fc.oneof(fc.constantFrom('http://json-schema.org/draft-04/schema#', 'http://json-schema.org/draft-07/schema#', 'https://json-schema.org/draft/2020-12/schema', 'bogus'), hostileString)),
    entry('$defs', fc.dictionary(fc.constantFrom('a', 'b', '%', ''), schema, { maxKeys: 2 })),
    entry('definitions', fc.dictionary(fc.constantFrom('a', 'b'), schema, { maxKeys: 2 })),
    entry('allOf', fc.array(schema, { maxLength: 2 })),
    entry('anyOf', fc.array(schema, { maxLength: 2 })),
    entry('oneOf', fc.array(schema, { maxLength: 2 })),
    entry('not', schema),
    entry('if', schema),
    entry('then', schema),
    entry('else', schema),
    entry('dependentSchemas', fc.dictionary(fc.constantFrom('text', 'a'), schema, { maxKeys: 2 })),
    entry('contentEncoding', fc.constantFrom('base64', 'bogus')),
    entry('unevaluatedProperties', fc.oneof(fc.boolean(), schema)),
    entry('default', jsonish),
  );
  return {
    schema: fc.oneof(
      { depthSize: 'small', maxDepth: 3 },
      { weight: 1, arbitrary: fc.boolean() },
      { weight: 1, arbitrary: fc.constant({}) },
      { weight: 1, arbitrary: jsonish },
      { weight: 6, arbitrary: fc.array(keyword, { minLength: 1, maxLength: 4 }).map((entries) => Object.fromEntries(entries)) },
    ),
  };
}).schema;

/** An object schema with a `text` property, and odd keywords beside it or inside it, so the
 *  request gets past the shape check to the schema compiler and the tests. */
export const objectSchema: fc.Arbitrary<unknown> = fc
  .tuple(oddSchema, fc.oneof({ weight: 3, arbitrary: oddSchema }, { weight: 1, arbitrary: fc.constantFrom<unknown>({ $ref: '#' }, { $ref: '#/properties/text' }, { items: { $ref: '#' } }, { anyOf: [{ $ref: '#' }, { type: 'string' }] }) }))
  .map(([outer, text]) => ({ ...(typeof outer === 'object' && outer !== null && !Array.isArray(outer) ? outer : {}), type: 'object', properties: { text } }));

/** Schemas that loop through `$ref` without consuming input, or refer to themselves. */
export const loopingSchema = fc.constantFrom<unknown>(
  { $ref: '#' },
  { type: 'object', properties: { text: { $ref: '#' } } },
  { $defs: { a: { $ref: '#/$defs/a' } }, $ref: '#/$defs/a' },
  { $defs: { a: { $ref: '#/$defs/b' }, b: { $ref: '#/$defs/a' } }, type: 'object', properties: { text: { $ref: '#/$defs/a' } } },
  { definitions: { a: { allOf: [{ $ref: '#/definitions/a' }] } }, allOf: [{ $ref: '#/definitions/a' }] },
  { $id: 'http://x/s', type: 'object', properties: { text: { $ref: 'http://x/s' } } },
  { $dynamicAnchor: 'a', $dynamicRef: '#a', type: 'object' },
  { type: 'object', properties: { text: { anyOf: [{ $ref: '#/properties/text' }] } } },
  { not: { $ref: '#' } },
  { if: { $ref: '#' }, then: {}, else: {} },
  { type: 'object', additionalProperties: { $ref: '#' }, properties: { text: { type: 'string' } } },
  { $ref: '#/properties/text', properties: { text: { $ref: '#' } } },
  { $ref: 'http://example.com/remote.json' },
  { $ref: '#/$defs/missing' },
);

// ---------------------------------------------------------------------------------------------
// Forge requests

/** Pieces of mapping syntax that random mapping text is made of: escapes, roots, brackets and
 *  quotes left open, template literals, multi-byte characters next to every boundary. */
const mappingPiece = fc.constantFrom('$', '$$', '$$$', '$input', '$prev', '$steps.', '$steps[', '${', '${input', '${prev.', '[', ']', '[0]', '[99999999999999999999]',
  '[-1]', '["', '"]', '["first-name"]', "['", "']", "['a.b']", '"', "'", '\\', '.', '-', '0', 'text', 'up', 'é', 'e\u0301', '😀', '{', '}', ' ');

/** Text made of mapping syntax pieces. */
const mappingText = fc.array(mappingPiece, { minLength: 1, maxLength: 10 }).map((pieces) => pieces.join(''));

/** A reference or text in a compose step's `inputMapping`. */
const mappingValue: fc.Arbitrary<unknown> = fc.oneof(
  fc.constantFrom('$input', '$input.text', '$input.text.0', '$input.a.b.c', '$input.0', '$prev', '$prev.text', '$prev.sum', '$steps', '$steps.', '$steps.up', '$steps.up.text',
    '$steps.step1', '$steps.nope.x', '$', '$$input', '$input.', '$input..text', 'Summarize: $prev.text and $input.text', '$input.text$input.text', '$input.first-name',
    '$prev.__proto__', '$input.constructor', '$input.text.length', '\\$input', '$INPUT', '$input.😀', '$input["first-name"]', "$input['text']", '$prev.items[0].id',
    '$steps["a.b"].text', '$steps["0"]', '$steps[0]', '${input.text}', '${ prev.text }', 'const a = `${previousValue}`', '$$${input.text}', '$input[i]',
    '$input["unterminated', '$input.título', '$input.text-based', '$input["k"]["0"][0]'),
  mappingText,
  jsonish,
);

const stepTool = fc.oneof({ weight: 4, arbitrary: fc.constantFrom('upper', 'add', 'shout', 'slugify', 'forge_tool', 'nope', '', 'self') }, { weight: 1, arbitrary: hostileString });

/** Compose steps with odd tools, names and references. */
export const composeSteps = fc.array(
  fc.record(
    {
      name: fc.oneof(fc.constantFrom('up', 'step1', 'a', '', 'up', 'a.b', '0', 'é'), hostileString),
      tool: stepTool,
      inputMapping: fc.oneof(
        { weight: 4, arbitrary: fc.dictionary(fc.constantFrom('text', 'a', 'b', 'extra', '__proto__'), mappingValue, { maxKeys: 3 }) },
        // The whole mapping as one reference (`"$prev"`), or text that is not one.
        { weight: 1, arbitrary: fc.oneof(fc.constantFrom('$prev', '$input', '$prev.text', '$steps.up', '$steps["a.b"]'), mappingText) },
        { weight: 1, arbitrary: jsonish },
        { weight: 1, arbitrary: deeplyNested },
      ),
    },
    { requiredKeys: ['tool'] },
  ),
  { maxLength: 6 },
);

/** Bodies of `execute` that misbehave: loops, floods, huge allocations, denied APIs, values with
 *  no JSON form, throws of odd values, prototype games. */
const badBody = fc.constantFrom(
  'return input;',
  'return { text: String(input.text).toUpperCase() };',
  'while (true) {}',
  'for (;;) { [].push(1); }',
  'return new Array(2 ** 32 - 1).fill(0);',
  "return { text: 'x'.repeat(2 ** 28) };",
  "let s = 'x'; for (let i = 0; i < 40; i++) s += s; return { text: s };",
  'const a = []; for (let i = 0; i < 1e8; i++) a.push({ i }); return a;',
  "return eval('1');",
  "return Function('return 1')();",
  "return (() => {}).constructor('return globalThis')();",
  'return globalThis;',
  'function f() { return f(); } return f();',
  "return JSON.parse('['.repeat(100000) + ']'.repeat(100000));",
  'const o = {}; o.self = o; return o;',
  'return { get text() { throw new Error("getter"); } };',
  'return { toJSON() { return 1; }, text: "x" };',
  'return new Proxy({}, { get() { throw 1; }, ownKeys() { throw 2; } });',
  'return 10n;',
  'return Symbol("s");',
  'return undefined;',
  'return NaN;',
  'return () => 1;',
  'throw undefined;',
  'throw { message: 1, code: "internal" };',
  "throw new Error('x'.repeat(100000));",
  'return Promise.reject(new Error("rejected"));',
  'return new Promise(() => {});',
  'async function spin() { for (;;) await 0; } return spin();',
  'for (let i = 0; i < 1e6; i++) Promise.resolve().then(() => {}); return 1;',
  "return /(a+)+$/.test('a'.repeat(40) + 'b');",
  "return fetch('https://example.com');",
  "return crypto.sha256('x');",
  'Object.prototype.text = "polluted"; return {};',
  'Array.prototype.push = null; return [1];',
  "return { text: '\\ud800' };",
  "return { ['__proto__']: { text: 1 } };",
  'return [1, 2, 3].sort(() => { throw 1; });',
  'return new Array(1e7).join("x");',
  'return "x".padEnd(2 ** 30);',
  'debugger; return 1;',
);

/** Sandbox code: a bad body in `execute`, a fragment of one, or text that is no program. */
export const sandboxCode = fc.oneof(
  { weight: 5, arbitrary: badBody.map((body) => `function execute(input) { ${body} }`) },
  { weight: 1, arbitrary: badBody.map((body) => `async function execute(input) { ${body} }`) },
  { weight: 1, arbitrary: fc.tuple(badBody, fc.nat()).map(([body, at]) => { const code = `function execute(input) { ${body} }`; return code.slice(0, at % code.length); }) },
  { weight: 1, arbitrary: fc.constantFrom('const execute = 1;', 'var execute = (i) => i;', 'class execute {}', 'function execute(', 'export function execute(i) { return i; }',
    'import x from "y"; function execute(i) { return i; }', '`${', '/*', '<!-- html comment', '#!/bin/sh', '"use strict"; function execute(i) { with (i) {} }', 'function execute(i) { return i }'.repeat(2000)) },
  { weight: 1, arbitrary: hostileString },
);

/** Any schema a request may give: odd, looping, stringified, nested past every limit. */
export const anySchema = fc.oneof(
  { weight: 3, arbitrary: objectSchema },
  { weight: 2, arbitrary: oddSchema },
  { weight: 2, arbitrary: loopingSchema },
  { weight: 1, arbitrary: oddSchema.map((s) => JSON.stringify(s) ?? 'null') },
  { weight: 1, arbitrary: deeplyNested },
);

/**
 * Requests that are valid but for one part: the sandbox code, the compose steps, or a schema
 * (the test cases stay valid), so each part reaches its own stage (the sandbox, the pipeline
 * builder, the schema compiler and the tests) instead of an earlier refusal.
 */
export function forgeRequestOnePartOdd(sandbox: Record<string, unknown>, compose: Record<string, unknown>): fc.Arbitrary<Record<string, unknown>> {
  return fc.oneof(
    sandboxCode.map((code) => ({ ...sandbox, implementation: { mode: 'sandbox', code } })),
    composeSteps.map((steps) => ({ ...compose, implementation: { mode: 'compose', steps } })),
    fc.tuple(fc.constantFrom(sandbox, compose), fc.constantFrom('inputSchema', 'outputSchema'), anySchema).map(([base, key, schema]) => ({ ...base, [key]: schema })),
  );
}

/** A forge request built around a valid one, each field possibly replaced by something odd. */
export function forgeRequest(base: Record<string, unknown>): fc.Arbitrary<Record<string, unknown>> {
  const field = <T>(valid: T, odd: fc.Arbitrary<unknown>) => fc.oneof({ weight: 3, arbitrary: fc.constant(valid) }, { weight: 1, arbitrary: odd });
  const implementation = fc.oneof(
    fc.record({ mode: fc.constant('sandbox'), code: sandboxCode, allowlist: fc.oneof(fc.constant(undefined), fc.array(fc.constantFrom('fetch', 'crypto', 'bogus'), { maxLength: 2 }), jsonish) }, { requiredKeys: ['mode', 'code'] }),
    fc.record({ mode: fc.constant('compose'), steps: composeSteps }),
    fc.record({ mode: fc.oneof(fc.constantFrom('js', 'pipeline', 'chain', 'SANDBOX', ' compose ', 'bogus'), hostileString), code: fc.oneof(sandboxCode, jsonish), steps: fc.oneof(composeSteps, jsonish) }, { requiredKeys: [] }),
    jsonish,
    sandboxCode,
  );
  const testCases = fc.oneof(
    fc.array(
      fc.record(
        {
          input: fc.oneof({ weight: 6, arbitrary: fc.record({ text: hostileString }) }, { weight: 1, arbitrary: fc.record({ text: hugeString }) }, { weight: 2, arbitrary: jsonish }, { weight: 1, arbitrary: deeplyNested }),
          expectedOutput: fc.oneof(fc.record({ text: hostileString }), fc.record({ slug: hostileString }), jsonish, fc.constant(undefined)),
        },
        { requiredKeys: ['input'] },
      ),
      { minLength: 1, maxLength: 34 },
    ),
    jsonish,
    fc.constant(Array.from({ length: 33 }, (_, i) => ({ input: { text: `t${i}` } }))),
  );
  const schema = anySchema;
  return fc
    .record({
      name: field(base.name, fc.oneof(hostileString, jsonish, fc.constant('x'.repeat(65)), fc.constant('forge_tool'), fc.constant('upper'))),
      description: field(base.description, fc.oneof({ weight: 4, arbitrary: hostileString }, { weight: 1, arbitrary: hugeString }, { weight: 2, arbitrary: jsonish })),
      inputSchema: field(base.inputSchema, schema),
      outputSchema: field(base.outputSchema, schema),
      implementation: field(base.implementation, implementation),
      testCases: field(base.testCases, testCases),
      scope: fc.oneof(fc.constant(undefined), hostileString, jsonish),
      extra: fc.option(fc.dictionary(fc.constantFrom('tests', 'examples', 'parameters', 'steps', 'code', 'mode', 'returns', 'request', 'tool_name', '__proto__'), anyInput, { maxKeys: 2 }), { nil: undefined }),
    })
    .map(({ extra, ...request }) => {
      const out: Record<string, unknown> = { ...request };
      if (extra) for (const [k, v] of Object.entries(extra)) Object.defineProperty(out, k, { value: v, enumerable: true, configurable: true, writable: true });
      return out;
    });
}

/**
 * `value` with the value at a generated path replaced by `replacement`: each step picks a key
 * of the object or array it reaches (by index, modulo their number); the path ends early at a
 * value with no keys. Copies what it changes, so `value` itself stays as it was.
 */
export function replacedAt(value: unknown, steps: readonly number[], replacement: unknown): unknown {
  if (steps.length === 0 || value === null || typeof value !== 'object') return replacement;
  const keys = Object.keys(value);
  if (keys.length === 0) return replacement;
  const key = keys[steps[0]! % keys.length]!;
  const copy: Record<string, unknown> = Array.isArray(value) ? ([...value] as never) : { ...value };
  copy[key] = replacedAt((value as Record<string, unknown>)[key], steps.slice(1), replacement);
  return copy;
}

/** A path for {@link replacedAt}. */
export const path = fc.array(fc.nat(), { minLength: 1, maxLength: 6 });

/** A value as JSON text, as a model or a server would send it (one too deep for
 *  JSON.stringify: a start of one, which is no JSON either). */
export function jsonTextOf(value: unknown): string {
  try {
    return JSON.stringify(value) ?? '';
  } catch {
    return '{"name":"too_deep","inputSchema":[[[[';
  }
}
