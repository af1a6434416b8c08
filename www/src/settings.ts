/** Provider settings: a form, persisted in localStorage; the API key only on opt-in. */
import { h, $, clear } from './dom.ts';
import { PROVIDER_DEFAULTS, type ProviderKind, type ProviderSettings } from './runtime.ts';

const STORAGE_KEY = 'crucible-demo.settings.v1';
const KINDS = Object.keys(PROVIDER_DEFAULTS) as ProviderKind[];

interface Stored {
  kind: ProviderKind;
  perKind: Partial<Record<ProviderKind, { baseURL: string; model: string; apiKey?: string }>>;
  rememberKey: boolean;
}

function readStored(): Stored {
  try {
    const raw = localStorage.getItem(STORAGE_KEY);
    if (raw) {
      const parsed = JSON.parse(raw) as Stored;
      if (KINDS.includes(parsed.kind)) return { kind: parsed.kind, perKind: parsed.perKind ?? {}, rememberKey: !!parsed.rememberKey };
    }
  } catch {
    // Unreadable settings: start from the defaults.
  }
  return { kind: 'local', perKind: {}, rememberKey: false };
}

function writeStored(stored: Stored): void {
  try {
    localStorage.setItem(STORAGE_KEY, JSON.stringify(stored));
  } catch {
    // Storage full or blocked: settings live for this page only.
  }
}

export interface SettingsController {
  current(): ProviderSettings;
  hasStored(): boolean;
}

/**
 * Mounts the settings form. Query parameters (`provider`, `baseURL`, `model`) override the
 * stored values for this page load (the tests point the page at their mock server this way).
 */
export function mountSettings(onApply: (settings: ProviderSettings) => void): SettingsController {
  const stored = readStored();
  const hadStored = localStorage.getItem(STORAGE_KEY) !== null;
  const params = new URLSearchParams(location.search);
  const keys: Partial<Record<ProviderKind, string>> = {};
  for (const kind of KINDS) {
    const key = stored.perKind[kind]?.apiKey;
    if (key) keys[kind] = key;
  }

  const form = $<HTMLFormElement>('#settings-form');
  const kindsBox = $('#provider-kinds');
  const baseURL = $<HTMLInputElement>('#base-url');
  const model = $<HTMLInputElement>('#model-name');
  const apiKey = $<HTMLInputElement>('#api-key');
  const remember = $<HTMLInputElement>('#remember-key');
  const status = $('#settings-status');
  const summary = $('#provider-summary');
  const details = $<HTMLDetailsElement>('#settings-details');

  let kind: ProviderKind = stored.kind;
  const qKind = params.get('provider');
  if (qKind && KINDS.includes(qKind as ProviderKind)) kind = qKind as ProviderKind;
  else if (params.has('baseURL')) kind = 'openai';

  clear(kindsBox);
  for (const k of KINDS) {
    const id = `provider-${k}`;
    const input = h('input', { type: 'radio', name: 'kind', id, value: k });
    input.checked = k === kind;
    input.addEventListener('change', () => {
      if (!input.checked) return;
      keepFields();
      kind = k;
      fillFields();
    });
    kindsBox.append(h('div', { class: 'radio' }, input, h('label', { for: id }, PROVIDER_DEFAULTS[k].label)));
  }
  remember.checked = stored.rememberKey;

  const values: Record<ProviderKind, { baseURL: string; model: string }> = Object.fromEntries(
    KINDS.map((k) => [k, { baseURL: stored.perKind[k]?.baseURL ?? PROVIDER_DEFAULTS[k].baseURL, model: stored.perKind[k]?.model ?? PROVIDER_DEFAULTS[k].model }]),
  ) as Record<ProviderKind, { baseURL: string; model: string }>;
  if (params.get('baseURL')) values[kind].baseURL = params.get('baseURL')!;
  if (params.get('model')) values[kind].model = params.get('model')!;

  function keepFields(): void {
    values[kind] = { baseURL: baseURL.value.trim(), model: model.value.trim() };
    if (apiKey.value) keys[kind] = apiKey.value;
    else delete keys[kind];
  }
  function fillFields(): void {
    baseURL.value = values[kind].baseURL;
    model.value = values[kind].model;
    apiKey.value = keys[kind] ?? '';
  }
  fillFields();

  let applied = currentFromForm();
  showSummary();

  function currentFromForm(): ProviderSettings {
    return { kind, baseURL: baseURL.value.trim(), model: model.value.trim(), apiKey: apiKey.value };
  }
  function showSummary(): void {
    let host = applied.baseURL;
    try {
      host = new URL(applied.baseURL).host;
    } catch {
      // Show it as typed.
    }
    summary.textContent = `${PROVIDER_DEFAULTS[applied.kind].label} · ${applied.model} · ${host}`;
  }
  function persist(): void {
    keepFields();
    const perKind: Stored['perKind'] = {};
    for (const k of KINDS) {
      perKind[k] = { ...values[k] };
      if (remember.checked && keys[k]) perKind[k]!.apiKey = keys[k];
    }
    writeStored({ kind, perKind, rememberKey: remember.checked });
  }

  form.addEventListener('submit', (event) => {
    event.preventDefault();
    if (!form.reportValidity()) return;
    persist();
    applied = currentFromForm();
    showSummary();
    status.textContent = `Applied: ${PROVIDER_DEFAULTS[kind].label}, model ${applied.model}.${remember.checked ? '' : ' The key (if any) is kept for this page only.'}`;
    onApply(applied);
  });
  remember.addEventListener('change', () => {
    if (!remember.checked) persist(); // Forget stored keys at once.
  });
  $('#settings-reset').addEventListener('click', () => {
    values[kind] = { ...PROVIDER_DEFAULTS[kind] };
    fillFields();
    status.textContent = 'Defaults filled in; press Apply to use them.';
  });

  // First visit: show the settings so the person sees which model the page talks to.
  if (!hadStored && !params.has('baseURL')) details.open = true;

  return { current: () => applied, hasStored: () => hadStored };
}
