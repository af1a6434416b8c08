/**
 * The registry: every tool with tier, version, hash, stats, code or pipeline, audit trail,
 * and the actions (request promotion, demote, roll back, export, import).
 */
import type { App } from './app.ts';
import { $, brief, clear, errorText, h, pretty, rebuild, setDisabled, time } from './dom.ts';
import { highlightJs } from './highlight.ts';
import { EmergentUnavailable, type AuditEntry, type Tier, type ToolInfo } from './runtime.ts';

// Shared is reached from the agent tier only (the package refuses session → shared).
const NEXT_TIERS: Record<Tier, Tier[]> = { session: ['agent'], agent: ['shared'], shared: [] };
// The package's export and rollback act on the tool of a name the session calls (the first
// active one in this order), its demote on the highest active one: both take a name, not a tier.
const CALLED_FIRST: Tier[] = ['session', 'agent', 'shared'];
const HIGHEST_FIRST: Tier[] = ['shared', 'agent', 'session'];

export function mountRegistry(app: App): void {
  const list = $<HTMLUListElement>('#registry-list');
  const empty = $('#registry-empty');
  const detail = $('#registry-detail');
  const note = $('#registry-note');
  const importForm = $<HTMLFormElement>('#import-form');
  const importText = $<HTMLTextAreaElement>('#import-text');
  const importStatus = $('#import-status');
  let tools: ToolInfo[] = [];
  let audit: AuditEntry[] = [];
  // One name may exist in several tiers (a session copy over an agent or shared one): select by both.
  const keyOf = (t: ToolInfo) => `${t.tier}:${t.name}`;
  let selected: string | undefined;
  let exported: { key: string; name: string; yaml: string } | undefined;
  let actionStatus = '';
  // An action in flight: the detail's action buttons are disabled (also in a detail rebuilt
  // meanwhile by a refresh), so a double click cannot demote two tiers or promote twice.
  // Disabled by aria-disabled, not `disabled`: a disabled button drops the keyboard focus to
  // the top of the page; the handlers ignore clicks meanwhile.
  let acting = false;
  // Aborts the action in flight, when it can be stopped.
  let actionStop: AbortController | undefined;
  // Likewise an import: a second one of the same package would add another version (and ask
  // the judge again).
  let importing = false;
  const importButton = $<HTMLButtonElement>('#import-button');
  const keepHint = $('#registry-keep');
  const keepText = keepHint.textContent ?? '';
  const enableImport = () => {
    const runtime = app.runtime;
    // A build without the emergent API can never import: disabled for good.
    const never = runtime !== undefined && !runtime.emergentAvailable;
    importButton.disabled = never;
    importText.disabled = never;
    // No agent in this tab (starting, or another tab holds it) or an import going: shown
    // disabled, keeping the focus; the submit handler says why or ignores it.
    setDisabled(importButton, importing || !runtime);
    setDisabled(importText, !runtime);
  };
  enableImport();

  app.onRefresh(refresh);
  // What an action left to say about a tool ("pending — waiting for human approval") is over
  // once the tool moves or its promotion is decided, here or in Pending approvals.
  app.onEvent((event) => {
    const moved = event.type === 'tool.promoted' || event.type === 'tool.demoted' || event.type === 'promotion.rejected';
    if (moved && !acting && event.name === detail.dataset.tool) actionStatus = '';
  });
  app.onRuntime((runtime) => {
    enableImport();
    if (runtime) {
      keepHint.textContent = runtime.memoryOnly ? 'Session-tier tools last until another provider is applied, promoted ones until this page is reloaded: this browser keeps nothing for the page.' : keepText;
      return;
    }
    // No agent, no registry to read: what the list showed is not known to be so any more (and
    // "no forged tools" would not be known either).
    clear(list);
    clear(detail);
    delete detail.dataset.shown;
    empty.textContent = 'The registry shows once this tab holds the agent.';
    empty.hidden = false;
  });

  async function refresh(): Promise<void> {
    const runtime = app.runtime;
    if (!runtime) return;
    try {
      [tools, audit] = await Promise.all([runtime.listTools(app.sessionId), runtime.audit().catch(() => [] as AuditEntry[])]);
      note.hidden = true;
    } catch (error) {
      tools = [];
      note.hidden = false;
      note.textContent = error instanceof EmergentUnavailable ? 'Emergent API not available in this build: no registry to show yet. The host tools are listed in the chat panel.' : `Could not read the registry: ${errorText(error)}`;
    }
    const forged = tools.filter((t) => t.mode !== 'host');
    renderList(forged);
    renderDetail(forged.find((t) => keyOf(t) === selected));
  }

  function renderList(forged: ToolInfo[]): void {
    rebuild(list, () => fillList(forged));
  }

  function fillList(forged: ToolInfo[]): void {
    empty.textContent = 'No forged tools yet.';
    empty.hidden = forged.length > 0;
    if (selected && !forged.some((t) => keyOf(t) === selected)) {
      // The selected tool moved tier (promotion, demotion): follow it by name.
      const name = selected.slice(selected.indexOf(':') + 1);
      const moved = forged.find((t) => t.name === name);
      selected = moved ? keyOf(moved) : undefined;
    }
    if (!selected && forged.length > 0) selected = keyOf(forged[0]!);
    for (const t of forged) {
      const button = h(
        'button',
        // Named by what it shows ("slugify session v1"), spaced by text the flex row does not draw.
        { type: 'button', class: 'tool-item', 'data-key': `tool-${keyOf(t)}`, 'aria-pressed': String(keyOf(t) === selected), 'data-tool': t.name, 'data-tier': t.tier },
        h('code', { class: 'tool-name' }, t.name),
        ' ',
        h('span', { class: `badge tier tier-${t.tier}` }, t.tier),
        ' ',
        h('span', { class: 'muted' }, `v${t.version}`),
        t.status === 'demoted' ? ' ' : null,
        t.status === 'demoted' ? h('span', { class: 'badge badge-warn' }, 'demoted') : null,
      );
      button.addEventListener('click', () => {
        selected = keyOf(t);
        exported = undefined;
        actionStatus = '';
        renderList(forged);
        renderDetail(t);
        detail.focus();
      });
      list.append(h('li', {}, button));
    }
  }

  function renderDetail(t: ToolInfo | undefined): void {
    // The same tool drawn again (also in another tier, after a promotion or demotion) keeps an
    // open disclosure, a version picked, the focus.
    if (t && detail.dataset.tool === t.name && detail.dataset.shown) rebuild(detail, () => fillDetail(t));
    else {
      clear(detail);
      delete detail.dataset.shown;
      if (t) fillDetail(t);
    }
  }

  function fillDetail(t: ToolInfo): void {
    const s = t.stats;
    detail.dataset.tool = t.name;
    detail.dataset.shown = keyOf(t);
    detail.append(
      h('h3', {}, h('code', {}, t.name), ' ', h('span', { class: `badge tier tier-${t.tier}` }, t.tier)),
      h('p', {}, t.description),
      h(
        'dl',
        { class: 'facts' },
        fact('Tier', t.tier),
        fact('Version', `${t.version}${t.versions.length > 1 ? ` (kept: ${t.versions.join(', ')})` : ''}`),
        fact('Hash', h('code', { title: t.hash }, t.hash.slice(0, 16) + (t.hash.length > 16 ? '…' : ''))),
        fact('Mode', t.mode),
        fact('Status', t.status),
        fact('Calls', String(s.calls)),
        fact('Success rate', s.calls ? `${Math.round(s.successRate * 100)}% (${s.successes}/${s.calls})` : '—'),
        fact('Avg latency', s.calls ? `${Math.round(s.avgLatencyMs * 10) / 10} ms` : '—'),
        t.verdict ? fact('Judge confidence', `${Math.round(t.verdict.confidence * 100)}%`) : null,
        fact('Created', new Date(t.createdAt).toLocaleString()),
      ),
      implementationBlock(t),
      // Scrollable, so reachable by keyboard.
      h('details', { class: 'schemas', 'data-key': 'schemas' }, h('summary', {}, 'Schemas'), h('h4', {}, 'Input'), h('pre', { tabindex: '0', 'aria-label': `Input schema of ${t.name}` }, pretty(t.inputSchema)), h('h4', {}, 'Output'), h('pre', { tabindex: '0', 'aria-label': `Output schema of ${t.name}` }, pretty(t.outputSchema))),
      actions(t),
      auditBlock(t.name),
    );
  }

  function implementationBlock(t: ToolInfo): HTMLElement {
    const impl = t.implementation;
    if (impl?.mode === 'sandbox') {
      const code = h('code', { class: 'language-js' });
      code.append(highlightJs(impl.code));
      return h('div', { class: 'impl' }, h('h4', {}, 'Code ', h('span', { class: 'muted' }, '(read-only, runs in the sandbox)')), h('pre', { class: 'code', tabindex: '0', 'aria-label': `Source of ${t.name}` }, code), impl.allowlist?.length ? h('p', { class: 'muted' }, `Allowed APIs: ${impl.allowlist.join(', ')}`) : null);
    }
    if (impl?.mode === 'compose') {
      return h(
        'div',
        { class: 'impl' },
        h('h4', {}, 'Compose pipeline'),
        h('ol', { class: 'pipeline' }, ...impl.steps.map((step) => h('li', {}, h('strong', {}, step.name), ': ', h('code', {}, step.tool), h('pre', {}, pretty(step.inputMapping))))),
      );
    }
    return h('div', { class: 'impl' }, h('h4', {}, 'Code'), h('p', { class: 'muted' }, 'Source redacted (not persisted).'));
  }

  function actions(t: ToolInfo): HTMLElement {
    const box = h('div', { class: 'actions' }, h('h4', {}, 'Actions'));
    const status = h('p', { class: 'hint action-status', role: 'status' }, actionStatus);
    /** Runs an action; `outcome` words its result (only a promotion request has one to tell).
     *  A `stoppable` action (a promotion: its panel may be a slow local model) gets a Stop
     *  button while it runs. */
    const act = async (label: string, fn: (signal?: AbortSignal) => Promise<unknown>, outcome?: (result: unknown) => string, stoppable = false) => {
      if (acting) return;
      acting = true;
      setActionsDisabled(true);
      const stopping = stoppable ? new AbortController() : undefined;
      actionStop = stopping;
      if (stopping) status.before(stopButton());
      actionStatus = `${label}…`;
      status.textContent = actionStatus;
      try {
        const result = await app.during(`“${label}”`, () => fn(stopping?.signal));
        actionStatus = `${label}: ${outcome ? outcome(result) : 'done.'}`;
      } catch (error) {
        actionStatus = stopping?.signal.aborted ? `${label} stopped: nothing was recorded.` : `${label} failed: ${errorText(error)}`;
      } finally {
        acting = false;
        actionStop = undefined;
        for (const b of detail.querySelectorAll('[data-action="stop-action"]')) b.remove();
        setActionsDisabled(false);
      }
      status.textContent = actionStatus;
      app.announce(actionStatus);
      app.refreshSoon(0);
    };
    // requestPromotion resolves with { status: promoted | pending | rejected | suppressed, reason }.
    const promotionOutcome = (result: unknown): string => {
      const r = result as { status?: unknown; reason?: unknown } | undefined;
      if (!r || typeof r.status !== 'string') return 'done.';
      return `${r.status}${typeof r.reason === 'string' && r.reason ? ` — ${brief(r.reason, 300)}` : ''}`;
    };
    const runtime = app.runtime!;
    // One name may be listed in several tiers: an action is offered only on the entry it acts
    // on, or Export on an agent-tier v1 under a session v2 would hand out v2.
    const activeIn = (order: Tier[]) => order.map((tier) => tools.find((x) => x.name === t.name && x.tier === tier && x.status === 'active')).find(Boolean);
    const called = activeIn(CALLED_FIRST);
    const highest = activeIn(HIGHEST_FIRST);
    const isCalled = called !== undefined && keyOf(called) === keyOf(t);

    // A demoted entry stays listed for its audit trail and versions; it cannot move any more.
    const targets = t.status === 'active' ? NEXT_TIERS[t.tier] : [];
    if (targets.length > 0) {
      const select = h('select', { id: 'promote-tier', 'aria-label': 'Promote to tier' }, ...targets.map((tier) => h('option', { value: tier }, tier)));
      box.append(
        h(
          'div',
          { class: 'row' },
          h('label', { for: 'promote-tier' }, 'Promote to'),
          select,
          h('button', { type: 'button', 'data-action': 'promote', 'data-key': 'promote', onclick: () => void act(`Promotion of ${t.name} to ${select.value}`, (signal) => runtime.requestPromotion(t.name, select.value as Tier, app.sessionId, signal), promotionOutcome, true) }, 'Request promotion'),
        ),
      );
    }
    const row = h('div', { class: 'row' });
    // Session is the lowest tier: demoting moves shared → agent and agent → this session.
    if (t.tier !== 'session' && t.status === 'active' && highest !== undefined && keyOf(highest) === keyOf(t)) {
      row.append(h('button', { type: 'button', 'data-action': 'demote', 'data-key': 'demote', onclick: () => void act(`Demote ${t.name}`, () => runtime.demote(t.name, app.sessionId)) }, 'Demote'));
    }
    // Only what the tier lets back: above the session, a version its review never passed is refused.
    const older = isCalled ? t.restorableVersions.filter((v) => v !== t.version) : [];
    if (older.length > 0) {
      const select = h('select', { id: 'rollback-version', 'aria-label': 'Version to roll back to' }, ...older.map((v) => h('option', { value: String(v) }, `v${v}`)));
      row.append(h('label', { for: 'rollback-version' }, 'Roll back to'), select, h('button', { type: 'button', 'data-action': 'rollback', 'data-key': 'rollback', onclick: () => void act(`Roll back ${t.name} to v${select.value}`, () => runtime.rollback(t.name, Number(select.value), app.sessionId)) }, 'Roll back'));
    }
    if (isCalled) {
      row.append(
        h('button', {
          type: 'button',
          'data-action': 'export', 'data-key': 'export',
          onclick: () =>
            void act(`Export ${t.name}`, async () => {
              exported = { key: keyOf(t), name: t.name, yaml: await runtime.exportTool(t.name, app.sessionId) };
              renderDetail(t);
            }),
        }, 'Export'),
      );
    }
    box.append(row);
    const elsewhere = [
      !isCalled && called ? `Export and roll back act on the ${t.name} this session calls: v${called.version} in the ${called.tier} tier.` : '',
      t.status === 'active' && t.tier !== 'session' && highest && keyOf(highest) !== keyOf(t) ? `Demote acts on the ${highest.tier} tier's ${t.name} first.` : '',
    ].filter(Boolean);
    if (elsewhere.length > 0) box.append(h('p', { class: 'hint', 'data-hint': 'elsewhere' }, elsewhere.join(' ')));
    if (actionStop) box.append(stopButton());
    box.append(status);
    if (exported?.key === keyOf(t)) box.append(exportBlock(exported.name, exported.yaml));
    if (acting) for (const b of box.querySelectorAll<HTMLButtonElement>(':scope > .row button')) setDisabled(b, true);
    return box;
  }

  /** Stops the action in flight (drawn again when a refresh rebuilds the detail meanwhile). */
  function stopButton(): HTMLElement {
    return h('button', { type: 'button', 'data-action': 'stop-action', onclick: () => actionStop?.abort() }, 'Stop the promotion');
  }

  /** The detail's action buttons (of the detail shown now: a refresh may have rebuilt it). */
  function setActionsDisabled(disabled: boolean): void {
    for (const b of detail.querySelectorAll<HTMLButtonElement>('.actions > .row button')) setDisabled(b, disabled);
  }

  function exportBlock(name: string, yaml: string): HTMLElement {
    const area = h('textarea', { id: 'export-text', readonly: true, rows: '8', spellcheck: 'false' });
    area.value = yaml;
    const done = h('span', { class: 'hint', role: 'status' });
    return h(
      'div',
      { class: 'export stack' },
      h('label', { for: 'export-text' }, `Package of ${name} (YAML)`),
      area,
      h(
        'div',
        { class: 'row' },
        h('button', {
          type: 'button',
          onclick: () => {
            const url = URL.createObjectURL(new Blob([yaml], { type: 'application/yaml' }));
            const a = h('a', { href: url, download: `${name}.tool.yaml` });
            document.body.append(a);
            a.click();
            a.remove();
            setTimeout(() => URL.revokeObjectURL(url), 1000);
            done.textContent = 'Downloaded.';
          },
        }, 'Download'),
        h('button', {
          type: 'button',
          onclick: async () => {
            try {
              await navigator.clipboard.writeText(yaml);
              done.textContent = 'Copied.';
            } catch {
              area.select();
              done.textContent = 'Selected: press Ctrl+C to copy.';
            }
          },
        }, 'Copy'),
        done,
      ),
    );
  }

  function auditBlock(name: string): HTMLElement {
    const entries = audit.filter((e) => e.tool === name).slice(-50).reverse();
    return h(
      'div',
      { class: 'audit' },
      h('h4', {}, 'Audit trail'),
      entries.length === 0
        ? h('p', { class: 'muted' }, 'No entries.')
        : h('ol', { class: 'audit-list' }, ...entries.map((e) => h('li', { 'data-action': e.action }, h('time', { class: 'muted' }, time(e.at)), ' ', h('strong', {}, e.action), e.tier ? ` · ${e.tier}` : '', e.version !== undefined ? ` · v${e.version}` : '', e.detail ? ` — ${brief(e.detail, 240)}` : ''))),
    );
  }

  // The import in flight: its judge may be a slow local model.
  let importStop: AbortController | undefined;
  const importStopButton = $<HTMLButtonElement>('#import-stop');
  importStopButton.addEventListener('click', () => importStop?.abort());
  importForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    const pkg = importText.value.trim();
    if (importing) return;
    if (!app.runtime) {
      importStatus.textContent = 'Not imported: the registry opens once this tab holds the agent.';
      return;
    }
    if (!pkg) {
      importStatus.textContent = 'Paste a tool package (YAML) first.';
      return;
    }
    importing = true;
    enableImport();
    const stopping = (importStop = new AbortController());
    importStopButton.hidden = false;
    // Import is unavailable until the import ends: the focus goes on to its Stop.
    if (document.activeElement === importButton) importStopButton.focus();
    importStatus.textContent = 'Importing (hash check, tests, judge)…';
    try {
      const runtime = app.runtime;
      const result = (await app.during('the import', () => runtime.importTool(pkg, app.sessionId, stopping.signal))) as
        | { success?: boolean; reason?: string; category?: string; unchanged?: boolean; tool?: { name?: string; version?: number; tier?: string } }
        | undefined;
      if (result && result.success === false) importStatus.textContent = `Rejected (${result.category ?? 'other'}): ${result.reason ?? ''}`;
      else {
        const name = result?.tool?.name ? ` ${result.tool.name}` : '';
        // A package identical to the tool the session has is that tool: nothing was added.
        importStatus.textContent = result?.unchanged
          ? `Imported${name}: the same as v${result.tool?.version} here (${result.tool?.tier} tier), so nothing was tested or judged again.`
          : `Imported${name} into the session tier.`;
        importText.value = '';
      }
    } catch (error) {
      importStatus.textContent = stopping.signal.aborted ? 'Import stopped: nothing was recorded.' : `Import failed: ${errorText(error)}`;
    } finally {
      importing = false;
      importStop = undefined;
      // Hidden, Stop would drop the focus to the top of the page: back to Import.
      if (document.activeElement === importStopButton) importButton.focus();
      importStopButton.hidden = true;
      enableImport();
    }
    app.announce(importStatus.textContent ?? '');
    app.refreshSoon(0);
  });
}

function fact(term: string, value: string | Node): DocumentFragment {
  const frag = document.createDocumentFragment();
  frag.append(h('dt', {}, term), h('dd', { 'data-fact': term.toLowerCase().replace(/\s+/g, '-') }, value));
  return frag;
}
