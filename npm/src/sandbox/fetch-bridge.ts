/**
 * The host side of the sandbox `fetch` bridge (DESIGN decision 4). The Worker posts a plain
 * request description; this parses the URL once (WHATWG URL), applies the policy to it and to
 * every redirect hop, fetches with `redirect: 'manual'`, caps the body, and returns a plain
 * response description. Nothing but strings goes back.
 *
 * Policy: exact hostname match against the allowlist (an entry `host:port` also pins the
 * port); `https:` only unless `allowHttp`; no userinfo; IP literals only when the exact literal
 * is allowlisted; link-local, unspecified and IPv4-mapped/embedded forms never; fragments are
 * dropped. Browsers hide redirect targets (`opaqueredirect`), so there any redirect is refused.
 * Where names lead is checked at connect time by Node's default fetch (`guarded-fetch.ts`); a
 * refusal raised there surfaces here as the same {@link FetchRefused}.
 */

export interface FetchPolicy {
  allowlist: string[];
  allowHttp: boolean;
  maxBodyBytes: number;
  maxRedirects: number;
  fetch: typeof globalThis.fetch;
  signal?: AbortSignal;
}

interface PlainRequest {
  url: string;
  method: string;
  headers: Array<[string, string]>;
  body?: string;
}

interface PlainResponse {
  status: number;
  statusText: string;
  url: string;
  headers: Array<[string, string]>;
  body: string;
}

/** A refusal or failure whose message may be shown to guest code. */
export class FetchRefused extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FetchRefused';
  }
}

const DROPPED_HEADERS = new Set(['host', 'connection', 'content-length', 'transfer-encoding', 'upgrade', 'proxy-authorization', 'keep-alive', 'te', 'trailer']);

function isIPv4(host: string): boolean {
  return /^\d{1,3}(\.\d{1,3}){3}$/.test(host);
}

function forbiddenAddress(host: string): string | undefined {
  if (host.startsWith('[')) {
    const h = host.slice(1, -1).toLowerCase();
    if (/^fe[89ab]/.test(h)) return 'link-local address';
    if (h.startsWith('::ffff:') || h.includes('.')) return 'IPv4-mapped address';
    if (h === '::') return 'unspecified address';
    return undefined;
  }
  if (isIPv4(host)) {
    const [a, b] = host.split('.').map(Number) as [number, number];
    if (a === 169 && b === 254) return 'link-local address';
    if (a === 0) return 'unspecified address';
  }
  return undefined;
}

/** Normalises allowlist entries with the same parser the URLs go through. */
export function normaliseAllowlist(entries: string[]): Array<{ host: string; port: string | undefined }> {
  return entries.map((entry) => {
    const u = new URL(`http://${entry}`);
    const explicitPort = /:\d+$/.test(entry) ? u.port || '80' : undefined;
    return { host: u.hostname, port: explicitPort };
  });
}

/** Checks one URL against the policy; returns the URL to fetch (fragment dropped). */
export function checkUrl(raw: string, policy: Pick<FetchPolicy, 'allowlist' | 'allowHttp'>): URL {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    throw new FetchRefused(`invalid URL`);
  }
  if (url.protocol !== 'https:' && !(url.protocol === 'http:' && policy.allowHttp)) {
    throw new FetchRefused(`scheme '${url.protocol}' is not allowed`);
  }
  if (url.username !== '' || url.password !== '') {
    throw new FetchRefused('URLs with credentials (user@host) are not allowed');
  }
  const host = url.hostname;
  const bad = forbiddenAddress(host);
  if (bad) throw new FetchRefused(`${bad} '${host}' is not allowed`);
  const port = url.port || (url.protocol === 'https:' ? '443' : '80');
  const allowed = normaliseAllowlist(policy.allowlist).some(
    (entry) => entry.host === host && (entry.port === undefined || entry.port === port),
  );
  if (!allowed) {
    const kind = isIPv4(host) || host.startsWith('[') ? 'IP address' : 'host';
    throw new FetchRefused(`${kind} '${host}' is not in the fetch allowlist`);
  }
  url.hash = '';
  return url;
}

/**
 * How long `text` is as a JSON string, at most. The response crosses to the Worker as JSON, and
 * JSON writes a control character as six characters (`\u0001`): a body of them would cross at
 * six times the size the body limit allows, outside every memory bound of the sandbox.
 */
function jsonStringLength(text: string): number {
  let length = text.length + 2;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c < 0x20) length += 5;
    else if (c === 0x22 || c === 0x5c) length += 1;
  }
  return length;
}

async function readCapped(response: Response, max: number): Promise<string> {
  const declared = Number(response.headers.get('content-length') ?? '0');
  if (declared > max) {
    await response.body?.cancel().catch(() => {});
    throw new FetchRefused(`response body exceeds ${max} bytes`);
  }
  if (!response.body) return '';
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let total = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    total += value.byteLength;
    if (total > max) {
      await reader.cancel().catch(() => {});
      throw new FetchRefused(`response body exceeds ${max} bytes`);
    }
    chunks.push(value);
  }
  const all = new Uint8Array(total);
  let offset = 0;
  for (const c of chunks) {
    all.set(c, offset);
    offset += c.byteLength;
  }
  const text = new TextDecoder().decode(all);
  // The guest gets the body as text, which the engine holds to the same cap: bytes that are not
  // UTF-8 become U+FFFD, three bytes each, so a binary body under the cap can outgrow it.
  const asText = utf8Length(text);
  if (asText > max) {
    throw new FetchRefused(`response body of ${total} bytes is not UTF-8 text: as the text the sandbox reads (each invalid byte as U+FFFD) it is ${asText} bytes, more than the ${max}-byte limit`);
  }
  return text;
}

/** Bytes of `text` in UTF-8, counted without encoding it. */
function utf8Length(text: string): number {
  let bytes = 0;
  for (let i = 0; i < text.length; i++) {
    const unit = text.charCodeAt(i);
    if (unit < 0x80) bytes += 1;
    else if (unit < 0x800) bytes += 2;
    else if (unit >= 0xd800 && unit < 0xdc00 && i + 1 < text.length) {
      bytes += 4;
      i++;
    } else bytes += 3;
  }
  return bytes;
}

/** A refusal raised below `fetch` (the connect-time address check), found in the cause chain. */
function refusalIn(error: unknown): FetchRefused | undefined {
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    if (e instanceof FetchRefused) return e;
  }
  return undefined;
}

/** Performs one bridged request. Resolves to PlainResponse JSON; rejects with a FetchRefused. */
export async function bridgedFetch(requestJson: string, policy: FetchPolicy): Promise<string> {
  let request: PlainRequest;
  try {
    request = JSON.parse(requestJson) as PlainRequest;
  } catch {
    throw new FetchRefused('malformed request');
  }
  let url = checkUrl(String(request.url), policy);
  let method = String(request.method || 'GET').toUpperCase();
  let body = typeof request.body === 'string' ? request.body : undefined;
  const headers = new Headers();
  for (const [k, v] of request.headers ?? []) {
    if (!DROPPED_HEADERS.has(String(k).toLowerCase())) {
      try {
        headers.append(String(k), String(v));
      } catch {
        throw new FetchRefused(`invalid header '${String(k).slice(0, 40)}'`);
      }
    }
  }
  for (let hop = 0; ; hop++) {
    let response: Response;
    try {
      // `credentials: 'omit'`: in a page, the guest's request must not carry the user's cookies
      // or HTTP auth for an allowlisted host (the page's own origin, say).
      response = await policy.fetch(url, { method, headers, body, redirect: 'manual', credentials: 'omit', signal: policy.signal });
    } catch (error) {
      throw refusalIn(error) ?? new FetchRefused(`network error: ${error instanceof Error ? error.message : 'failed'}`);
    }
    if (response.type === 'opaqueredirect') {
      throw new FetchRefused('redirects cannot be checked in this environment and are refused');
    }
    if ([301, 302, 303, 307, 308].includes(response.status)) {
      await response.body?.cancel().catch(() => {});
      const location = response.headers.get('location');
      if (!location) throw new FetchRefused(`redirect ${response.status} without a location`);
      if (hop >= policy.maxRedirects) throw new FetchRefused('too many redirects');
      // Each hop is parsed and checked exactly like the first URL.
      const from = url;
      url = checkUrl(new URL(location, url).href, policy);
      // Credentials meant for one origin do not follow a redirect to another (the Fetch standard
      // drops `Authorization` there; Node's fetch drops `Cookie` too).
      if (url.origin !== from.origin) for (const name of ['authorization', 'cookie', 'proxy-authorization']) headers.delete(name);
      if (response.status === 303 || ((response.status === 301 || response.status === 302) && method === 'POST')) {
        method = 'GET';
        body = undefined;
        // As the Fetch standard does on this switch: the body's headers go with the body.
        for (const name of ['content-type', 'content-encoding', 'content-language', 'content-location']) headers.delete(name);
      }
      continue;
    }
    const text = await readCapped(response, policy.maxBodyBytes);
    const encoded = jsonStringLength(text);
    if (encoded > 2 * policy.maxBodyBytes) {
      throw new FetchRefused(`response body escapes to ${encoded} characters of JSON (control characters), more than twice the ${policy.maxBodyBytes}-byte body limit`);
    }
    const plain: PlainResponse = {
      status: response.status,
      statusText: response.statusText,
      url: url.href,
      headers: [...response.headers.entries()],
      body: text,
    };
    return JSON.stringify(plain);
  }
}
