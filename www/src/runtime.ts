/**
 * The one module of the page that talks to `crucible-agents`. Everything else renders what
 * this returns: the real events of `agent.stream` / `agent.on` and the real registry of
 * `agent.tools` / `agent.emergent`, persisted in IndexedDB under one agent id (in memory where
 * the browser cannot open it).
 */
import {
  anthropic,
  createAgent,
  indexedDbStore,
  memoryStore as pageMemoryStore,
  ollama,
  openai,
  tool,
  type Agent,
  type AgentEvent,
  type ApprovalDecision,
  type AuditEntry,
  type ForgeRequest,
  type ForgeResult,
  type ForgeStats,
  type HostTool,
  type PendingApproval,
  type PromotionOutcome,
  type RejectionCategory,
  type Store,
  type TestResult,
  type Tier,
  type ToolInfo,
  type Verdict,
} from 'crucible-agents';

export type { ApprovalDecision };
export type { AuditEntry, ForgeRequest, ForgeResult, ForgeStats, PendingApproval, PromotionOutcome, RejectionCategory, TestResult, Tier, ToolInfo, Verdict };

export type ProviderKind = 'local' | 'openai' | 'anthropic' | 'ollama';

export interface ProviderSettings {
  kind: ProviderKind;
  baseURL: string;
  model: string;
  /** Kept in memory; persisted only when the person ticks "remember key". */
  apiKey: string;
}

/** Emergent events (issue 4), part of the same stream as the loop events. */
export type EmergentEvent = { runId?: string; runPath?: string[] } & (
  | { type: 'forge.start'; name: string; mode: string; sessionId?: string }
  | { type: 'forge.test'; name: string; test: TestResult }
  | { type: 'forge.judge'; name: string; verdict: Verdict }
  | { type: 'forge.registered'; name: string; tier: Tier; version: number; hash: string; unchanged?: boolean }
  | { type: 'forge.rejected'; name: string; category: RejectionCategory; reason: string }
  | { type: 'tool.promoted'; name: string; fromTier: Tier; toTier: Tier; version: number }
  | { type: 'tool.demoted'; name: string; fromTier: Tier; toTier: Tier }
  | { type: 'promotion.rejected'; name: string; fromTier: Tier; toTier: Tier; reason: string }
  | { type: 'approval.requested'; approval: PendingApproval }
  | { type: 'registry.reloaded'; tier: Tier; tools: number; at: number }
);

export type DemoEvent = AgentEvent | EmergentEvent;

export const EMERGENT_TYPES = new Set([
  'forge.start',
  'forge.test',
  'forge.judge',
  'forge.registered',
  'forge.rejected',
  'tool.promoted',
  'tool.demoted',
  'promotion.rejected',
  'approval.requested',
  'registry.reloaded',
]);

export function isEmergentEvent(event: { type: string }): event is EmergentEvent {
  return EMERGENT_TYPES.has(event.type);
}

/** Thrown by registry reads when the agent runs without emergent capabilities; the panels say so. */
export class EmergentUnavailable extends Error {
  constructor(what: string) {
    super(`emergent API not available in this build (${what})`);
    this.name = 'EmergentUnavailable';
  }
}

export const PROVIDER_DEFAULTS: Record<ProviderKind, { baseURL: string; model: string; label: string }> = {
  local: { baseURL: 'http://127.0.0.1:8089/v1', model: 'qwen', label: 'Local model (llama-server)' },
  openai: { baseURL: 'https://api.openai.com/v1', model: 'gpt-4o-mini', label: 'OpenAI-compatible' },
  anthropic: { baseURL: 'https://api.anthropic.com', model: 'claude-3-5-haiku-latest', label: 'Anthropic' },
  ollama: { baseURL: 'http://127.0.0.1:11434', model: 'llama3.2', label: 'Ollama' },
};

export const DATABASE_NAME = 'crucible-demo';
export const AGENT_ID = 'demo-agent';

const INSTRUCTIONS = [
  'You are the Crucible demo agent. Answer briefly.',
  'Use the host tools when they fit: get_weather, current_time, word_count, save_note.',
  'When no tool covers a task, call forge_tool to build one (with at least two test cases), then call the new tool.',
].join(' ');

// ---------------------------------------------------------------------------------------------
// Host tools of the demo agent

const WEATHER: Record<string, { celsius: number; sky: string }> = {
  oslo: { celsius: 4, sky: 'overcast' },
  lima: { celsius: 19, sky: 'hazy' },
  tokyo: { celsius: 14, sky: 'clear' },
  nairobi: { celsius: 23, sky: 'sunny' },
};

export const hostTools: HostTool[] = [
  tool({
    name: 'get_weather',
    description: 'Current weather for a city (demo data, not a real forecast)',
    inputSchema: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    outputSchema: {
      type: 'object',
      properties: { city: { type: 'string' }, celsius: { type: 'number' }, sky: { type: 'string' } },
      required: ['city', 'celsius', 'sky'],
    },
    execute: ({ city }: { city: string }) => {
      const key = String(city).trim().toLowerCase();
      const known = WEATHER[key];
      if (known) return { city, ...known };
      // Deterministic fake for unknown cities.
      let h = 0;
      for (const c of key) h = (h * 31 + c.charCodeAt(0)) >>> 0;
      return { city, celsius: (h % 35) - 5, sky: ['clear', 'cloudy', 'rain', 'windy'][h % 4]! };
    },
  }),
  tool({
    name: 'current_time',
    description: 'The current date and time, ISO 8601, in UTC or an IANA time zone',
    inputSchema: { type: 'object', properties: { timeZone: { type: 'string' } } },
    execute: ({ timeZone }: { timeZone?: string }) => {
      const now = new Date();
      const zone = timeZone || 'UTC';
      let local: string;
      try {
        local = now.toLocaleString('en-GB', { timeZone: zone });
      } catch {
        throw new Error(`unknown time zone ${zone}`);
      }
      return { iso: now.toISOString(), timeZone: zone, local };
    },
  }),
  tool({
    name: 'save_note',
    description: 'Saves a short note in this browser tab (asks a human first)',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    // Every call pauses the run until someone approves or denies it under "Pending approvals".
    needsApproval: true,
    execute: ({ text }: { text: string }) => {
      const key = 'crucible-demo.notes.v1';
      let notes: string[] = [];
      try {
        notes = JSON.parse(localStorage.getItem(key) ?? '[]') as string[];
      } catch {
        notes = [];
      }
      notes.push(String(text));
      try {
        localStorage.setItem(key, JSON.stringify(notes.slice(-50)));
      } catch {
        return { saved: false, reason: 'this browser keeps no data for this page' };
      }
      return { saved: true, notes: notes.length };
    },
  }),
  tool({
    name: 'word_count',
    description: 'Counts the words and characters of a text',
    inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    execute: ({ text }: { text: string }) => {
      const words = String(text).trim().split(/\s+/).filter(Boolean).length;
      return { words, characters: String(text).length };
    },
  }),
];

// ---------------------------------------------------------------------------------------------
// Providers

/** The provider `settings` name; the package checks the options here, before anything is sent. */
export function provider(settings: ProviderSettings) {
  const apiKey = settings.apiKey || undefined;
  const common = { baseURL: settings.baseURL, model: settings.model, apiKey, retry: { maxRetries: 1 } };
  switch (settings.kind) {
    case 'anthropic':
      // Anthropic refuses browser calls without this opt-in header. The key goes only there.
      return anthropic({ ...common, headers: { 'anthropic-dangerous-direct-browser-access': 'true' } });
    case 'ollama':
      return ollama(common);
    case 'local':
    case 'openai':
      return openai({ ...common, apiKey: apiKey ?? 'none' });
  }
}

// ---------------------------------------------------------------------------------------------
// The runtime

export interface RuntimeOptions {
  /** Uses before a session tool may be promoted to the agent tier (default 3 here, so a person
   *  watching sees a promotion after a few calls; the package's default is 5). */
  promotionUses?: number;
  /** Promote session tools to the agent tier by themselves after `promotionUses` (default true). */
  autoPromote?: boolean;
}

/** A tool-call approval of a paused run (`agent.paused`). */
export interface RunApproval {
  id: string;
  kind: 'tool_call';
  tool: string;
  fromTier?: undefined;
  toTier?: undefined;
  runId: string;
  callId?: string;
  arguments?: unknown;
  reason: string;
  requestedAt: number;
  /** The human's decision, stored before the run is resumed with it: from then on the call
   *  may have run, so the page offers to continue the run, never to decide again. */
  decision?: ApprovalDecision;
}

/** Where an agent keeps its registry, stats and paused runs; `memoryOnly` says why it is not
 *  IndexedDB (then nothing of it outlives the page). */
interface PageStore {
  store: Store | undefined;
  memoryOnly?: string;
}

// The memory store of a page that cannot use IndexedDB: one for the page's lifetime, so an agent
// started anew (another provider applied) still has the tools promoted in this tab.
let memory: Store | undefined;

function memoryStore(why: string): PageStore {
  memory ??= pageMemoryStore();
  return { store: memory, memoryOnly: why };
}

/** The IndexedDB store, or memory where this browser has no IndexedDB. */
function openStore(): PageStore {
  if (typeof indexedDB === 'undefined' || indexedDB === null) return memoryStore('this browser gives the page no IndexedDB storage (private browsing, or storage turned off)');
  try {
    return { store: indexedDbStore({ name: DATABASE_NAME }) };
  } catch (error) {
    console.warn('IndexedDB store unavailable', error);
    return memoryStore('this browser gives the page no IndexedDB storage (private browsing, or storage turned off)');
  }
}

export class Runtime {
  readonly #agent: Agent;
  readonly settings: ProviderSettings;
  /** Why the agent keeps its registry, stats and paused runs in memory only (this browser has
   *  no usable IndexedDB), or `undefined` when they are in IndexedDB and survive a reload. */
  readonly memoryOnly: string | undefined;
  #closing: Promise<void> | undefined;

  private constructor(agent: Agent, settings: ProviderSettings, memoryOnly: string | undefined) {
    this.#agent = agent;
    this.settings = settings;
    this.memoryOnly = memoryOnly;
  }

  static async create(settings: ProviderSettings, options: RuntimeOptions = {}): Promise<Runtime> {
    const opened = openStore();
    try {
      return await Runtime.#create(settings, options, opened);
    } catch (error) {
      // IndexedDB opens with the agent's first read: a browser that refuses it (some private
      // windows, storage turned off) fails with store_error. The agent runs in memory then, and
      // the page says what that costs; another tab holding the agent (store_blocked) is not that.
      if (opened.memoryOnly !== undefined || (error as { code?: unknown } | null)?.code !== 'store_error') throw error;
      console.warn('IndexedDB cannot be used: the agent keeps its data in memory', error);
      void opened.store?.close().catch(() => undefined);
      return await Runtime.#create(settings, options, memoryStore('this browser refused to open IndexedDB storage for the page (private browsing, or storage turned off)'));
    }
  }

  static async #create(settings: ProviderSettings, options: RuntimeOptions, opened: PageStore): Promise<Runtime> {
    const model = provider(settings);
    const agent = await createAgent({
      model,
      instructions: INSTRUCTIONS,
      tools: hostTools,
      maxTurns: 12,
      store: opened.store,
      agentId: AGENT_ID,
      emergent: {
        enabled: true,
        // The page's model may be a reasoning model, whose hidden reasoning would use up the
        // default 512 tokens before the verdict; a larger cap costs the others nothing (their
        // answers end with the verdict, about 150 tokens). The judge's deadline counts the whole
        // review, not a stall: 4,096 tokens from a model on a laptop's CPU can take minutes,
        // and the page lets a person stop a forge that takes too long.
        judge: { model, maxTokens: 4096, timeoutMs: 600_000 },
        promotionJudge: { model, maxTokens: 4096, timeoutMs: 600_000 },
        maxSessionTools: 10,
        maxAgentTools: 50,
        sandboxTimeoutMs: 5000,
        sandboxMemoryMB: 128,
        promotionThreshold: { uses: options.promotionUses ?? 3, confidence: 0.8 },
        autoPromote: options.autoPromote,
        allowedSandboxAPIs: [],
        fetchDomainAllowlist: [],
        // The demo shows forged code and exports importable packages.
        persistSandboxSource: true,
      },
    });
    return new Runtime(agent, settings, opened.memoryOnly);
  }

  /** Whether the agent has `forge_tool` and the registry. */
  get emergentAvailable(): boolean {
    return this.#agent.emergentEnabled;
  }

  get hostTools(): Array<{ name: string; description: string }> {
    return hostTools.map((t) => ({ name: t.name, description: t.description }));
  }

  /** Names the model is offered (host tools, forged tools, and `forge_tool`). */
  toolNames(): string[] {
    return this.#agent.toolNames();
  }

  stream(input: string, options: { signal: AbortSignal; sessionId: string }): AsyncIterable<DemoEvent> {
    return this.#agent.stream(input, options) as AsyncIterable<DemoEvent>;
  }

  /** Continues a paused run with the human decisions on its tool calls. */
  resume(runId: string, approvals: ApprovalDecision[], signal: AbortSignal): AsyncIterable<DemoEvent> {
    return this.#agent.resumeStream(runId, { approvals, signal }) as AsyncIterable<DemoEvent>;
  }

  /** Every event of the agent, including registry events outside runs (promotions, approvals). */
  onEvent(listener: (event: DemoEvent) => void): () => void {
    return this.#agent.on(listener as (event: AgentEvent) => void);
  }

  async forge(request: ForgeRequest, sessionId: string, signal?: AbortSignal): Promise<ForgeResult> {
    return await this.#agent.forge(request, { sessionId, signal });
  }

  /** Ids of the runs whose state the store holds (paused, or cut off between steps). */
  async storedRunIds(): Promise<string[]> {
    return (await this.#agent.storedRuns()).map((r) => r.runId);
  }

  /** Drops the stored state of a run that will not be resumed. */
  async discardRun(runId: string): Promise<boolean> {
    return await this.#agent.discardRun(runId);
  }

  async callTool(name: string, args: unknown, sessionId: string): Promise<unknown> {
    return await this.#agent.tools.call(name, args, { sessionId });
  }

  async listTools(sessionId: string): Promise<ToolInfo[]> {
    this.#requireEmergent('tools.list');
    return this.#agent.tools.list({ sessionId });
  }

  async stats(): Promise<ForgeStats> {
    this.#requireEmergent('emergent.stats');
    return this.#agent.emergent.stats();
  }

  async pendingApprovals(): Promise<PendingApproval[]> {
    this.#requireEmergent('emergent.pendingApprovals');
    return this.#agent.emergent.pendingApprovals();
  }

  async audit(): Promise<AuditEntry[]> {
    this.#requireEmergent('emergent.audit');
    return this.#agent.emergent.audit();
  }

  async requestPromotion(name: string, tier: Tier, sessionId: string, signal?: AbortSignal): Promise<PromotionOutcome> {
    return await this.#agent.emergent.requestPromotion(name, tier, { sessionId, signal });
  }

  async approve(id: string): Promise<ToolInfo> {
    return await this.#agent.emergent.approve(id);
  }

  async deny(id: string, reason: string): Promise<void> {
    await this.#agent.emergent.deny(id, reason);
  }

  async demote(name: string, sessionId: string): Promise<ToolInfo> {
    return await this.#agent.emergent.demote(name, { sessionId });
  }

  async rollback(name: string, version: number, sessionId: string): Promise<ToolInfo> {
    return await this.#agent.emergent.rollback(name, version, { sessionId });
  }

  async exportTool(name: string, sessionId: string): Promise<string> {
    return await this.#agent.emergent.export(name, { sessionId });
  }

  async importTool(pkg: string, sessionId: string, signal?: AbortSignal): Promise<ForgeResult> {
    return await this.#agent.emergent.import(pkg, { sessionId, signal });
  }

  #requireEmergent(what: string): void {
    if (!this.emergentAvailable) throw new EmergentUnavailable(what);
  }

  /** Resolves once no automatic promotion is in flight: one a chat run's tool call started
   *  goes on after the run ended, while its panel reviews. */
  async settled(): Promise<void> {
    if (!this.#closing && this.emergentAvailable) await this.#agent.emergent.settled();
  }

  /** Writes buffered tool stats to IndexedDB (the core batches them). */
  async flushStats(): Promise<void> {
    if (!this.#closing && this.emergentAvailable) await this.#agent.emergent.flushStats();
  }

  /** Flushes stats, stops the sandbox workers and releases the wasm agent (and its claim on
   *  the registry's records, which the next agent of this id needs). Every call waits for it. */
  close(): Promise<void> {
    this.#closing ??= this.#agent.close().catch((error: unknown) => console.warn('closing the agent failed', error));
    return this.#closing;
  }
}
