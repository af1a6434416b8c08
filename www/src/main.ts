/** Boots the demo page: settings → runtime → chat, timeline, registry, approvals, stats. */
import { App } from './app.ts';
import { mountApprovals } from './approvals.ts';
import { mountChat } from './chat.ts';
import { mountForgeExample } from './forge-example.ts';
import { $, errorText } from './dom.ts';
import { mountRegistry } from './registry.ts';
import { provider, Runtime, type ProviderSettings } from './runtime.ts';
import { mountSettings } from './settings.ts';
import { mountStats } from './stats.ts';
import { mountTimeline } from './timeline.ts';

declare global {
  interface Window {
    /** Read by the browser tests. */
    __crucibleDemo?: { ready: boolean; emergent: boolean; sessionId: string; error?: string };
  }
}

const params = new URLSearchParams(location.search);
const sessionId = params.get('session') ?? `s-${Math.random().toString(36).slice(2, 10)}`;
const app = new App(sessionId);
// `?promotionUses=N`: checked here, in words a person can act on (the package would refuse a
// bad one with a deserialization message about `uses`).
const rawUses = params.get('promotionUses');
const promotionUses = rawUses !== null && /^\d+$/.test(rawUses.trim()) ? Number(rawUses) : undefined;
const promotionUsesError =
  rawUses !== null && (promotionUses === undefined || !Number.isSafeInteger(promotionUses))
    ? `?promotionUses= must be a whole number of uses, 0 or more (got “${rawUses}”): fix or remove it in the address bar.`
    : undefined;
// `?autoPromote=0` leaves every promotion to the buttons (the package promotes by itself by default).
const autoPromote = params.get('autoPromote') === '0' ? false : undefined;
window.__crucibleDemo = { ready: false, emergent: false, sessionId };

const chat = mountChat(app);
mountTimeline(app);
mountForgeExample(app);
mountRegistry(app);
mountApprovals(app);
mountStats(app);

const emergentBadge = $('#emergent-state');
const settingsStatus = $('#settings-status');
const storageNote = $('#storage-note');
const registryHome = $('#registry-home');

// One start at a time: an Apply while an agent is starting is queued (the latest one wins), so
// two agents of the same id never open at once and a failure cannot close another start's agent.
let starting = false;
let queued: ProviderSettings | undefined;

async function start(settings: ProviderSettings): Promise<void> {
  if (starting) {
    queued = settings;
    return;
  }
  starting = true;
  try {
    for (let next: ProviderSettings | undefined = settings; next; next = queued) {
      queued = undefined;
      await startOnce(next);
    }
  } finally {
    starting = false;
  }
  document.body.dataset.ready = 'true';
}

// While another tab of this page holds the agent (one open agent per id and database), this
// one tries again now and then, and takes over once that tab closes.
let retryBlocked: ReturnType<typeof setTimeout> | undefined;
const RETRY_BLOCKED_MS = 2000;
// What the last failed start put in the settings status (cleared once an agent starts).
let failure: string | undefined;
// The last start found the agent held by another tab: the retries then say nothing new (no
// "loading…" flash, no notice written again), since both are read out by screen readers.
let waitingForOtherTab = false;

/** Whether a model server on this machine (the local model, Ollama) answers at all: "idle"
 *  would otherwise look fine until the first message fails. Any HTTP answer will do; only
 *  one that never comes (nothing listening, or no CORS) is said, with how to start it. */
async function probeLocalModel(settings: ProviderSettings): Promise<void> {
  if (settings.kind !== 'local' && settings.kind !== 'ollama') return;
  const url = `${settings.baseURL.replace(/\/+$/, '')}/${settings.kind === 'local' ? 'models' : 'api/tags'}`;
  try {
    await fetch(url, { signal: AbortSignal.timeout(5000) });
  } catch {
    if (app.runtime?.settings !== settings) return; // another provider applied meanwhile
    const start = settings.kind === 'local' ? 'start it with `bash scripts/model/start.sh` (or `bash scripts/demo.sh`)' : 'start Ollama (`ollama serve`)';
    chat.notice(`The model server at ${settings.baseURL} does not answer: ${start}, or choose another provider under Provider.`);
  }
}

async function startOnce(settings: ProviderSettings): Promise<void> {
  clearTimeout(retryBlocked);
  if (!waitingForOtherTab) chat.setState('loading');
  document.body.dataset.ready = 'false';
  let runtime: Runtime | undefined;
  try {
    // One open agent per agent id and database: the previous one lets go of the registry first.
    const previous = app.runtime;
    app.setRuntime(undefined);
    await previous?.close();
    if (promotionUsesError) throw new Error(promotionUsesError);
    runtime = await Runtime.create(settings, { promotionUses, autoPromote });
    // Before the chat can start a run: drop what the page can never resume (runs cut off by a
    // reload mid-stream); without this their records stay in IndexedDB for good.
    await discardUnreachableRuns(runtime);
    app.setRuntime(runtime);
    const emergent = runtime.emergentAvailable;
    emergentBadge.hidden = false;
    emergentBadge.textContent = emergent ? 'forge on' : 'forge unavailable in this build';
    emergentBadge.className = `badge ${emergent ? 'badge-ok' : 'badge-muted'}`;
    document.body.dataset.emergent = String(emergent);
    // A browser that keeps nothing for the page (no usable IndexedDB): said plainly, since the
    // page's hints promise that promoted tools are kept.
    storageNote.hidden = runtime.memoryOnly === undefined;
    storageNote.textContent = runtime.memoryOnly === undefined ? '' : `Nothing is kept after a reload: ${runtime.memoryOnly}. Forged and promoted tools, statistics and pending approvals last only until this page is reloaded or closed.`;
    registryHome.textContent = runtime.memoryOnly === undefined ? 'IndexedDB' : "this tab's memory";
    window.__crucibleDemo = { ready: true, emergent, sessionId };
    chat.setState('idle');
    void probeLocalModel(settings);
    // The failure (a tab that held the agent, say) is over: its words go, an Apply's stay.
    if (failure !== undefined && settingsStatus.textContent === failure) settingsStatus.textContent = '';
    failure = undefined;
    waitingForOtherTab = false;
  } catch (error) {
    // Only this start's agent is let go, never one the page runs otherwise.
    if (runtime && app.runtime === runtime) app.setRuntime(undefined);
    else void runtime?.close();
    const blocked = (error as { code?: unknown } | null)?.code === 'store_blocked';
    chat.setState('error', blocked ? 'Another tab of this page holds the agent: this tab takes over once that one closes.' : 'The agent did not start: see Provider above.');
    emergentBadge.hidden = true;
    // Blocked: the package's advice (another agentId) is for programs; the page's id is fixed.
    const text = blocked
      ? 'Another tab of this page holds the agent (one tab at a time): close that tab and this one takes over; it tries again every few seconds.'
      : `Could not start the agent: ${errorText(error).replace(/[.!?]?$/, '.')}`;
    // Shown in the settings, opened (once per message: a retry every few seconds does not
    // reopen what the person closed), so the reason the page waits is in view.
    if (settingsStatus.textContent !== text) {
      ($('#settings-details') as HTMLDetailsElement).open = true;
      settingsStatus.textContent = text;
    }
    failure = text;
    waitingForOtherTab = blocked;
    if (blocked) retryBlocked = setTimeout(() => void start(settings), RETRY_BLOCKED_MS);
    window.__crucibleDemo = { ready: true, emergent: false, sessionId, error: errorText(error) };
  }
}

/** Whether `a` and `b` make the same provider (then the agent need not start again). */
function sameProvider(a: ProviderSettings, b: ProviderSettings): boolean {
  return a.kind === b.kind && a.baseURL === b.baseURL && a.model === b.model && a.apiKey === b.apiKey;
}

/** Discards the stored runs no pending approval of this page refers to: the page resumes
 * only paused runs, through their approvals (kept in localStorage). */
async function discardUnreachableRuns(runtime: Runtime): Promise<void> {
  try {
    // This tab holds the agent now, so no other tab pauses runs meanwhile: what localStorage
    // says at this point is every approval there is.
    app.reloadRunApprovals();
    const reachable = new Set(app.runApprovals.map((a) => a.runId));
    for (const runId of await runtime.storedRunIds()) if (!reachable.has(runId)) await runtime.discardRun(runId);
  } catch (error) {
    console.warn('discarding stale runs failed', error);
  }
}

const settings = mountSettings((next) => {
  // The package's own check of the options (the browser's URL check lets `localhost:8089` by).
  try {
    provider(next);
  } catch (error) {
    return { refused: errorText(error) };
  }
  // The running agent stays until its run ends; settings are applied (and saved) only then.
  if (app.running) return { refused: 'Stop the current run first, then apply the new provider.' };
  // A new agent would cut off a forge, an import or a promotion half-way (its card and status
  // would never finish).
  const busy = app.busyWith;
  if (busy) return { refused: `Wait until ${busy} is done, then apply.` };
  // The session's tools and conversation live in the agent: an Apply that changes nothing
  // (saving "remember key", say) keeps it; only a new provider starts a new one.
  if (!starting && app.runtime && sameProvider(app.runtime.settings, next)) return { note: 'Same provider: the agent and this session go on.' };
  const restart = app.runtime !== undefined;
  void start(next);
  if (!restart) return { note: 'Starting the agent.' };
  chat.notice('New provider: a new agent started. The conversation and this session’s tools start over; promoted tools stay.');
  return { note: 'A new agent started: the conversation and this session’s tools start over (promoted tools stay).' };
});
void start(settings.current());
