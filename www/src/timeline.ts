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
  tests: HTMLOListElement;
  body: HTMLDivElement;
  status: HTMLSpanElement;
  open: boolean;
  requestStep: HTMLElement;
  request?: boolean;
}

export function mountTimeline(app: App): void {
  const list = $<HTMLOListElement>('#timeline');
  const empty = $('#timeline-empty');
  const note = $('#timeline-note');
  const cards: Card[] = [];
  // forge_tool calls seen in the stream: the request as the model sent it, by tool name.
  const requests = new Map<string, unknown>();

  app.onRuntime((runtime) => {
    const missing = runtime && !runtime.emergentAvailable;
    note.hidden = !missing;
    note.textContent = missing ? 'Emergent API not available in this build: the package does not ship forge events yet, so no forge can appear here.' : '';
  });

  app.onEvent((event) => {
    if (event.type === 'tool.call' && event.name === 'forge_tool') {
      const args = event.arguments as { name?: unknown } | null;
      const name = args && typeof args === 'object' && typeof args.name === 'string' ? args.name : undefined;
      // Registry events reach agent.on synchronously, before the run's stream yields the
      // tool call: a card already forging this name gets the request now.
      const open = name ? cardFor(name, false) : undefined;
      if (open && !open.request) attachRequest(open, event.arguments);
      else requests.set(name ?? '?', event.arguments);
      return;
    }
    render(event);
    if (isEmergentEvent(event)) follow();
  });

  function cardFor(name: string, create: boolean): Card | undefined {
    const open = [...cards].reverse().find((c) => c.name === name && c.open);
    if (open || !create) return open;
    return startCard(name, undefined);
  }

  function startCard(name: string, mode: string | undefined): Card {
    const status = h('span', { class: 'badge badge-running' }, 'forging…');
    const tests = h('ol', { class: 'tests', 'aria-label': `Tests of ${name}` });
    const body = h('div', { class: 'card-body' });
    const el = h(
      'li',
      { class: 'tl-card', 'data-kind': 'forge', 'data-name': name, 'data-status': 'running' },
      h('div', { class: 'tl-head' }, h('span', { class: 'tl-title' }, 'Forge ', h('code', {}, name)), mode ? h('span', { class: 'badge badge-muted' }, mode) : null, status, h('time', { class: 'muted tl-time' }, time(Date.now()))),
      body,
    );
    const request = requests.get(name) ?? requests.get('?');
    requests.delete(name);
    requests.delete('?');
    const requestStep = h('div', { class: 'tl-step', 'data-step': 'request' }, h('span', { class: 'step-label' }, 'Request'), ' ', mode ? `${mode} tool` : 'tool');
    body.append(requestStep, h('div', { class: 'step-label' }, 'Tests'), tests);
    const card: Card = { el, name, tests, body, status, open: true, requestStep };
    if (request !== undefined) attachRequest(card, request);
    cards.push(card);
    list.append(el);
    empty.hidden = true;
    follow();
    return card;
  }

  /** The forge_tool arguments as the model sent them (absent for agent.forge() and imports). */
  function attachRequest(card: Card, request: unknown): void {
    card.request = true;
    const r = request as { description?: unknown };
    const step = h('div', { class: 'tl-step', 'data-step': 'request' }, h('span', { class: 'step-label' }, 'Request'), ' ', typeof r?.description === 'string' ? r.description : '');
    card.requestStep.replaceWith(step, h('details', { class: 'tl-json' }, h('summary', {}, 'forge_tool arguments'), h('pre', {}, pretty(request))));
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
        startCard(e.name, e.mode);
        break;
      case 'forge.test': {
        const card = cardFor(e.name, true)!;
        card.tests.append(testItem(e.test));
        break;
      }
      case 'forge.judge': {
        const card = cardFor(e.name, true)!;
        card.body.append(verdictBlock(e.verdict));
        break;
      }
      case 'forge.registered': {
        const card = cardFor(e.name, true)!;
        card.open = false;
        card.el.dataset.status = 'registered';
        card.status.textContent = 'registered';
        card.status.className = 'badge badge-ok';
        card.body.append(h('div', { class: 'tl-step tl-outcome ok', 'data-step': 'registered' }, h('span', { class: 'step-label' }, 'Registered'), ` ${e.tier} tier, version ${e.version}, hash `, h('code', { title: e.hash }, e.hash.slice(0, 12))));
        break;
      }
      case 'forge.rejected': {
        const card = cardFor(e.name, true)!;
        card.open = false;
        card.el.dataset.status = 'rejected';
        card.status.textContent = `rejected: ${e.category}`;
        card.status.className = 'badge badge-bad';
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
