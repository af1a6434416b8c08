/** Forge statistics as an inline SVG bar chart (approved vs rejected, rejection categories). */
import type { App } from './app.ts';
import { $, clear, errorText, h } from './dom.ts';
import { EmergentUnavailable, type ForgeStats, type RejectionCategory } from './runtime.ts';

const CATEGORIES: RejectionCategory[] = ['schema_extra_field', 'shape_check', 'syntax_error', 'parse_error', 'judge_correctness', 'other'];
const SVG = 'http://www.w3.org/2000/svg';

export function mountStats(app: App): void {
  const box = $('#stats');
  const note = $('#stats-note');

  app.onRefresh(async () => {
    const runtime = app.runtime;
    if (!runtime) return;
    try {
      const stats = await runtime.stats();
      note.hidden = true;
      render(stats);
    } catch (error) {
      note.hidden = false;
      note.textContent = error instanceof EmergentUnavailable ? 'Emergent API not available in this build: no forge statistics yet.' : `Could not read stats: ${errorText(error)}`;
      clear(box);
    }
  });

  function render(stats: ForgeStats): void {
    clear(box);
    const rows: Array<{ label: string; value: number; cls: string }> = [
      { label: 'approved', value: stats.approved, cls: 'bar-ok' },
      { label: 'rejected', value: stats.rejected, cls: 'bar-bad' },
      ...CATEGORIES.map((c) => ({ label: c, value: stats.rejectionsByCategory?.[c] ?? 0, cls: 'bar-cat' })),
    ];
    const avg = stats.approved ? stats.approvedConfidenceSum / stats.approved : 0;
    const summary = `${stats.attempts} attempts: ${stats.approved} approved, ${stats.rejected} rejected. ` + CATEGORIES.filter((c) => (stats.rejectionsByCategory?.[c] ?? 0) > 0).map((c) => `${c} ${stats.rejectionsByCategory[c]}`).join(', ');
    box.append(chart(rows, summary));
    // The core persists the forge aggregate in the agent's store, like the per-tool stats.
    box.append(h('p', { class: 'hint' }, `Every forge of this agent, kept in the store: ${app.runtime?.memoryOnly ? 'in memory here, so the numbers go with a reload' : 'the numbers survive a reload'}. Per-tool calls and success rates are in the registry.`));
    box.append(
      h(
        'dl',
        { class: 'facts facts-inline' },
        ...[
          ['Attempts', stats.attempts],
          ['Unique names', stats.uniqueNames],
          ['Unique approved', stats.uniqueApproved],
          ['Terminal rejections', stats.uniqueTerminalRejections],
          ['Avg confidence', stats.approved ? `${Math.round(avg * 100)}%` : '—'],
        ].map(([k, v]) => h('div', {}, h('dt', {}, String(k)), h('dd', {}, String(v)))),
      ),
    );
  }
}

function chart(rows: Array<{ label: string; value: number; cls: string }>, summary: string): SVGSVGElement {
  const max = Math.max(1, ...rows.map((r) => r.value));
  const rowH = 22;
  const gap = 6;
  const labelW = 132;
  const barW = 170;
  const width = labelW + barW + 40;
  const height = rows.length * (rowH + gap) + 18;
  const el = <K extends keyof SVGElementTagNameMap>(tag: K, attrs: Record<string, string | number>, text?: string) => {
    const node = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
    if (text !== undefined) node.textContent = text;
    return node;
  };
  const svg = el('svg', { viewBox: `0 0 ${width} ${height}`, role: 'img', class: 'chart', 'aria-label': summary, width: '100%' });
  svg.append(el('title', {}, summary));
  rows.forEach((r, i) => {
    const y = i * (rowH + gap) + (i >= 2 ? 18 : 0);
    if (i === 2) svg.append(el('text', { x: 0, y: y - 5, class: 'chart-caption' }, 'Rejections by category'));
    const w = Math.round((r.value / max) * barW);
    svg.append(
      el('text', { x: labelW - 6, y: y + rowH / 2 + 4, 'text-anchor': 'end', class: 'chart-label' }, r.label),
      el('rect', { x: labelW, y, width: barW, height: rowH, rx: 3, class: 'bar-track' }),
      el('rect', { x: labelW, y, width: Math.max(w, r.value > 0 ? 2 : 0), height: rowH, rx: 3, class: r.cls }),
      el('text', { x: labelW + barW + 6, y: y + rowH / 2 + 4, class: 'chart-value' }, String(r.value)),
    );
  });
  return svg;
}
