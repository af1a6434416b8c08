/** The chat: streamed answers, tool events inline, a stop button that aborts cleanly. */
import { RunGone, type App } from './app.ts';
import { $, brief, clear, errorText, h, setDisabled } from './dom.ts';
import type { DemoEvent, ProviderKind, RunApproval } from './runtime.ts';

type RunEnd = 'done' | 'stopped' | 'error' | 'paused';

type ChatState = 'idle' | 'running' | 'loading' | 'error';

export function mountChat(app: App): { setState: (state: ChatState, why?: string) => void; notice: (text: string) => void } {
  const transcript = $('#transcript');
  const form = $<HTMLFormElement>('#chat-form');
  const input = $<HTMLTextAreaElement>('#chat-input');
  const send = $<HTMLButtonElement>('#send-button');
  const stop = $<HTMLButtonElement>('#stop-button');
  const hostList = $('#host-tools');
  const runState = $('#run-state');
  const chatStatus = $('#chat-status');
  let controller: AbortController | undefined;
  // Why nothing can be sent while this tab has no agent (starting, held by another tab, failed).
  let notReady = 'Starting the agent…';

  app.onRuntime((runtime) => {
    clear(hostList);
    if (!runtime) {
      send.disabled = true;
      return;
    }
    for (const t of runtime.hostTools) hostList.append(h('li', { class: 'chip', title: t.description }, h('code', {}, t.name), h('span', { class: 'chip-desc' }, ` — ${t.description}`)));
    // forge_tool is offered per run by the registry, not listed among the agent's own tools.
    if (runtime.emergentAvailable || runtime.toolNames().includes('forge_tool')) hostList.append(h('li', { class: 'chip chip-meta', title: 'Builds a new tool when none fits' }, h('code', {}, 'forge_tool'), h('span', { class: 'chip-desc' }, ' — meta-tool: forges new tools')));
    setState(app.running ? 'running' : 'idle');
  });

  function setState(state: ChatState, why?: string): void {
    document.body.dataset.state = state;
    app.running = state === 'running';
    const label = state === 'running' ? 'running…' : state === 'idle' ? 'idle' : state === 'loading' ? 'loading…' : 'not ready';
    // A status region: the same words written again would be read out again.
    if (runState.textContent !== label) runState.textContent = label;
    runState.className = `badge badge-${state}`;
    send.disabled = state !== 'idle';
    stop.disabled = state !== 'running';
    // Without an agent the prompt is shown disabled (keeping the focus, and what is typed, to
    // send once the agent is there), the reason beside it.
    const ready = state === 'idle' || state === 'running';
    setDisabled(input, !ready);
    if (!ready) notReady = why ?? (state === 'loading' ? 'Starting the agent…' : 'The agent did not start: see Provider above.');
    say(ready ? '' : notReady);
  }

  /** The chat's status line; the same words are not written again (they would be read out again). */
  function say(text: string): void {
    if (chatStatus.textContent !== text) chatStatus.textContent = text;
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const text = input.value.trim();
    if (!text || app.running) return;
    if (!app.runtime) {
      say(`Not sent: ${notReady}`);
      return;
    }
    input.value = '';
    void run(text);
  });
  input.addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      form.requestSubmit();
    }
  });
  stop.addEventListener('click', () => controller?.abort(new DOMException('Stopped by the user', 'AbortError')));
  // Escape stops the run only from the chat (or with nothing focused): pressed elsewhere, say in
  // a deny-reason box or a settings field, it means "never mind" there, not "stop the run".
  document.addEventListener('keydown', (event) => {
    if (event.key !== 'Escape' || !app.running) return;
    const target = event.target as Node | null;
    const inChat = target === document.body || (target !== null && (form.contains(target) || transcript.contains(target)));
    if (inChat) controller?.abort(new DOMException('Stopped by the user', 'AbortError'));
  });

  async function run(text: string): Promise<void> {
    const runtime = app.runtime!;
    transcript.querySelector('.empty-note')?.remove();
    transcript.append(h('div', { class: 'msg msg-user' }, h('span', { class: 'msg-role' }, 'You'), h('p', { class: 'msg-text' }, text)));
    const ended = await drive('Agent', (signal) => runtime.stream(text, { signal, sessionId: app.sessionId }));
    // The page offers no way to resume a stopped or failed run (only paused ones): its stored
    // state would pile up in IndexedDB.
    if ((ended.status === 'stopped' || ended.status === 'error') && ended.runId) void runtime.discardRun(ended.runId).catch(() => undefined);
  }

  // Approving or denying a tool call of a paused run continues it here.
  app.resumeRun = async (runId, decisions) => {
    const runtime = app.runtime;
    if (!runtime || app.running) throw new Error(app.running ? 'a run is in progress; stop it first' : 'the agent is not ready');
    transcript.querySelector('.empty-note')?.remove();
    const summary = decisions.map((d) => `${d.approved ? 'approved' : 'denied'}${d.reason ? ` (${d.reason})` : ''}`).join(', ');
    transcript.append(h('div', { class: 'msg msg-user' }, h('span', { class: 'msg-role' }, 'You'), h('p', { class: 'msg-text' }, `Tool call ${summary}.`)));
    const ended = await drive('Agent (resumed)', (signal) => runtime.resume(runId, decisions, signal));
    // The store has no such run to resume (resumed elsewhere, or its state is gone): retrying
    // cannot help, so the caller drops its approvals.
    if (ended.status === 'error' && ended.code === 'invalid_resume') throw new RunGone(ended.note ?? 'the run cannot be resumed');
    // A resume that failed or was stopped leaves the run resumable: the caller keeps its decisions.
    if (ended.status === 'error') throw new Error(ended.note ?? 'the resumed run failed');
    if (ended.status === 'stopped') throw new Error('the resumed run was stopped; continue it under “Pending approvals”');
  };

  /** Runs a stream into a new bubble; resolves with how it ended (it never throws). */
  async function drive(role: string, start: (signal: AbortSignal) => AsyncIterable<DemoEvent>): Promise<{ status: RunEnd; note?: string; code?: string; runId?: string }> {
    const body = h('div', { class: 'msg-body' });
    const bubble = h('div', { class: 'msg msg-agent', 'data-status': 'streaming' }, h('span', { class: 'msg-role' }, role), body);
    transcript.append(bubble);
    let segment: HTMLParagraphElement | undefined;
    let sawText = false;
    // Part of the model's current answer has arrived (text or a tool call, since the last tool
    // result): a network failure now is a connection lost mid-answer, not a server out of reach.
    let answering = false;
    const scroll = () => (transcript.scrollTop = transcript.scrollHeight);
    // The question and its empty bubble in view at once: a model on a CPU takes seconds to
    // start answering, and the question would wait below the fold meanwhile.
    scroll();
    const addText = (delta: string) => {
      if (!segment) {
        segment = h('p', { class: 'msg-text' });
        body.append(segment);
      }
      segment.append(delta);
      sawText = true;
      answering = true;
      scroll();
    };
    const addEvent = (cls: string, ...content: (string | Node)[]) => {
      segment = undefined;
      body.append(h('div', { class: `tool-event ${cls}` }, ...content));
      scroll();
    };
    let ending: { status: RunEnd; note?: string; code?: string } = { status: 'done' };
    let runId: string | undefined;
    const finish = (status: RunEnd, note?: string, code?: string, raw?: string) => {
      ending = { status, note, code };
      bubble.dataset.status = status;
      if (note) body.append(h('p', { class: `run-note run-note-${status}` }, note));
      if (raw) body.append(h('details', { class: 'run-detail' }, h('summary', {}, `Details (${code ?? 'error'})`), h('pre', {}, raw)));
      scroll();
    };
    const failed = (code: string | undefined, status: number | undefined, message: string) =>
      finish('error', explain(code, status, message, { midAnswer: answering, kind: app.runtime?.settings.kind }), code, message);

    controller = new AbortController();
    setState('running');
    // The transcript is a live log: without this, a screen reader reads out every streamed
    // chunk as it lands. Busy, the run's additions are read once it ends.
    transcript.setAttribute('aria-busy', 'true');
    let ended = false;
    try {
      for await (const event of start(controller.signal)) {
        runId ??= event.runId;
        app.emit(event);
        ended = onEvent(event) || ended;
      }
      if (!ended) finish(controller.signal.aborted ? 'stopped' : 'done', controller.signal.aborted ? 'Stopped.' : undefined);
    } catch (error) {
      if (controller.signal.aborted) finish('stopped', 'Stopped.');
      else {
        const e = error as { code?: unknown; status?: unknown } | null;
        failed(typeof e?.code === 'string' ? e.code : undefined, typeof e?.status === 'number' ? e.status : undefined, errorText(error));
      }
    } finally {
      controller = undefined;
      transcript.setAttribute('aria-busy', 'false');
      setState('idle');
      app.runEnded(runId);
      // An automatic promotion the run's calls started goes on after it (its panel may be a
      // slow local model): a new agent would cut it off, so Apply waits for it too.
      const runtime = app.runtime;
      if (runtime) void app.during('the automatic promotion', () => runtime.settled()).catch(() => undefined);
      const said: Record<string, string> = { done: 'Answer complete.', stopped: 'Run stopped.', paused: 'Run paused: a tool call waits for approval.' };
      app.announce(said[bubble.dataset.status ?? ''] ?? 'Run failed.');
      // Tool stats are batched by the core; write them so a reload shows them.
      void app.runtime?.flushStats().catch((error: unknown) => console.warn('flushing stats failed', error));
      app.refreshSoon(0);
      // Back to the prompt for the next message, unless the person went on elsewhere meanwhile
      // (typing a package, a deny reason, a key): their typing must not land in the chat.
      if (focusIsFree()) input.focus();
    }
    return { ...ending, runId };

    function onEvent(event: DemoEvent): boolean {
      switch (event.type) {
        case 'text.delta':
          addText(event.delta);
          return false;
        case 'tool.call':
          answering = true;
          addEvent('tool-call', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '→'), ' calls ', h('code', {}, event.name), h('span', { class: 'ev-args' }, ` ${brief(event.arguments, 120)}`));
          return false;
        case 'tool.execute.end':
          answering = false;
          addEvent('tool-result', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '✓'), ' ', h('code', {}, event.name), ` returned ${brief(event.result, 140)} `, h('span', { class: 'muted' }, `(${Math.round(event.durationMs)} ms)`));
          return false;
        case 'tool.execute.error':
          answering = false;
          addEvent('tool-error', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '✗'), ' ', h('code', {}, event.name), ` failed: ${event.error.code}: ${brief(event.error.message, 200)}`);
          return false;
        case 'forge.registered':
          addEvent('tool-forged', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '⚒'), event.unchanged ? ' already had ' : ' forged ', h('code', {}, event.name), ` (${event.tier} tier, v${event.version})`);
          return false;
        case 'forge.rejected':
          // A request the package could not read a name from (broken JSON, no `name`) has none.
          addEvent('tool-error', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '⚒'), ' forge of ', event.name ? h('code', {}, event.name) : 'an unnamed tool', ` rejected (${event.category}): ${brief(event.reason, 300)}`);
          return false;
        case 'output.retry':
          addEvent('tool-call', `retrying the answer: ${brief(event.reason, 160)}`);
          return false;
        case 'agent.end':
          if (!sawText && event.text) addText(event.text);
          if (!sawText && !event.text) addText(brief(event.output, 2000));
          finish('done');
          bubble.append(h('p', { class: 'usage muted' }, `${event.turns} turn${event.turns === 1 ? '' : 's'}, ${event.steps} tool call${event.steps === 1 ? '' : 's'}, ${event.usage.inputTokens}+${event.usage.outputTokens} tokens`));
          return true;
        case 'agent.paused': {
          const now = Date.now();
          for (const a of event.approvals) addEvent('tool-paused', h('span', { class: 'ev-icon', 'aria-hidden': 'true' }, '‖'), ' ', h('code', {}, a.tool), ` waits for approval ${brief(a.arguments, 120)}`);
          const fresh: RunApproval[] = event.approvals.map((a) => ({ id: a.id, kind: 'tool_call', tool: a.tool, runId: event.runId, callId: a.callId, arguments: a.arguments, reason: a.reason ?? '', requestedAt: now }));
          app.setRunApprovals([...app.runApprovals.filter((a) => a.runId !== event.runId), ...fresh]);
          finish('paused', 'Paused: approve or deny the tool call under “Pending approvals”.');
          return true;
        }
        case 'agent.error':
          if (event.error.code === 'aborted') finish('stopped', 'Stopped.');
          else failed(event.error.code, event.error.status ?? undefined, event.error.message);
          return true;
        default:
          return false;
      }
    }
  }

  /** Whether the focus is in the chat or nowhere (the Stop button, disabled at a run's end,
   *  lets go of it; so does a decided approval card, drawn anew). */
  function focusIsFree(): boolean {
    const active = document.activeElement;
    return !active || active === document.body || form.contains(active) || transcript.contains(active);
  }

  /** A line in the transcript from the page itself (a new agent started, say). */
  function notice(text: string): void {
    transcript.querySelector('.empty-note')?.remove();
    transcript.append(h('p', { class: 'msg-notice muted', role: 'note' }, text));
    transcript.scrollTop = transcript.scrollHeight;
  }

  setState('loading');
  return { setState, notice };
}

/** What the page's provider kinds speak, for "this is not …". */
const APIS: Record<ProviderKind, string> = { local: 'an OpenAI-compatible API', openai: 'an OpenAI-compatible API', anthropic: 'the Anthropic API', ollama: 'an Ollama server' };

/** A plain sentence for the failures a person trying providers meets; the raw message is shown
 *  under it in a "Details" disclosure. `midAnswer`: part of the answer had arrived; `kind`: the
 *  provider the run used. */
export function explain(code: string | undefined, status: number | undefined, message: string, context: { midAnswer?: boolean; kind?: ProviderKind } = {}): string {
  // A stream cut off: the browser's "network error" while reading a body (fetch itself fails
  // with "Failed to fetch"), or a stream the server ended before the answer did.
  const cutOff = (code === 'provider_network' && (context.midAnswer || /network error: (network error|error in body stream|the network connection was lost)/i.test(message))) || (code === 'provider_protocol' && context.midAnswer && /stream ended before/i.test(message));
  if (cutOff) return 'The connection to the model server was lost mid-answer (what arrived is above): try again.';
  if (code === 'provider_network' && context.kind === 'local') {
    return 'Could not reach the local model server: start it with `bash scripts/model/start.sh` (or `bash scripts/demo.sh`), or choose another provider under Provider.';
  }
  if (code === 'provider_network') return 'Could not reach the model server: is it running, and does it accept requests from this page (CORS)?';
  if (code === 'provider_timeout') return 'The model took too long to answer.';
  if (/exceed_context|context (size|length)|too long|maximum context/i.test(message)) return 'The conversation is too long for this model: start a new session or send less.';
  if (code === 'provider_http' && (status === 401 || status === 403)) return 'The provider refused the request: check the API key.';
  if (code === 'provider_http' && status === 404) return 'The provider does not know this address or model: check the base URL and the model name.';
  if (code === 'provider_http' && status === 429) return 'The provider is limiting requests: wait a moment and try again.';
  if (code === 'provider_http' && status !== undefined && status >= 500) return `The model server failed on this request (HTTP ${status}): try again, or check the server's logs.`;
  // A web page (a web UI, a proxy's login page) where the API should be.
  if (code === 'provider_protocol' && /expected an event stream, got text\/html/i.test(message)) return `The base URL answers, but not as ${APIS[context.kind ?? 'openai']} (it sent a web page): check the base URL.`;
  if (/peg-native|does not match the expected/i.test(message)) return 'The model wrote a tool call its server could not read (small local models do this): try again or rephrase.';
  if (code === 'max_turns_exceeded' || code === 'max_steps_exceeded') return 'The agent used up its turns without a final answer.';
  if (code === 'invalid_resume') return `This run can no longer be resumed: ${message}`;
  return `The run failed (${code ?? 'error'}): ${message}`;
}
