/** Pending approvals (shared promotions, tool calls): approve or deny with a reason. */
import { RunGone, type App } from './app.ts';
import { $, brief, clear, errorText, h, rebuild, setDisabled, time } from './dom.ts';
import { EmergentUnavailable, type ApprovalDecision, type PendingApproval, type RunApproval } from './runtime.ts';

export function mountApprovals(app: App): void {
  const list = $<HTMLUListElement>('#approvals');
  const note = $('#approvals-note');
  let status = '';
  // The requests on view when `status` was written: a request that comes after it is not what
  // the line speaks of, so the line goes ("Approved: slugify." above a new request for slugify).
  let statusBefore = new Set<string>();
  let shownIds = new Set<string>();
  // Decisions on tool calls of a paused run, sent together once every call of the run is decided.
  const decided = new Map<string, ApprovalDecision>();
  // Runs being resumed or discarded, and promotion approvals being decided: not shown meanwhile,
  // so a second click cannot send the same decision again.
  const inFlight = new Set<string>();
  // Deny reasons typed so far, by approval id: every refresh rebuilds the cards, and a reason
  // typed for one call must outlive the decision on another.
  const reasons = new Map<string, string>();

  app.onRefresh(async () => {
    const runtime = app.runtime;
    if (!runtime) return;
    try {
      const pending = runtime.emergentAvailable ? (await runtime.pendingApprovals()).filter((p) => !inFlight.has(p.id)) : [];
      // A promotion approval names the version it is about by hash; the registry has its number.
      const versions = new Map<string, number>();
      if (pending.some((p) => p.hash)) for (const t of await runtime.listTools(app.sessionId)) versions.set(`${t.name}@${t.hash}`, t.version);
      note.hidden = true;
      const runs = app.runApprovals.filter((a) => !inFlight.has(a.runId));
      const undecided = runs.filter((a) => !a.decision && !decided.has(a.id));
      const toContinue = [...new Set(runs.filter((a) => a.decision).map((a) => a.runId))];
      render([...pending, ...undecided], toContinue, versions);
    } catch (error) {
      clear(list);
      note.hidden = false;
      note.textContent = error instanceof EmergentUnavailable ? 'Emergent API not available in this build: no approvals to show.' : `Could not read approvals: ${errorText(error)}`;
    }
  });

  /** Resolves `false` while other calls of the run still wait for a decision. */
  async function decideCall(p: RunApproval, approved: boolean, reason: string): Promise<boolean> {
    // Nothing is recorded while the run cannot be resumed: the person decides again later.
    if (app.running) throw new Error('a run is in progress; stop it first');
    decided.set(p.id, { id: p.id, approved, ...(approved ? {} : { reason }) });
    const ofRun = app.runApprovals.filter((a) => a.runId === p.runId);
    if (!ofRun.every((a) => decided.has(a.id))) return false;
    const decisions = ofRun.map((a) => decided.get(a.id)!);
    for (const a of ofRun) decided.delete(a.id);
    // Stored before the run continues: the approved call may run at once, and a reload (or a
    // resume that fails or is stopped) must then offer to continue the run with these
    // decisions, never ask again (a Deny would claim a refusal of a call that already ran).
    const byId = new Map(decisions.map((d) => [d.id, d]));
    app.setRunApprovals(app.runApprovals.map((a) => (byId.has(a.id) ? { ...a, decision: byId.get(a.id) } : a)));
    await continueRun(p.runId);
    return true;
  }

  /** Resumes a run with the decisions stored for it. */
  async function continueRun(runId: string): Promise<void> {
    const ofRun = app.runApprovals.filter((a) => a.runId === runId && a.decision);
    inFlight.add(runId);
    try {
      if (!app.resumeRun) throw new Error('the chat is not ready');
      // Rejects when the resume failed or was stopped: the decisions stay, to continue later.
      await app.resumeRun(runId, ofRun.map((a) => a.decision!));
      // Only the decided calls are done: a resumed run keeps its id, and when it paused again
      // its new approvals (added by the chat on `agent.paused`) must stay.
      const done = new Set(ofRun.map((a) => a.id));
      app.setRunApprovals(app.runApprovals.filter((a) => !done.has(a.id)));
    } catch (error) {
      if (!(error instanceof RunGone)) throw error;
      // Nothing left to decide on: dismiss the run's approvals instead of offering them forever.
      app.setRunApprovals(app.runApprovals.filter((a) => a.runId !== runId));
      throw new Error(`${error.message} — its approval was dismissed`);
    } finally {
      inFlight.delete(runId);
    }
  }

  /** Runs `work` for a card with its buttons disabled (a double click sends nothing twice),
   *  then shows `done` or the failure. */
  async function act(buttons: HTMLButtonElement[], key: string, work: () => Promise<string | undefined>, failed: string): Promise<void> {
    if (inFlight.has(key) || buttons.some((b) => b.getAttribute('aria-disabled') === 'true')) return;
    for (const b of buttons) setDisabled(b, true);
    try {
      const done = await work();
      if (done) status = done;
    } catch (error) {
      status = `${failed}: ${errorText(error)}`;
    }
    statusBefore = new Set(shownIds);
    for (const b of buttons) setDisabled(b, false);
    app.announce(status);
    app.refreshSoon(0);
  }

  function render(pending: Array<PendingApproval | RunApproval>, toContinue: string[], versions: Map<string, number>): void {
    rebuild(list, () => fill(pending, toContinue, versions));
  }

  function fill(pending: Array<PendingApproval | RunApproval>, toContinue: string[], versions: Map<string, number>): void {
    const shown = new Set(pending.map((p) => p.id));
    for (const id of reasons.keys()) if (!shown.has(id) && !inFlight.has(id)) reasons.delete(id);
    if (pending.some((p) => !statusBefore.has(p.id))) status = '';
    shownIds = shown;
    if (pending.length === 0 && toContinue.length === 0) list.append(h('li', { class: 'muted' }, 'Nothing waits for a human.'));
    for (const p of pending) {
      const reasonId = `deny-reason-${p.id}`;
      // Every card has an Approve, a Deny and a reason: their names say which card's they are,
      // for a screen reader listing the page's buttons or fields out of context.
      const what = `${p.kind === 'promotion' ? 'promotion' : 'call'} of ${p.tool}`;
      const reason = h('input', { id: reasonId, type: 'text', placeholder: 'why not', class: 'deny-reason', 'aria-label': `Why the ${what} is denied`, oninput: () => reasons.set(p.id, reason.value) });
      reason.value = reasons.get(p.id) ?? '';
      const buttons: HTMLButtonElement[] = [];
      const decide = (approve: boolean) =>
        act(
          buttons,
          p.id,
          async () => {
            const runtime = app.runtime;
            if (!runtime) return undefined;
            const why = reason.value.trim() || 'denied in the demo page';
            if (p.kind === 'tool_call' && 'runId' in p && p.runId) {
              if (!(await decideCall(p as RunApproval, approve, why))) return `${approve ? 'Approved' : 'Denied'}: ${p.tool}; decide the run's other calls to continue it.`;
            } else {
              inFlight.add(p.id);
              try {
                await app.during('a promotion approval', async () => void (approve ? await runtime.approve(p.id) : await runtime.deny(p.id, why)));
              } finally {
                inFlight.delete(p.id);
              }
            }
            return `${approve ? 'Approved' : 'Denied'}: ${p.tool}.`;
          },
          `Could not ${approve ? 'approve' : 'deny'}`,
        );
      const hash = 'hash' in p ? p.hash : undefined;
      const version = hash ? versions.get(`${p.tool}@${hash}`) : undefined;
      buttons.push(
        h('button', { type: 'button', class: 'primary', 'data-action': 'approve', 'data-key': `approve-${p.id}`, 'aria-label': `Approve the ${what}`, onclick: () => void decide(true) }, 'Approve'),
        h('button', { type: 'button', class: 'danger', 'data-action': 'deny', 'data-key': `deny-${p.id}`, 'aria-label': `Deny the ${what}`, onclick: () => void decide(false) }, 'Deny'),
      );
      list.append(
        h(
          'li',
          { class: 'approval', 'data-approval': p.id, 'data-tool': p.tool },
          h('div', {}, h('strong', {}, p.kind === 'promotion' ? 'Promote ' : 'Call '), h('code', {}, p.tool), p.fromTier || p.toTier ? ` ${p.fromTier ?? '?'} → ${p.toTier ?? '?'}` : '', ' ', h('time', { class: 'muted' }, time(p.requestedAt))),
          // The approval is for this exact version: a newer one is not promoted by it.
          hash ? h('p', { class: 'approval-version muted' }, version !== undefined ? `version ${version}, ` : '', 'hash ', h('code', { title: hash }, hash.slice(0, 12))) : null,
          p.reason ? h('p', { class: 'muted' }, p.reason) : null,
          p.kind === 'tool_call' && 'arguments' in p && p.arguments !== undefined ? h('pre', { class: 'approval-args' }, brief(p.arguments, 400)) : null,
          h('div', { class: 'row' }, buttons[0], h('label', { for: reasonId, class: 'visually-hidden' }, `Reason to deny ${p.tool}`), reason, buttons[1]),
        ),
      );
    }
    // Runs decided on but not finished (stopped, failed, or the page was reloaded meanwhile):
    // the decided calls may have run already, so the only choices are to continue or drop it.
    for (const runId of toContinue) {
      const ofRun = app.runApprovals.filter((a) => a.runId === runId && a.decision);
      const buttons: HTMLButtonElement[] = [];
      const tools = [...new Set(ofRun.map((a) => a.tool))].join(', ');
      buttons.push(
        h('button', { type: 'button', class: 'primary', 'data-action': 'continue', 'data-key': `continue-${runId}`, onclick: () => void act(buttons, runId, async () => (await continueRun(runId), `Continued the run of ${tools}.`), 'Could not continue') }, 'Continue the run'),
        h('button', { type: 'button', 'data-action': 'discard', 'data-key': `discard-${runId}`, onclick: () => void act(buttons, runId, () => discardRun(runId), 'Could not discard') }, 'Discard it'),
      );
      list.append(
        h(
          'li',
          { class: 'approval approval-decided', 'data-continue': runId, 'data-tool': ofRun[0]?.tool ?? '' },
          ...ofRun.map((a) => h('div', {}, h('strong', {}, 'Call '), h('code', {}, a.tool), ` ${a.decision!.approved ? 'approved' : `denied${a.decision!.reason ? ` (${a.decision!.reason})` : ''}`}`, a.arguments !== undefined ? h('pre', { class: 'approval-args' }, brief(a.arguments, 400)) : null)),
          h('p', { class: 'muted' }, 'Decided, but the run has not finished (it was stopped or failed, or the page was reloaded): continue it to give the model the result.'),
          h('div', { class: 'row' }, ...buttons),
        ),
      );
    }
    // The status inside an item (a list holds items only), announced from there.
    if (status) list.append(h('li', { class: 'hint' }, h('span', { role: 'status' }, status)));
  }

  async function discardRun(runId: string): Promise<string> {
    const runtime = app.runtime;
    if (!runtime) throw new Error('the agent is not ready');
    inFlight.add(runId);
    try {
      await runtime.discardRun(runId);
    } finally {
      inFlight.delete(runId);
    }
    app.setRunApprovals(app.runApprovals.filter((a) => a.runId !== runId));
    return 'Discarded the run.';
  }
}
