/** Tiny DOM helpers: build elements without innerHTML (nothing from a model is ever parsed as HTML). */

type Child = Node | string | number | null | undefined | false;
type Attrs = Record<string, string | number | boolean | null | undefined | EventListener>;

export function h<K extends keyof HTMLElementTagNameMap>(tag: K, attrs: Attrs = {}, ...children: Child[]): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith('on') && typeof value === 'function') el.addEventListener(key.slice(2), value);
    else if (key === 'class') el.className = String(value);
    else if (value === true) el.setAttribute(key, '');
    else el.setAttribute(key, String(value));
  }
  append(el, ...children);
  return el;
}

export function append(parent: Node, ...children: Child[]): void {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    parent.appendChild(typeof child === 'object' ? child : document.createTextNode(String(child)));
  }
}

export function clear(el: Element): void {
  while (el.firstChild) el.removeChild(el.firstChild);
}

/**
 * Empties `container` and fills it again with `build`, keeping what a person did inside it:
 * the focus (with an input's caret), a choice made in a select, and open disclosures, matched
 * by `data-key` or else `id`. Panels are rebuilt on every refresh, and refreshes come with
 * events, while someone types, picks or reads in them.
 */
export function rebuild(container: Element, build: () => void): void {
  const keyed = () => {
    const byKey = new Map<string, HTMLElement>();
    for (const el of container.querySelectorAll<HTMLElement>('[data-key], [id]')) byKey.set(el.dataset.key ?? el.id, el);
    return byKey;
  };
  const before = keyed();
  const active = document.activeElement;
  const focusInside = active !== null && container.contains(active);
  clear(container);
  build();
  for (const [key, el] of keyed()) {
    const old = before.get(key);
    if (!old || old.tagName !== el.tagName) continue;
    if (el instanceof HTMLDetailsElement) el.open = (old as HTMLDetailsElement).open;
    if (el instanceof HTMLSelectElement) {
      const chosen = (old as HTMLSelectElement).value;
      if ([...el.options].some((o) => o.value === chosen)) el.value = chosen;
    }
    if (old !== active) continue;
    el.focus();
    if ((el instanceof HTMLInputElement || el instanceof HTMLTextAreaElement) && el.value === (old as HTMLInputElement).value) {
      // Only text fields have a caret; the others throw.
      try {
        el.setSelectionRange((old as HTMLInputElement).selectionStart, (old as HTMLInputElement).selectionEnd, (old as HTMLInputElement).selectionDirection ?? undefined);
      } catch {
        // a checkbox, a number field: nothing to restore
      }
    }
  }
  // What had the focus is gone (a Demote button once the tool is in the lowest tier): the focus
  // goes to the container when it can take it, rather than to the top of the page.
  const lost = focusInside && !container.contains(document.activeElement);
  if (lost && container instanceof HTMLElement && container.hasAttribute('tabindex')) container.focus({ preventScroll: true });
}

/** Shows `control` (a button, a text field) as disabled while it keeps the focus (a `disabled`
 *  one drops it to the top of the page); its handler must ignore clicks or submits meanwhile. */
export function setDisabled(control: HTMLElement, disabled: boolean): void {
  if (disabled) control.setAttribute('aria-disabled', 'true');
  else control.removeAttribute('aria-disabled');
}

export function $<T extends Element = HTMLElement>(selector: string, root: ParentNode = document): T {
  const el = root.querySelector<T>(selector);
  if (!el) throw new Error(`missing element ${selector}`);
  return el;
}

/** Short JSON for display; long values are cut. */
export function brief(value: unknown, max = 160): string {
  let text: string;
  try {
    text = typeof value === 'string' ? value : JSON.stringify(value);
  } catch {
    text = String(value);
  }
  if (text === undefined) text = String(value);
  return text.length > max ? `${text.slice(0, max - 1)}…` : text;
}

export function pretty(value: unknown): string {
  try {
    return JSON.stringify(value, null, 2);
  } catch {
    return String(value);
  }
}

export function time(at: number): string {
  return new Date(at).toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit' });
}

/** The text of an error without leaking anything but its message. */
export function errorText(error: unknown): string {
  if (error instanceof Error) return error.message;
  const e = error as { message?: unknown };
  return typeof e?.message === 'string' ? e.message : String(error);
}
