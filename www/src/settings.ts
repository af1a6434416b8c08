/** Provider settings: a form, persisted in localStorage; the API key only on opt-in. */
import { h, $, clear } from './dom.ts';
import { PROVIDER_DEFAULTS, type ProviderKind, type ProviderSettings } from './runtime.ts';

const STORAGE_KEY = 'crucible-demo.settings.v1';
const KINDS = Object.keys(PROVIDER_DEFAULTS) as ProviderKind[];

interface Stored {
  kind: ProviderKind;
  /** `apiKey` is remembered together with `keyBaseURL`, the base URL it is for (older
   * settings without it: `baseURL`); it is never used with another base URL. */
  perKind: Partial<Record<ProviderKind, { baseURL: string; model: string; apiKey?: string; keyBaseURL?: string }>>;
  rememberKey: boolean;
}

/** A key and the base URL it goes to. */
interface KeyFor {
  key: string;
  baseURL: string;
}

/** The stored settings' text; `null` when there are none or the browser keeps no site data
 *  (then reading `localStorage` at all throws a `SecurityError`). */
function storedText(): string | null {
  try {
    return localStorage.getItem(STORAGE_KEY);
  } catch {
    return null;
  }
}

function readStored(): Stored {
  try {
    const raw = storedText();
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

/** What the page did with an Apply: refused it (nothing is saved), or what it means for the agent. */
export type ApplyOutcome = { refused: string } | { note: string };

/** Removes the remembered keys from the stored settings at once, and nothing else: what the
 *  form shows but was not applied is not saved by it. */
function forgetStoredKeys(): void {
  if (storedText() === null) return;
  const stored = readStored();
  for (const entry of Object.values(stored.perKind)) {
    delete entry.apiKey;
    delete entry.keyBaseURL;
  }
  writeStored({ ...stored, rememberKey: false });
}

/** Stores the key of the applied settings for their base URL at once (nothing else changes):
 *  ticking "Remember the key" keeps the key in use, as unticking forgets it at once. */
function rememberAppliedKey(applied: ProviderSettings): void {
  const stored = readStored();
  const entry = stored.perKind[applied.kind] ?? { baseURL: applied.baseURL, model: applied.model };
  stored.perKind[applied.kind] = { ...entry, apiKey: applied.apiKey, keyBaseURL: applied.baseURL };
  writeStored({ ...stored, rememberKey: true });
}

export interface SettingsController {
  current(): ProviderSettings;
  hasStored(): boolean;
}

/**
 * Mounts the settings form. Query parameters (`provider`, `baseURL`, `model`) override the
 * stored values for this page load (the tests point the page at their mock server this way).
 * A remembered key is filled in only for the base URL it was remembered for, so a link with
 * another `baseURL` cannot send it elsewhere.
 */
export function mountSettings(onApply: (settings: ProviderSettings) => ApplyOutcome): SettingsController {
  const stored = readStored();
  const hadStored = storedText() !== null;
  const params = new URLSearchParams(location.search);
  const keys: Partial<Record<ProviderKind, KeyFor>> = {};
  for (const kind of KINDS) {
    const entry = stored.perKind[kind];
    const forURL = entry?.keyBaseURL ?? entry?.baseURL;
    if (entry?.apiKey && forURL) keys[kind] = { key: entry.apiKey, baseURL: forURL };
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

  /** The key for `url` of the current kind: only the one kept for exactly that base URL. */
  function keyFor(url: string): string {
    const entry = keys[kind];
    return entry && entry.baseURL === url ? entry.key : '';
  }
  function keepFields(): void {
    const url = baseURL.value.trim();
    values[kind] = { baseURL: url, model: model.value.trim() };
    if (apiKey.value) keys[kind] = { key: apiKey.value, baseURL: url };
    // An empty field forgets the key of this base URL; a key of another base URL (not shown) stays.
    else if (keys[kind]?.baseURL === url) delete keys[kind];
  }
  // Whether the key field shows the kept key (not one typed for the base URL now in the form).
  let keyFilled = false;
  function fillKey(): void {
    apiKey.value = keyFor(baseURL.value.trim());
    keyFilled = apiKey.value !== '';
  }
  function fillFields(): void {
    baseURL.value = values[kind].baseURL;
    model.value = values[kind].model;
    fillKey();
  }
  fillFields();
  // Editing the base URL takes the kept key away from another host (and brings it back for its own).
  baseURL.addEventListener('input', () => {
    if (keyFilled || apiKey.value === '') fillKey();
  });
  apiKey.addEventListener('input', () => (keyFilled = false));

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
      if (remember.checked && keys[k]) Object.assign(perKind[k]!, { apiKey: keys[k]!.key, keyBaseURL: keys[k]!.baseURL });
    }
    writeStored({ kind, perKind, rememberKey: remember.checked });
  }

  // A field the browser refuses (its own message shows at the field, and no submit event comes
  // when Apply is clicked): an older line, about another URL say, would mislead.
  form.addEventListener('invalid', () => (status.textContent = ''), true);
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    if (!form.reportValidity()) return;
    const next = currentFromForm();
    // The page may refuse (options the provider cannot use, a run going): then nothing is
    // saved or shown as applied, so a bad URL does not greet the next visit too.
    const outcome = onApply(next);
    if ('refused' in outcome) {
      status.textContent = outcome.refused;
      return;
    }
    persist();
    applied = next;
    showSummary();
    status.textContent = `Applied: ${PROVIDER_DEFAULTS[kind].label}, model ${applied.model}. ${outcome.note}${remember.checked ? '' : ' The key (if any) is kept for this page only.'}`;
  });
  remember.addEventListener('change', () => {
    if (!remember.checked) forgetStoredKeys();
    else if (applied.apiKey) {
      rememberAppliedKey(applied);
      status.textContent = 'The key in use is remembered in this browser (localStorage).';
    } else status.textContent = 'A key applied from now on is remembered in this browser (localStorage).';
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
