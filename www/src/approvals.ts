/** Pending approvals (shared promotions, tool calls): approve or deny with a reason. */
import { RunGone, type App } from './app.ts';
import { $, brief, clear, errorText, h, time } from './dom.ts';
import { EmergentUnavailable, type ApprovalDecision, type PendingApproval, type RunApproval } from './runtime.ts';

export function mountApprovals(app: App): void {
  const list = $<HTMLUListElement>('#approvals');
  const note = $('#approvals-note');
  let status = '';
  // Decisions on tool calls of a paused run, sent together once every call of the run is decided.
  const decided = new Map<string, ApprovalDecision>();

  app.onRefresh(async () => {
    const runtime = app.runtime;
    if (!runtime) return;
    try {
      const pending = runtime.emergentAvailable ? await runtime.pendingApprovals() : [];
      note.hidden = true;
      render([...pending, ...app.runApprovals.filter((a) => !decided.has(a.id))]);
    } catch (error) {
      clear(list);
      note.hidden = false;
      note.textContent = error instanceof EmergentUnavailable ? 'Emergent API not available in this build: no approvals to show.' : `Could not read approvals: ${errorText(error)}`;
    }
  });

  async function decideCall(p: RunApproval, approved: boolean, reason: string): Promise<void> {
    decided.set(p.id, { id: p.id, approved, ...(approved ? {} : { reason }) });
    const ofRun = app.runApprovals.filter((a) => a.runId === p.runId);
    if (!ofRun.every((a) => decided.has(a.id))) return;
    const decisions = ofRun.map((a) => decided.get(a.id)!);
    try {
      if (!app.resumeRun) throw new Error('the chat is not ready');
      // Rejects when the resume failed or was stopped: the approvals stay, to try again.
      await app.resumeRun(p.runId, decisions);
      // Only the decided calls are done: a resumed run keeps its id, and when it paused again
      // its new approvals (added by the chat on `agent.paused`) must stay.
      const done = new Set(ofRun.map((a) => a.id));
      app.setRunApprovals(app.runApprovals.filter((a) => !done.has(a.id)));
    } catch (error) {
      if (!(error instanceof RunGone)) throw error;
      // Nothing left to decide on: dismiss the run's approvals instead of offering them forever.
      app.setRunApprovals(app.runApprovals.filter((a) => a.runId !== p.runId));
      throw new Error(`${error.message} — its approval was dismissed`);
    } finally {
      for (const a of ofRun) decided.delete(a.id);
    }
  }

  function render(pending: Array<PendingApproval | RunApproval>): void {
    clear(list);
    if (pending.length === 0) list.append(h('li', { class: 'muted' }, 'Nothing waits for a human.'));
    for (const p of pending) {
      const reasonId = `deny-reason-${p.id}`;
      const reason = h('input', { id: reasonId, type: 'text', placeholder: 'why not', class: 'deny-reason' });
      const decide = async (approve: boolean) => {
        const runtime = app.runtime;
        if (!runtime) return;
        try {
          const why = reason.value.trim() || 'denied in the demo page';
          if (p.kind === 'tool_call' && 'runId' in p && p.runId) await decideCall(p as RunApproval, approve, why);
          else if (approve) await runtime.approve(p.id);
          else await runtime.deny(p.id, why);
          status = `${approve ? 'Approved' : 'Denied'}: ${p.tool}.`;
        } catch (error) {
          status = `Could not ${approve ? 'approve' : 'deny'}: ${errorText(error)}`;
        }
        app.announce(status);
        app.refreshSoon(0);
      };
      list.append(
        h(
          'li',
          { class: 'approval', 'data-approval': p.id, 'data-tool': p.tool },
          h('div', {}, h('strong', {}, p.kind === 'promotion' ? 'Promote ' : 'Call '), h('code', {}, p.tool), p.fromTier || p.toTier ? ` ${p.fromTier ?? '?'} → ${p.toTier ?? '?'}` : '', ' ', h('time', { class: 'muted' }, time(p.requestedAt))),
          p.reason ? h('p', { class: 'muted' }, p.reason) : null,
          p.kind === 'tool_call' && 'arguments' in p && p.arguments !== undefined ? h('pre', { class: 'approval-args' }, brief(p.arguments, 400)) : null,
          h(
            'div',
            { class: 'row' },
            h('button', { type: 'button', class: 'primary', 'data-action': 'approve', onclick: () => void decide(true) }, 'Approve'),
            h('label', { for: reasonId, class: 'visually-hidden' }, `Reason to deny ${p.tool}`),
            reason,
            h('button', { type: 'button', class: 'danger', 'data-action': 'deny', onclick: () => void decide(false) }, 'Deny'),
          ),
        ),
      );
    }
    if (status) list.append(h('li', { class: 'hint', role: 'status' }, status));
  }
}
