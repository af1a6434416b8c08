/**
 * The one module of the page that talks to `crucible-agents`. Everything else renders what
 * this returns. The emergent API (forge, registry, approvals) is feature-detected: until the
 * package ships it, those calls throw {@link EmergentUnavailable} and the panels say so.
 */
import * as crucible from 'crucible-agents';
import { anthropic, createAgent, ollama, openai, tool, type Agent, type AgentEvent, type HostTool } from 'crucible-agents';
import type {
  AuditEntry,
  ForgeRequest,
  ForgeResult,
  ForgeStats,
  PendingApproval,
  RejectionCategory,
  TestResult,
  Tier,
  ToolInfo,
  Verdict,
} from '../../npm/src/emergent/types.ts';

export type { AuditEntry, ForgeRequest, ForgeResult, ForgeStats, PendingApproval, RejectionCategory, TestResult, Tier, ToolInfo, Verdict };

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
  | { type: 'forge.registered'; name: string; tier: Tier; version: number; hash: string }
  | { type: 'forge.rejected'; name: string; category: RejectionCategory; reason: string }
  | { type: 'tool.promoted'; name: string; fromTier: Tier; toTier: Tier; version: number }
  | { type: 'tool.demoted'; name: string; fromTier: Tier; toTier: Tier }
  | { type: 'approval.requested'; approval: PendingApproval }
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
  'approval.requested',
]);

export function isEmergentEvent(event: { type: string }): event is EmergentEvent {
  return EMERGENT_TYPES.has(event.type);
}

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
  'Use the host tools when they fit: get_weather, current_time, word_count.',
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

function provider(settings: ProviderSettings) {
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
  /** Uses before a session tool may be promoted to the agent tier (default 5). */
  promotionUses?: number;
}

/** The emergent surface as issue 4 defines it; every member optional until it lands. */
interface EmergentAgent {
  forge?: (request: unknown, options?: { sessionId?: string }) => ForgeResult | Promise<ForgeResult>;
  on?: (listener: (event: DemoEvent) => void) => () => void;
  tools?: {
    list?: (options?: { sessionId?: string }) => ToolInfo[] | Promise<ToolInfo[]>;
    call?: (name: string, args: unknown, options?: { sessionId?: string }) => unknown;
  };
  emergent?: {
    stats?: () => ForgeStats | Promise<ForgeStats>;
    requestPromotion?: (name: string, tier: Tier) => unknown;
    approve?: (id: string) => unknown;
    deny?: (id: string, reason: string) => unknown;
    demote?: (name: string) => unknown;
    rollback?: (name: string, version: number) => unknown;
    export?: (name: string) => string | Promise<string>;
    import?: (pkg: string, options?: { sessionId?: string }) => unknown;
    pendingApprovals?: () => PendingApproval[] | Promise<PendingApproval[]>;
    audit?: () => AuditEntry[] | Promise<AuditEntry[]>;
  };
}

/** The IndexedDB store of the browser entry. (The package's `types` point at the shared
 * `index.d.ts`, which does not declare the browser stores, hence the cast.) */
function openStore(): unknown {
  const factory = (crucible as unknown as { indexedDbStore?: (o: { name: string }) => unknown }).indexedDbStore;
  return typeof factory === 'function' && typeof indexedDB !== 'undefined' ? factory({ name: DATABASE_NAME }) : undefined;
}

export class Runtime {
  readonly #agent: Agent;
  readonly #emergent: EmergentAgent;
  readonly settings: ProviderSettings;

  private constructor(agent: Agent, settings: ProviderSettings) {
    this.#agent = agent;
    this.#emergent = agent as unknown as EmergentAgent;
    this.settings = settings;
  }

  static async create(settings: ProviderSettings, options: RuntimeOptions = {}): Promise<Runtime> {
    const model = provider(settings);
    const agent = await createAgent({
      model,
      instructions: INSTRUCTIONS,
      tools: hostTools,
      maxTurns: 12,
      // Accepted once the emergent API lands; ignored by builds without it.
      ...({
        store: openStore(),
        agentId: AGENT_ID,
        emergent: {
          enabled: true,
          judge: { model },
          promotionJudge: { model },
          maxSessionTools: 10,
          maxAgentTools: 50,
          sandboxTimeoutMs: 5000,
          sandboxMemoryMB: 128,
          promotionThreshold: { uses: options.promotionUses ?? 5, confidence: 0.8 },
          allowedSandboxAPIs: [],
          fetchDomainAllowlist: [],
          // The demo shows forged code and exports importable packages.
          persistSandboxSource: true,
        },
      } as object),
    });
    return new Runtime(agent, settings);
  }

  /** Whether the package build has the emergent API (forge, registry, approvals). */
  get emergentAvailable(): boolean {
    return typeof this.#emergent.forge === 'function' && typeof this.#emergent.emergent === 'object' && this.#emergent.emergent !== null;
  }

  get hostTools(): Array<{ name: string; description: string }> {
    return hostTools.map((t) => ({ name: t.name, description: t.description }));
  }

  /** Names the model is offered (host tools, and `forge_tool` with emergent on). */
  toolNames(): string[] {
    return this.#agent.toolNames();
  }

  stream(input: string, options: { signal: AbortSignal; sessionId: string }): AsyncIterable<DemoEvent> {
    return this.#agent.stream(input, options) as AsyncIterable<DemoEvent>;
  }

  /** Events outside runs too (promotions after approval, `forge()` calls). No-op without it. */
  onEvent(listener: (event: DemoEvent) => void): () => void {
    if (typeof this.#emergent.on !== 'function') return () => {};
    return this.#emergent.on.call(this.#agent, listener);
  }

  async forge(request: ForgeRequest, sessionId: string): Promise<ForgeResult> {
    return await this.#method(this.#emergent, 'forge')(request, { sessionId });
  }

  async callTool(name: string, args: unknown, sessionId: string): Promise<unknown> {
    return await this.#method(this.#emergent.tools, 'call', 'tools.call')(name, args, { sessionId });
  }

  async listTools(sessionId: string): Promise<ToolInfo[]> {
    return await this.#method(this.#emergent.tools, 'list', 'tools.list')({ sessionId });
  }

  async stats(): Promise<ForgeStats> {
    return await this.#em('stats')();
  }

  async pendingApprovals(): Promise<PendingApproval[]> {
    return await this.#em('pendingApprovals')();
  }

  async audit(): Promise<AuditEntry[]> {
    return await this.#em('audit')();
  }

  async requestPromotion(name: string, tier: Tier): Promise<unknown> {
    return await this.#em('requestPromotion')(name, tier);
  }

  async approve(id: string): Promise<void> {
    await this.#em('approve')(id);
  }

  async deny(id: string, reason: string): Promise<void> {
    await this.#em('deny')(id, reason);
  }

  async demote(name: string): Promise<void> {
    await this.#em('demote')(name);
  }

  async rollback(name: string, version: number): Promise<void> {
    await this.#em('rollback')(name, version);
  }

  async exportTool(name: string): Promise<string> {
    return await this.#em('export')(name);
  }

  async importTool(pkg: string, sessionId: string): Promise<unknown> {
    return await this.#em('import')(pkg, { sessionId });
  }

  dispose(): void {
    try {
      this.#agent.dispose();
    } catch {
      // Already released.
    }
  }

  #em<K extends keyof NonNullable<EmergentAgent['emergent']>>(key: K): NonNullable<NonNullable<EmergentAgent['emergent']>[K]> {
    return this.#method(this.#emergent.emergent, key, `emergent.${String(key)}`);
  }

  #method<T extends object, K extends keyof T>(owner: T | undefined, key: K, label = String(key)): NonNullable<T[K]> {
    const fn = owner?.[key];
    if (typeof fn !== 'function') throw new EmergentUnavailable(label);
    return fn.bind(owner) as NonNullable<T[K]>;
  }
}
