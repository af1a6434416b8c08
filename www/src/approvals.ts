/** Pending approvals (shared promotions, tool calls): approve or deny with a reason. */
import type { App } from './app.ts';
import { $, clear, errorText, h, time } from './dom.ts';
import { EmergentUnavailable, type PendingApproval } from './runtime.ts';

export function mountApprovals(app: App): void {
  const list = $<HTMLUListElement>('#approvals');
  const note = $('#approvals-note');
  let status = '';

  app.onRefresh(async () => {
    const runtime = app.runtime;
    if (!runtime) return;
    try {
      const pending = await runtime.pendingApprovals();
      note.hidden = true;
      render(pending);
    } catch (error) {
      clear(list);
      note.hidden = false;
      note.textContent = error instanceof EmergentUnavailable ? 'Emergent API not available in this build: no approvals to show.' : `Could not read approvals: ${errorText(error)}`;
    }
  });

  function render(pending: PendingApproval[]): void {
    clear(list);
    if (pending.length === 0) list.append(h('li', { class: 'muted' }, 'Nothing waits for a human.'));
    for (const p of pending) {
      const reasonId = `deny-reason-${p.id}`;
      const reason = h('input', { id: reasonId, type: 'text', placeholder: 'why not', class: 'deny-reason' });
      const decide = async (approve: boolean) => {
        const runtime = app.runtime;
        if (!runtime) return;
        try {
          if (approve) await runtime.approve(p.id);
          else await runtime.deny(p.id, reason.value.trim() || 'denied in the demo page');
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
