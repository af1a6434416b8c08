/**
 * The forge timeline: one card per forge attempt, built only from the events the runtime
 * emits (request, each test, the judge's verdict, registration or rejection), plus promotion,
 * demotion and approval entries.
 */
import type { App } from './app.ts';
import { $, brief, h, pretty, time } from './dom.ts';
import { isEmergentEvent, type DemoEvent, type EmergentEvent, type TestResult, type Verdict } from './runtime.ts';

interface Card {
  el: HTMLLIElement;
  name: string;
  /** The run that forges it ("" or none for agent.forge() and imports). */
  runId?: string;
  tests: HTMLOListElement;
  body: HTMLDivElement;
  status: HTMLSpanElement;
  open: boolean;
  requestStep: HTMLElement;
  request?: boolean;
}

/** A forge_tool call not matched to a card yet. */
interface Request {
  runId?: string;
  name?: string;
  args: unknown;
}

export function mountTimeline(app: App): void {
  const list = $<HTMLOListElement>('#timeline');
  const empty = $('#timeline-empty');
  const note = $('#timeline-note');
  const cards: Card[] = [];
  // forge_tool calls seen in the stream before their forge.start: the request as the model sent it.
  let requests: Request[] = [];

  app.onRuntime((runtime) => {
    const missing = runtime && !runtime.emergentAvailable;
    note.hidden = !missing;
    note.textContent = missing ? 'Emergent API not available in this build: the package does not ship forge events yet, so no forge can appear here.' : '';
    // The timeline shows what happens while the page is open; after a reload the registry still
    // holds earlier forges, and "No forge yet" would contradict it.
    if (runtime && !missing) {
      void runtime.audit().then(
        (trail) => {
          if (trail.length > 0) empty.textContent = 'Nothing forged since this page loaded. Earlier forges, verdicts and promotions are in each tool’s audit trail under Registry.';
        },
        () => undefined,
      );
    }
  });

  // A forge cut off by Stop (or by its run failing) sends no forge.rejected: once its run is
  // over, a card still open is marked stopped instead of "forging…" for good.
  app.onRunEnd((runId, forge) => {
    for (const card of cards) if (card.open && runId !== undefined && card.runId === runId && (forge === undefined || card.name === forge)) close(card, 'stopped', 'stopped', 'badge-muted');
    requests = requests.filter((r) => r.runId !== runId);
  });

  app.onEvent((event) => {
    if (event.type === 'tool.call' && event.name === 'forge_tool') {
      const request: Request = { runId: event.runId, name: requestName(event.arguments), args: event.arguments };
      // Registry events reach agent.on synchronously, before the run's stream yields the
      // tool call: a card of this run already started for it (still forging, or already
      // rejected) gets the request now. Calls come in order, so the oldest such card is its.
      const card = cards.find((c) => !c.request && c.runId === request.runId && (request.name === undefined || c.name === request.name));
      if (card) attachRequest(card, request.args);
      else requests.push(request);
      return;
    }
    render(event);
    if (isEmergentEvent(event)) follow();
  });

  /** The open card of this forge: same name and same run (agent.forge() has runId ""), so two
   *  forges of one name at once (a chat run's and the example button's) keep to their own cards. */
  function cardFor(name: string, runId: string | undefined): Card {
    const open = [...cards].reverse().find((c) => c.name === name && c.runId === runId && c.open);
    return open ?? startCard(name, undefined, runId);
  }

  function startCard(name: string, mode: string | undefined, runId: string | undefined): Card {
    const status = h('span', { class: 'badge badge-running' }, 'forging…');
    const tests = h('ol', { class: 'tests', 'aria-label': `Tests of ${name}` });
    const body = h('div', { class: 'card-body' });
    const el = h(
      'li',
      { class: 'tl-card', 'data-kind': 'forge', 'data-name': name, 'data-status': 'running' },
      h('div', { class: 'tl-head' }, h('span', { class: 'tl-title' }, 'Forge ', name ? h('code', {}, name) : 'of an unnamed tool'), mode ? h('span', { class: 'badge badge-muted' }, mode) : null, status, h('time', { class: 'muted tl-time' }, time(Date.now()))),
      body,
    );
    // The request of this run's forge_tool call with this name (as the package normalizes it).
    const i = runId === undefined ? -1 : requests.findIndex((r) => r.runId === runId && (r.name === undefined || r.name === name));
    const request = i >= 0 ? requests.splice(i, 1)[0] : undefined;
    const requestStep = h('div', { class: 'tl-step', 'data-step': 'request' }, h('span', { class: 'step-label' }, 'Request'), ' ', mode ? `${mode} tool` : 'tool');
    body.append(requestStep, h('div', { class: 'step-label' }, 'Tests'), tests);
    const card: Card = { el, name, runId, tests, body, status, open: true, requestStep };
    if (request) attachRequest(card, request.args);
    cards.push(card);
    list.append(el);
    empty.hidden = true;
    follow();
    return card;
  }

  function close(card: Card, state: string, label: string, badge: string): void {
    card.open = false;
    card.el.dataset.status = state;
    card.status.textContent = label;
    card.status.className = `badge ${badge}`;
  }

  /** The forge_tool arguments as the model sent them (absent for agent.forge() and imports), in
   *  a scrolling block the keyboard reaches. */
  function attachRequest(card: Card, request: unknown): void {
    card.request = true;
    const r = request as { description?: unknown };
    const step = h('div', { class: 'tl-step', 'data-step': 'request' }, h('span', { class: 'step-label' }, 'Request'), ' ', typeof r?.description === 'string' ? r.description : '');
    card.requestStep.replaceWith(step, h('details', { class: 'tl-json' }, h('summary', {}, 'forge_tool arguments'), h('pre', { tabindex: '0', 'aria-label': `forge_tool arguments of ${card.name}` }, pretty(request))));
    card.requestStep = step;
  }

  function entry(kind: string, ...content: (string | Node | null)[]): void {
    list.append(h('li', { class: `tl-entry tl-${kind}`, 'data-kind': kind }, ...content, ' ', h('time', { class: 'muted tl-time' }, time(Date.now()))));
    empty.hidden = true;
    follow();
  }

  /** Keeps the newest entry in view (the list scrolls on its own). */
  function follow(): void {
    list.scrollTop = list.scrollHeight;
  }

  function render(event: DemoEvent): void {
    const e = event as EmergentEvent;
    switch (e.type) {
      case 'forge.start':
        startCard(e.name, e.mode, e.runId);
        break;
      case 'forge.test': {
        const card = cardFor(e.name, e.runId);
        card.tests.append(testItem(e.test));
        break;
      }
      case 'forge.judge': {
        const card = cardFor(e.name, e.runId);
        card.body.append(verdictBlock(e.verdict));
        break;
      }
      case 'forge.registered': {
        const card = cardFor(e.name, e.runId);
        close(card, 'registered', e.unchanged ? 'unchanged' : 'registered', 'badge-ok');
        // An unchanged forge was the tool already there: nothing was tested or judged again.
        const label = e.unchanged ? 'Already registered' : 'Registered';
        const note = e.unchanged ? ' (the same request again: not tested or judged again)' : '';
        card.body.append(h('div', { class: 'tl-step tl-outcome ok', 'data-step': 'registered' }, h('span', { class: 'step-label' }, label), ` ${e.tier} tier, version ${e.version}, hash `, h('code', { title: e.hash }, e.hash.slice(0, 12)), note));
        break;
      }
      case 'forge.rejected': {
        const card = cardFor(e.name, e.runId);
        close(card, 'rejected', `rejected: ${e.category}`, 'badge-bad');
        card.body.append(h('div', { class: 'tl-step tl-outcome bad', 'data-step': 'rejected' }, h('span', { class: 'step-label' }, 'Rejected'), ' ', h('span', { class: 'category' }, e.category), ` — ${brief(e.reason, 400)}`));
        break;
      }
      case 'tool.promoted':
        entry('promoted', h('span', { class: 'badge badge-ok' }, 'promoted'), ' ', h('code', {}, e.name), ` ${e.fromTier} → ${e.toTier} (v${e.version})`);
        break;
      case 'tool.demoted':
        entry('demoted', h('span', { class: 'badge badge-warn' }, 'demoted'), ' ', h('code', {}, e.name), ` ${e.fromTier} → ${e.toTier}`);
        break;
      case 'promotion.rejected':
        entry(
          'promotion-rejected',
          h('span', { class: 'badge badge-bad' }, 'promotion rejected'),
          ' ',
          h('code', {}, e.name),
          ` ${e.fromTier} → ${e.toTier}`,
          h('div', { class: 'muted' }, brief(e.reason, 300)),
        );
        break;
      case 'registry.reloaded':
        entry('reloaded', h('span', { class: 'badge' }, 're-read'), ` ${e.tier} tier changed elsewhere: ${e.tools} tool${e.tools === 1 ? '' : 's'}`);
        break;
      case 'approval.requested':
        entry(
          'approval',
          h('span', { class: 'badge badge-warn' }, 'approval requested'),
          ' ',
          e.approval.kind === 'tool_call' ? 'call of ' : 'promotion of ',
          h('code', {}, e.approval.tool),
          e.approval.fromTier || e.approval.toTier ? ` ${e.approval.fromTier ?? '?'} → ${e.approval.toTier ?? '?'}` : '',
          e.approval.reason ? h('div', { class: 'muted' }, brief(e.approval.reason, 200)) : '',
        );
        break;
      default:
        break;
    }
  }
}

/**
 * The tool name of forge_tool arguments as the package reads it (`name_of` and `snake_name`
 * in src/forge/request.rs): `name`, `toolName` or `tool_name`, in arguments given as an object
 * or as JSON text; a name that is not a valid tool name has each run of characters outside
 * [A-Za-z0-9_-] made one `_` ("Echo Number Tool" → Echo_Number_Tool). Undefined when none is
 * found: the request then goes to the run's next card whatever its name.
 */
export function requestName(args: unknown): string | undefined {
  let obj = args;
  if (typeof obj === 'string') {
    try {
      obj = JSON.parse(obj);
    } catch {
      return undefined;
    }
  }
  if (!obj || typeof obj !== 'object') return undefined;
  const record = obj as Record<string, unknown>;
  const raw = [record.name, record.toolName, record.tool_name].find((v) => typeof v === 'string') as string | undefined;
  if (raw === undefined) return undefined;
  const name = raw.trim();
  if (/^[A-Za-z0-9_-]{1,64}$/.test(name)) return name;
  return name.replace(/[^A-Za-z0-9_-]+/g, '_').replace(/^_+|_+$/g, '').slice(0, 64);
}

function testItem(test: TestResult): HTMLLIElement {
  return h(
    'li',
    { class: `test ${test.passed ? 'ok' : 'bad'}`, 'data-passed': String(test.passed) },
    h('span', { class: 'test-mark', 'aria-hidden': 'true' }, test.passed ? '✓' : '✗'),
    ` #${test.index + 1} ${test.passed ? 'passed' : 'failed'} `,
    h('span', { class: 'muted' }, `(${Math.round(test.durationMs * 10) / 10} ms)`),
    h('div', { class: 'test-io' }, h('code', {}, brief(test.input, 100)), ' → ', h('code', {}, test.error ? `error: ${brief(test.error, 160)}` : brief(test.actualOutput, 100))),
    test.expectedOutput !== undefined && !test.passed ? h('div', { class: 'test-io muted' }, 'expected ', h('code', {}, brief(test.expectedOutput, 100))) : null,
  );
}

function verdictBlock(verdict: Verdict): HTMLDivElement {
  const pct = (n: number) => `${Math.round(n * 100)}%`;
  return h(
    'div',
    { class: `tl-step verdict ${verdict.approved ? 'ok' : 'bad'}`, 'data-step': 'judge' },
    h('span', { class: 'step-label' }, 'Judge'),
    ` ${verdict.approved ? 'approves' : 'declines'}, confidence `,
    h('strong', {}, pct(verdict.confidence)),
    h('div', { class: 'scores muted' }, `safety ${pct(verdict.safety)} · correctness ${pct(verdict.correctness)} · determinism ${pct(verdict.determinism)} · boundedness ${pct(verdict.boundedness)}`),
    verdict.reasoning ? h('details', {}, h('summary', {}, 'Reasoning'), h('p', {}, verdict.reasoning)) : null,
  );
}
