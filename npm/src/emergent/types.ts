/**
 * The emergent-capabilities contract (issue 4): forge requests, verdicts, registry entries,
 * stats and the forge/registry events. The Rust core (`src/forge/`, `src/registry/`) mirrors
 * these shapes in camelCase JSON; the demo page renders them.
 */

/** A step of a compose pipeline. `inputMapping` values may reference `$input`, `$input.a.b`,
 * `$prev`, `$prev.field`, `$steps.<name>`, `$steps.<name>.field`, `$input["first-name"]`,
 * `$prev.items[0]`, or interpolate them inside strings ("Summarize: $prev.output"); `$$` is a
 * literal `$`; anything else is a literal. `inputMapping` may also be one whole reference
 * (`"$prev"`): the step's arguments are then that value. A step a model writes without it takes
 * `"$prev"`, so bare steps chain. */
export interface ComposeStep {
  /** What `$steps.<name>` calls this step's output; `step1`, `step2`, … when left out. */
  name?: string;
  /** The registered tool the step calls. */
  tool: string;
  /**
   * The step's arguments: an object whose values may be references (`$input.text`,
   * `$prev.slug`, `$steps.first.items[0]`, or interpolated in text), or one whole reference
   * (`"$prev"`). Left out, it is `"$prev"`: bare steps chain, the first taking the input.
   */
  inputMapping?: Record<string, unknown> | string;
}

export type Implementation =
  | { mode: 'compose'; steps: ComposeStep[] }
  | { mode: 'sandbox'; code: string; allowlist?: string[] };

export interface ForgeTestCase {
  input: Record<string, unknown>;
  expectedOutput?: unknown;
}

/** What the model (or a caller of `agent.forge`) asks for. Messy input is normalized first. */
export interface ForgeRequest {
  name: string;
  description: string;
  inputSchema: Record<string, unknown>;
  outputSchema: Record<string, unknown>;
  implementation: Implementation;
  testCases: ForgeTestCase[];
  /** Optional label grouping attempts (e.g. a task id). */
  scope?: string;
}

/** The judge's review. Scores are 0..1. */
export interface Verdict {
  approved: boolean;
  safety: number;
  correctness: number;
  determinism: number;
  boundedness: number;
  confidence: number;
  reasoning: string;
}

/**
 * Why a forge was rejected, the most specific that applies:
 * - `schema_extra_field`: a field the schemas do not declare where it broke something — a test
 *   input's against an input schema with `additionalProperties: false`, or a failed test's
 *   output field that the output schema does not declare, and either forbids or the
 *   `expectedOutput` does not have (a declared field is never extra);
 * - `shape_check`: the request is unusable as given (no schema properties, fewer than 2 test
 *   cases, an empty test input, over a size limit); no judge is asked;
 * - `syntax_error`: the sandbox code does not parse;
 * - `parse_error`: the request is not JSON or cannot be read as a forge request, or the
 *   judge's answer holds no verdict that reads (broken JSON, a missing score, cut off);
 * - `judge_correctness`: the judge rejected the tool, scoring correctness below 0.5 or lowest;
 * - `other`: anything else (failing tests, no judge, a judge that failed or never answered,
 *   registry limits).
 */
export type RejectionCategory = 'schema_extra_field' | 'shape_check' | 'syntax_error' | 'parse_error' | 'judge_correctness' | 'other';

export type Tier = 'session' | 'agent' | 'shared';

export interface ToolStats {
  calls: number;
  successes: number;
  failures: number;
  /** successes / calls, 0 when never called. */
  successRate: number;
  /** Mean duration of the calls, on the host's monotonic clock (`performance.now()`). */
  avgLatencyMs: number;
}

/** One test's outcome at forge time. */
export interface TestResult {
  index: number;
  passed: boolean;
  input: unknown;
  expectedOutput?: unknown;
  actualOutput?: unknown;
  error?: string;
  /** How long the test's call took, on the host's monotonic clock (`performance.now()`). */
  durationMs: number;
}

/** A registered (verified) tool version. */
export interface ToolInfo {
  name: string;
  description: string;
  tier: Tier;
  version: number;
  /** sha256 of the canonical tool content, hex. */
  hash: string;
  mode: 'compose' | 'sandbox' | 'host';
  inputSchema: Record<string, unknown>;
  outputSchema: Record<string, unknown>;
  /** Sandbox source (absent when redacted) or the compose steps. */
  implementation?: Implementation;
  stats: ToolStats;
  verdict?: Verdict;
  sessionId?: string;
  createdAt: number;
  /** Versions kept for rollback, oldest first. */
  versions: number[];
  /** The kept versions `rollback` restores at this tier: all of them at the session tier;
   *  above it, only those that passed this tier's review (others fail `unreviewed_version`). */
  restorableVersions: number[];
  status: 'active' | 'demoted';
}

/**
 * How a forge (`agent.forge()`, `emergent.import()`) ended. `usage`: the tokens the judge
 * (`emergent.judge`) spent reviewing this request, as its provider reported them (zero when it
 * reported none); present whenever the judge was asked, whatever it answered, and absent when
 * it was not (a request rejected before review, such as a `shape_check` failure, or one
 * `unchanged`). A forge outside a run is counted in no run's `usage`: bill it from here. (The
 * model's `forge_tool` calls add theirs to the run's `usage`, under the judge's model id.)
 */
export type ForgeResult =
  | {
      success: true;
      tool: ToolInfo;
      verdict: Verdict;
      /** The tests this forge ran (none when `unchanged`). */
      tests: TestResult[];
      /** The request was identical to the active tool the session reaches under its name:
       *  `tool` is that tool, as it is (no new version, nothing tested or judged again;
       *  `verdict` is the one it was registered with). */
      unchanged?: true;
      usage?: Usage;
    }
  | { success: false; reason: string; category: RejectionCategory; tests?: TestResult[]; verdict?: Verdict; usage?: Usage };

export interface ForgeStats {
  attempts: number;
  approved: number;
  rejected: number;
  approvedConfidenceSum: number;
  uniqueNames: number;
  uniqueApproved: number;
  uniqueTerminalRejections: number;
  rejectionsByCategory: Record<RejectionCategory, number>;
}

export interface AuditEntry {
  at: number;
  /** `unchanged` (`import.unchanged`): a forge (an imported package) identical to the tool the session is
   *  offered under that name, which stays as it is, not tested or judged again.
   *  `import.rejected`: an import its tests or judge refused; `import.refused`: a package refused
   *  before them (unreadable, redacted, its hash not matching). `verdict`: the judge's on a forge
   *  or an import, or one promotion reviewer's (its detail starts `safety review:` or
   *  `correctness review:`), recorded before the `promote` entry that says how it ended.
   *  `approval.withdrawn`: a pending shared promotion whose version left the agent tier (demoted,
   *  rolled back, replaced by another promoted version), or had left it when the agent loaded (a
   *  request an earlier build kept); its detail starts with the approval id. */
  action:
    | 'forge'
    | 'verdict'
    | 'register'
    | 'reject'
    | 'unchanged'
    | 'promote'
    | 'demote'
    | 'rollback'
    | 'import'
    | 'import.unchanged'
    | 'import.rejected'
    | 'import.refused'
    | 'approval.requested'
    | 'approval.approved'
    | 'approval.denied'
    | 'approval.withdrawn';
  tool: string;
  version?: number;
  tier?: Tier;
  detail: string;
  sessionId?: string;
  /** The scope label of the forge attempt the entry records (`agent.forge(r, { scope })`). */
  scope?: string;
}

/** A request waiting for a human: a promotion to the shared tier, or a paused tool call (the
 *  one type the core generates, for `agent.emergent.pendingApprovals()` and paused runs alike). */
export type { PendingApproval } from '../../wasm/crucible_core.js';
import type { PendingApproval, Usage } from '../../wasm/crucible_core.js';

/**
 * How `agent.emergent.requestPromotion` ended: `promoted` (with the tool and the panel's
 * verdicts), `pending` (shared: waiting for `approve(approval.id)` / `deny`), `rejected`
 * (thresholds, tests, the panel, limits: `reason` says which) or `suppressed` (not asked now:
 * the same version was rejected recently, or a review of it is under way).
 */
export interface PromotionOutcome {
  status: 'promoted' | 'pending' | 'rejected' | 'suppressed';
  reason: string;
  tool?: ToolInfo;
  approval?: PendingApproval;
  verdicts?: Verdict[];
  /** The tokens the panel's two reviews spent together (the promotion judge's), as its
   *  provider reported them: present when the panel was asked, whatever it answered. */
  usage?: Usage;
}

/**
 * Events of the forge and registry, part of the one `AgentEvent` union (each also carries
 * `runId` and `runPath`):
 * - `forge.start` { name, mode, agentId, sessionId, scope? }
 * - `forge.test` { name, test: TestResult }
 * - `forge.judge` { name, verdict, usage } (`usage`: that judge call's tokens, as its provider reported them)
 * - `forge.registered` { name, tier, version, hash, unchanged?, agentId, sessionId, scope? } (`unchanged`: the forge was identical to the tool the session reaches, which stays as it is)
 * - `forge.rejected` { name, category, reason, agentId, sessionId, scope? }
 * - `tool.promoted` { name, fromTier, toTier, version }
 * - `tool.demoted` { name, fromTier, toTier }
 * - `promotion.rejected` { name, fromTier, toTier, reason } — tests failed on re-run, the
 *   panel said no, a human denied a shared promotion, or a pending shared promotion was
 *   withdrawn because its version left the agent tier (demoted, rolled back, replaced: the
 *   reason names the approval id); the tool stays where it was
 * - `approval.requested` { approval: PendingApproval }
 * - `registry.reloaded` { tier, tools, at } — the tier was re-read because another agent of the
 *   runtime, or another tab, changed it
 */
export type EmergentEventType =
  | 'forge.start'
  | 'forge.test'
  | 'forge.judge'
  | 'forge.registered'
  | 'forge.rejected'
  | 'tool.promoted'
  | 'tool.demoted'
  | 'promotion.rejected'
  | 'approval.requested'
  | 'registry.reloaded';
