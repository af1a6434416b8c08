/**
 * Host tools written in TypeScript: `tool({ name, description, inputSchema, execute })`.
 * `inputSchema` is JSON Schema, or a Standard Schema object that can give JSON Schema
 * (Zod 4 and others implementing `~standard.jsonSchema`, or a `toJSONSchema()` method).
 */
import { CrucibleError, describeType, isRecord, isThenable } from './errors.js';

/** A JSON Schema object. */
export type JsonSchema = Record<string, unknown>;

/** One problem a Standard Schema found in a value. */
export interface StandardIssue {
  readonly message: string;
  readonly path?: ReadonlyArray<PropertyKey | { readonly key: PropertyKey }>;
}

/** What a Standard Schema's `validate` gives: the parsed value, or the issues. */
export type StandardResult<Output = unknown> = { readonly value: Output; readonly issues?: undefined } | { readonly issues: ReadonlyArray<StandardIssue> };

/** The `~standard` properties of a Standard Schema that Crucible reads. */
interface StandardProps {
  version: number;
  vendor: string;
  validate?: (value: unknown) => StandardResult | Promise<StandardResult>;
  types?: { readonly input: unknown; readonly output: unknown } | undefined;
}

/** How a Standard Schema gives JSON Schema through `~standard` (Standard JSON Schema). */
interface StandardJsonSchemaProps {
  input: (options: { target: string }) => JsonSchema;
}

/**
 * A schema object implementing Standard Schema (Zod 4, ArkType, …) that can also give JSON
 * Schema: `~standard.jsonSchema`, or a `toJSONSchema()` method (one of them is required; a
 * Standard Schema with neither, such as a Valibot schema, cannot say what the model may send:
 * pass its JSON Schema instead). The JSON Schema is what the model sees and what the core
 * checks first; `validate` then parses the value, so its defaults, transforms and refinements
 * apply as they would anywhere else.
 */
export type StandardJsonSchemaLike =
  | { '~standard': StandardProps & { jsonSchema: StandardJsonSchemaProps }; toJSONSchema?: () => JsonSchema }
  | { '~standard': StandardProps & { jsonSchema?: StandardJsonSchemaProps }; toJSONSchema: () => JsonSchema };

/** The type a Standard Schema parses to (`z.infer` for Zod); `any` for a JSON Schema. */
export type InferSchemaOutput<S> = S extends { readonly '~standard': { readonly types?: infer T } }
  ? NonNullable<T> extends { readonly output: infer O }
    ? O
    : any // eslint-disable-line @typescript-eslint/no-explicit-any
  : any; // eslint-disable-line @typescript-eslint/no-explicit-any

/** What a tool's `execute` receives besides its arguments. */
export interface ToolExecuteContext {
  /** Aborted when the run is aborted (or the direct `agent.forge` / `agent.tools.call` that
   *  reached this tool, when it was given a signal). */
  signal: AbortSignal;
  /** The run's id; `direct_…` in a direct forge or call given a signal, `''` in one without,
   *  and `background_…` while an automatic promotion re-runs a compose tool's tests (no run
   *  of the agent's: the `tool.promoted` or `promotion.rejected` event that ends it carries `''`). */
  runId: string;
  callId: string;
  sessionId: string;
}

/** Options of {@link tool}. */
export interface ToolOptions<Args = any, Result = unknown> {
  /** Identifier the model calls: `^[A-Za-z0-9_-]{1,64}$`. */
  name: string;
  description: string;
  inputSchema: JsonSchema | StandardJsonSchemaLike;
  /** When given, every result is validated against it (an invalid result is an error result). */
  outputSchema?: JsonSchema | StandardJsonSchemaLike;
  execute: (args: Args, context: ToolExecuteContext) => Result | Promise<Result>;
  /**
   * Calls wait for a human decision before executing: the run pauses (`status: 'paused'`)
   * and continues with `agent.resume()`. A predicate decides per call; if it throws, the call
   * waits for approval (fail closed).
   */
  needsApproval?: boolean | ((args: Args) => boolean | Promise<boolean>);
}

/** A host tool, ready to pass to `createAgent({ tools })`. Its `execute` and `needsApproval`
 *  take the arguments as the model sent them (JSON): with a Standard Schema, `tool()` made them
 *  parse those first, so call them with the model's JSON, not with already parsed values. */
export interface HostTool<Args = any, Result = unknown> {
  readonly kind: 'host';
  readonly name: string;
  readonly description: string;
  readonly inputSchema: JsonSchema;
  readonly outputSchema: JsonSchema | undefined;
  readonly execute: (args: Args, context: ToolExecuteContext) => Result | Promise<Result>;
  readonly needsApproval: boolean | ((args: Args) => boolean | Promise<boolean>);
}

/** Resolves JSON Schema from a plain schema or a Standard Schema object. */
export function toJsonSchema(schema: JsonSchema | StandardJsonSchemaLike, where: string): JsonSchema {
  const standard = (schema as StandardJsonSchemaLike)['~standard'];
  if (standard && typeof standard === 'object') {
    if (standard.jsonSchema && typeof standard.jsonSchema.input === 'function') {
      return stripMeta(standard.jsonSchema.input({ target: 'draft-2020-12' }));
    }
    if (typeof (schema as StandardJsonSchemaLike).toJSONSchema === 'function') {
      return stripMeta((schema as StandardJsonSchemaLike).toJSONSchema!());
    }
    throw new CrucibleError(
      'invalid_config',
      `${where}: this Standard Schema (${standard.vendor}) cannot produce JSON Schema; use a schema library that can (Zod 4: the \`zod\` package at version 4, whose schemas carry it), or pass its JSON Schema instead`,
    );
  }
  if (!isRecord(schema)) {
    throw new CrucibleError('invalid_config', `${where} must be a JSON Schema object`);
  }
  // `{ city: z.string() }` or `{ city: { type: 'string' } }` is a schema with no keyword of
  // JSON Schema, so it accepts anything: the model would be offered no parameters, and the
  // tool would get whatever it sent, unchecked.
  const fields = schema as Record<string, unknown>;
  const keys = Object.keys(fields);
  if (keys.length > 0 && !keys.some((k) => SCHEMA_KEYWORDS.has(k)) && keys.every((k) => isRecord(fields[k]) || typeof fields[k] === 'function')) {
    const first = JSON.stringify(keys[0]);
    throw new CrucibleError(
      'invalid_config',
      `${where} looks like a map of properties ({ ${first}: … }), not a JSON Schema: write { type: 'object', properties: { ${first}: … } }, or z.object({ ${first}: … }) for a Zod shape`,
    );
  }
  return schema as JsonSchema;
}

/** Keywords of JSON Schema (2020-12 and drafts before it; OpenAPI's `nullable`): a schema
 *  object using none of them, whose fields are all objects, is a properties map by mistake. */
const SCHEMA_KEYWORDS: ReadonlySet<string> = new Set([
  '$schema', '$id', '$ref', '$defs', '$anchor', '$dynamicRef', '$dynamicAnchor', '$vocabulary', '$comment', 'definitions',
  'type', 'properties', 'required', 'additionalProperties', 'patternProperties', 'propertyNames', 'minProperties', 'maxProperties',
  'dependentRequired', 'dependentSchemas', 'dependencies', 'unevaluatedProperties', 'unevaluatedItems',
  'items', 'prefixItems', 'additionalItems', 'contains', 'minContains', 'maxContains', 'minItems', 'maxItems', 'uniqueItems',
  'enum', 'const', 'anyOf', 'oneOf', 'allOf', 'not', 'if', 'then', 'else',
  'title', 'description', 'default', 'examples', 'deprecated', 'readOnly', 'writeOnly', 'nullable',
  'format', 'pattern', 'minLength', 'maxLength', 'contentEncoding', 'contentMediaType', 'contentSchema',
  'minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum', 'multipleOf',
]);

// `$schema` URIs are fine for jsonschema but some providers reject unknown keys in tools.
function stripMeta(schema: JsonSchema): JsonSchema {
  const { $schema: _ignored, ...rest } = schema;
  return rest;
}

/** Names a tool may have: what OpenAI, Anthropic and the core all accept. */
const TOOL_NAME = /^[A-Za-z0-9_-]{1,64}$/;

/** `toJsonSchema`, with any failure (a vendor's converter throwing too) as `invalid_config`. */
function resolveSchema(schema: JsonSchema | StandardJsonSchemaLike, where: string): JsonSchema {
  try {
    return toJsonSchema(schema, where);
  } catch (cause) {
    if (cause instanceof CrucibleError) throw cause;
    const detail = cause instanceof Error ? cause.message : String(cause);
    throw new CrucibleError('invalid_config', `${where} cannot be turned into JSON Schema: ${detail}`, { cause });
  }
}

/** A JSON Schema object, or a Standard Schema (some vendors', ArkType's, are callable). */
function isSchemaLike(value: unknown): boolean {
  return isRecord(value) || (typeof value === 'function' && '~standard' in value);
}

/**
 * Defines a host tool. Throws `invalid_config` when the options cannot make one.
 *
 * With a Standard Schema (Zod 4 and others) as `inputSchema`, `execute` is typed with what the
 * schema parses to, and gets the parsed arguments: the core checks the model's arguments
 * against the schema's JSON Schema, then the schema's own `validate` runs (defaults,
 * transforms, refinements); issues it finds fail the call with `invalid_arguments`, which the
 * model sees. A Standard Schema `outputSchema` parses results the same way (`invalid_output`).
 */
// `Omit`: intersected with ToolOptions' own `inputSchema`, a large schema type (ArkType's)
// made TypeScript give up (TS2589).
export function tool<S extends StandardJsonSchemaLike, Result = unknown>(
  options: Omit<ToolOptions<InferSchemaOutput<S>, Result>, 'inputSchema'> & { inputSchema: S },
): HostTool<InferSchemaOutput<S>, Result>;
export function tool<Args = any, Result = unknown>(options: ToolOptions<Args, Result>): HostTool<Args, Result>;
export function tool<Args = any, Result = unknown>(options: ToolOptions<Args, Result>): HostTool<Args, Result> {
  if (!isRecord(options)) {
    throw new CrucibleError('invalid_config', 'tool() needs an options object: tool({ name, description, inputSchema, execute })');
  }
  const { name } = options;
  const label = typeof name === 'string' && name !== '' ? `tool ${JSON.stringify(name)}` : 'tool()';
  if (typeof name !== 'string' || !TOOL_NAME.test(name)) {
    const got = typeof name === 'string' ? JSON.stringify(name) : describeType(name);
    throw new CrucibleError('invalid_config', `${label}: name must match ^[A-Za-z0-9_-]{1,64}$ (got ${got})`);
  }
  if (typeof options.execute !== 'function') {
    throw new CrucibleError('invalid_config', `${label}: execute must be a function (got ${describeType(options.execute)})`);
  }
  if (!isSchemaLike(options.inputSchema)) {
    throw new CrucibleError('invalid_config', `${label}: inputSchema must be a JSON Schema object or a Standard Schema (got ${describeType(options.inputSchema)})`);
  }
  const { outputSchema } = options;
  if (outputSchema != null && !isSchemaLike(outputSchema)) {
    throw new CrucibleError('invalid_config', `${label}: outputSchema must be a JSON Schema object or a Standard Schema (got ${describeType(outputSchema)})`);
  }
  if (options.description !== undefined && typeof options.description !== 'string') {
    throw new CrucibleError('invalid_config', `${label}: description must be a string (got ${describeType(options.description)})`);
  }
  const { needsApproval } = options;
  if (!isApprovalRule(needsApproval)) {
    throw new CrucibleError('invalid_config', `${label}: needsApproval must be a boolean or a function (got ${describeType(needsApproval)})`);
  }
  const inputSchema = resolveSchema(options.inputSchema, `${label}: inputSchema`);
  refuseNonObjectArguments(inputSchema, label);
  const resolvedOutput = outputSchema != null ? resolveSchema(outputSchema, `${label}: outputSchema`) : undefined;
  const parseArgs = standardParser(options.inputSchema, 'invalid_arguments', `the arguments of ${label} do not match its inputSchema`);
  const parseResult = outputSchema != null ? standardParser(outputSchema, 'invalid_output', `the result of ${label} does not match its outputSchema`) : undefined;
  const run = options.execute;
  // A predicate decides on the arguments `execute` would get: a default the model left out can
  // be what needs a human. Arguments the schema refuses need no human: the call fails on them
  // (`execute` parses them again) whatever anyone decides. Anything else the rule throws asks
  // for approval (fail closed).
  const approvalRule: HostTool<Args, Result>['needsApproval'] =
    typeof needsApproval === 'function' && parseArgs
      ? (args) => {
          const refused = (error: unknown) => {
            if (error instanceof SchemaIssues) return false;
            throw error;
          };
          try {
            const decided = then(parseArgs(args), (parsed) => needsApproval(parsed as Args));
            return isThenable(decided) ? Promise.resolve(decided).catch(refused) : decided;
          } catch (error) {
            return refused(error);
          }
        }
      : (needsApproval ?? false);
  const execute: HostTool<Args, Result>['execute'] =
    parseArgs || parseResult
      ? (args, context) => {
          const executed = then(parseArgs ? parseArgs(args) : args, (parsed) => run(parsed as Args, context));
          return (parseResult ? then(executed, parseResult) : executed) as Result | Promise<Result>;
        }
      : run;
  const made = Object.freeze({
    kind: 'host' as const,
    name,
    description: options.description ?? '',
    inputSchema,
    outputSchema: resolvedOutput,
    execute,
    needsApproval: approvalRule,
  });
  if (parseArgs) argumentParsers.set(made, parseArgs);
  return made;
}

/**
 * The Standard Schema parse of each tool made with {@link tool} that has one: what a human
 * deciding on a call is shown are the arguments `execute` gets, defaults and transforms
 * applied, not only the model's (an amount the model left out is what the human approves).
 */
export const argumentParsers = new WeakMap<object, (args: unknown) => unknown>();

/**
 * A tool's arguments are a JSON object (providers send and require one: OpenAI refuses a
 * function whose parameters are not an object schema), so an `inputSchema` whose `type` rules
 * objects out could never be met.
 */
export function refuseNonObjectArguments(inputSchema: JsonSchema, label: string): void {
  const type = inputSchema.type;
  const allowsObject = type === undefined || type === 'object' || (Array.isArray(type) && type.includes('object'));
  if (!allowsObject) {
    throw new CrucibleError('invalid_config', `${label}: inputSchema must describe an object (type "object" with properties): a tool's arguments are a JSON object, got type ${JSON.stringify(type)}`);
  }
}

/** `f(value)`, after `value` settles when it is a thenable (a synchronous tool stays synchronous). */
export function then<T, U>(value: T | PromiseLike<T>, f: (value: T) => U | PromiseLike<U>): U | Promise<U> {
  if (isThenable(value)) return Promise.resolve(value as PromiseLike<T>).then(f);
  const result = f(value as T);
  // A thenable `f` gave back is made a native promise, as `await` would see it.
  return isThenable(result) ? Promise.resolve(result) : result;
}

/** A tool's problem with a value its Standard Schema refused: the call fails with `code`. */
export class SchemaIssues extends Error {
  constructor(
    readonly code: 'invalid_arguments' | 'invalid_output',
    problem: string,
    /** The issues alone, each with its path: what a model is told to fix. */
    readonly issues: string,
  ) {
    super(`${problem}: ${issues}`);
    this.name = 'SchemaIssues';
  }
}

/** The most issues listed in one failure; the model needs the first few. */
const MAX_LISTED_ISSUES = 5;

/**
 * The parse of a Standard Schema's `validate`: the parsed value, or a `SchemaIssues` thrown
 * with `code` and each issue's path. `undefined` for a JSON Schema, or a Standard Schema
 * without `validate` (the core's JSON Schema check is then the only one).
 */
export function standardParser(schema: JsonSchema | StandardJsonSchemaLike, code: SchemaIssues['code'], problem: string): ((value: unknown) => unknown) | undefined {
  const validate = (schema as StandardJsonSchemaLike)['~standard']?.validate;
  if (typeof validate !== 'function') return undefined;
  const standard = (schema as StandardJsonSchemaLike)['~standard'];
  const settle = (result: StandardResult): unknown => {
    if (!result.issues) return result.value;
    const listed = result.issues.slice(0, MAX_LISTED_ISSUES).map((issue) => {
      // Array.from, not .map: ArkType's path is an Array subclass whose constructor takes the
      // items, so `.map` on an empty one makes `[0]` and a problem at the root reads as `/0`.
      const path = Array.from(issue.path ?? [], (p) => String(typeof p === 'object' ? p.key : p)).join('/');
      return `${path ? `/${path}` : '(root)'}: ${issue.message}`;
    });
    if (result.issues.length > listed.length) listed.push(`… and ${result.issues.length - listed.length} more`);
    throw new SchemaIssues(code, problem, listed.join('; '));
  };
  return (value) => then(validate.call(standard, value), settle);
}

/** Whether `value` is a usable `needsApproval`: absent, a boolean, or a predicate. Anything else
 * would silently mean "never ask", so it is refused (fail closed). */
export function isApprovalRule(value: unknown): boolean {
  return value === undefined || typeof value === 'boolean' || typeof value === 'function';
}
