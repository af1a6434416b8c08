/** Shared state of the page: the current runtime, the session, the event bus and refreshes. */
import { isEmergentEvent, type ApprovalDecision, type DemoEvent, type RunApproval, type Runtime } from './runtime.ts';

const PAUSED_KEY = 'crucible-demo.paused.v1';

type Listener<T> = (value: T) => void;

/** A paused run that can no longer be resumed (resumed elsewhere, or its state is gone): its
 * approvals are stale. */
export class RunGone extends Error {
  override name = 'RunGone';
}

export class App {
  runtime: Runtime | undefined;
  readonly sessionId: string;
  running = false;
  #eventListeners = new Set<Listener<DemoEvent>>();
  #refreshListeners = new Set<() => Promise<void> | void>();
  #runtimeListeners = new Set<Listener<Runtime | undefined>>();
  #refreshTimer: ReturnType<typeof setTimeout> | undefined;
  #unsubscribe: (() => void) | undefined;
  // An emergent event of a run reaches the page twice: the package hands the same object to
  // the run's stream and to agent.on. Only that second arrival is dropped, by identity: two
  // events with equal content are real repeats (the same bad forge twice, promote → demote →
  // promote) and must both show.
  #seen = new WeakSet<object>();
  #runEndListeners = new Set<(runId: string | undefined, forge?: string) => void>();
  // Work a new agent would cut off (forges, imports, promotions): Apply waits for it.
  #busy = new Set<{ what: string }>();

  /** Tool calls of paused runs waiting for a human; the run states live in IndexedDB, so
   * these survive a reload and the run can be resumed by id. */
  runApprovals: RunApproval[] = [];
  /** Set by the chat: continues a paused run with decisions and streams it into the transcript.
   * Rejects when the resumed run failed or was stopped (the run stays resumable). */
  resumeRun: ((runId: string, decisions: ApprovalDecision[]) => Promise<void>) | undefined;

  constructor(sessionId: string) {
    this.sessionId = sessionId;
    this.reloadRunApprovals();
  }

  /** Reads the paused runs' approvals again: another tab that held the agent before this one
   *  may have paused runs since this page loaded (localStorage is shared by the origin's tabs). */
  reloadRunApprovals(): void {
    try {
      const stored = JSON.parse(localStorage.getItem(PAUSED_KEY) ?? '[]') as unknown;
      this.runApprovals = Array.isArray(stored) ? (stored as RunApproval[]) : [];
    } catch {
      this.runApprovals = [];
    }
  }

  setRunApprovals(next: RunApproval[]): void {
    this.runApprovals = next;
    try {
      if (next.length) localStorage.setItem(PAUSED_KEY, JSON.stringify(next));
      else localStorage.removeItem(PAUSED_KEY);
    } catch {
      // Storage full or disabled: the approvals stay for this page's lifetime.
    }
    this.refreshSoon(0);
  }

  setRuntime(runtime: Runtime | undefined): void {
    this.#unsubscribe?.();
    this.#unsubscribe = undefined;
    const previous = this.runtime;
    this.runtime = runtime;
    if (previous && previous !== runtime) void previous.close();
    // Registry events outside runs (and those of runs, deduplicated in emit); run events reach
    // the page through the stream the chat consumes.
    if (runtime) this.#unsubscribe = runtime.onEvent((event) => isEmergentEvent(event) && this.emit(event));
    for (const listener of this.#runtimeListeners) listener(runtime);
    this.refreshSoon(0);
  }

  onRuntime(listener: Listener<Runtime | undefined>): void {
    this.#runtimeListeners.add(listener);
  }

  onEvent(listener: Listener<DemoEvent>): void {
    this.#eventListeners.add(listener);
  }

  emit(event: DemoEvent): void {
    if (isEmergentEvent(event)) {
      if (this.#seen.has(event)) return;
      this.#seen.add(event);
      this.refreshSoon();
    }
    for (const listener of this.#eventListeners) listener(event);
  }

  /** Called by the chat when a run's stream is over, however it ended (answer, pause, error,
   * Stop), and by the example forge when it is stopped: an aborted forge sends no
   * `forge.rejected`, so its card is closed from here. `forge` narrows it to the forge of that
   * name (`agent.forge()` calls share the run id ""). */
  runEnded(runId: string | undefined, forge?: string): void {
    for (const listener of this.#runEndListeners) listener(runId, forge);
  }

  onRunEnd(listener: (runId: string | undefined, forge?: string) => void): void {
    this.#runEndListeners.add(listener);
  }

  /** Runs `work` as something in flight (`what`, e.g. "the forge"), which Apply waits for. */
  async during<T>(what: string, work: () => Promise<T>): Promise<T> {
    const token = { what };
    this.#busy.add(token);
    try {
      return await work();
    } finally {
      this.#busy.delete(token);
    }
  }

  /** What is in flight outside chat runs, if anything. */
  get busyWith(): string | undefined {
    for (const token of this.#busy) return token.what;
    return undefined;
  }

  onRefresh(listener: () => Promise<void> | void): void {
    this.#refreshListeners.add(listener);
  }

  refreshSoon(delayMs = 150): void {
    clearTimeout(this.#refreshTimer);
    this.#refreshTimer = setTimeout(() => void this.refresh(), delayMs);
  }

  async refresh(): Promise<void> {
    await Promise.all([...this.#refreshListeners].map(async (listener) => {
      try {
        await listener();
      } catch (error) {
        console.warn('refresh failed', error);
      }
    }));
  }

  announce(message: string): void {
    const el = document.getElementById('announcer');
    if (!el) return;
    el.textContent = '';
    // A fresh text node so repeated messages are announced again.
    setTimeout(() => (el.textContent = message), 30);
  }
}
