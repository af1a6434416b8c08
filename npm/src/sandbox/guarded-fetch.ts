/**
 * Node's default `fetch` for the sandbox bridge: the allowlist names hosts, and this checks
 * where those names actually lead. Every connection resolves its host through
 * {@link guardedLookup}, which refuses addresses outside the public unicast space (loopback,
 * private, link-local, CGNAT, unique-local, multicast, reserved, tunnel forms embedding IPv4)
 * unless that exact address is itself allowlisted. The address checked is the address
 * connected to — the check runs inside the socket's own lookup — so a name that answers with a
 * public address first and a private one later (DNS rebinding) gains nothing.
 *
 * Browsers do not expose DNS answers; there the bridge uses the page's `fetch`, and the
 * browser's own private-network rules apply.
 */
import type { LookupAddress, LookupAllOptions, LookupOneOptions } from 'node:dns';

import { FetchRefused, normaliseAllowlist } from './fetch-bridge.js';
import { nodeImport } from './pool.js';

type Resolve = (hostname: string, options: LookupAllOptions, callback: (error: NodeJS.ErrnoException | null, addresses: LookupAddress[]) => void) => void;
type LookupCallback = (error: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;
type IpAddr = typeof import('ipaddr.js');

/** `ipaddr.js` range names that are reachable on the public internet. */
const PUBLIC_RANGE = 'unicast';

/**
 * A `net.connect` lookup that only hands out public addresses and allowlisted literals.
 * `ipaddr` is the `ipaddr.js` module (passed in: it is loaded only in Node); `resolve` is
 * `dns.lookup` unless a test substitutes an answer.
 */
export function guardedLookup(ipaddr: IpAddr, allowlist: string[], resolve: Resolve) {
  // Allowlisted IP literals, in the form `ipaddr.js` prints resolved addresses (IPv6 unbracketed).
  const allowedAddresses = new Set(
    normaliseAllowlist(allowlist)
      .map(({ host }) => host.replace(/^\[|\]$/g, ''))
      .filter((host) => ipaddr.isValid(host))
      .map((host) => ipaddr.process(host).toString()),
  );
  const verdict = (address: string): string | undefined => {
    const parsed = ipaddr.process(address);
    const range = parsed.range();
    return range === PUBLIC_RANGE || allowedAddresses.has(parsed.toString()) ? undefined : range;
  };
  return (hostname: string, options: LookupOneOptions | LookupAllOptions, callback: LookupCallback): void => {
    resolve(hostname, { ...options, all: true }, (error, addresses) => {
      if (error) return callback(error, []);
      const usable = addresses.filter((a) => verdict(a.address) === undefined);
      if (usable.length === 0) {
        const first = addresses[0];
        const reason = first
          ? // The address itself stays out of the message: the guest reads it, and it would map
            // the host's internal network for it.
            `'${hostname}' resolves to a ${verdict(first.address)} address; allowlist that address too to reach it`
          : `'${hostname}' did not resolve to any address`;
        return callback(Object.assign(new FetchRefused(reason), { code: 'ECONNREFUSED' }), []);
      }
      if (options.all) return callback(null, usable);
      callback(null, usable[0]!.address, usable[0]!.family);
    });
  };
}

/** A `fetch` and the way to release its connections. */
export interface GuardedFetch {
  fetch: typeof globalThis.fetch;
  close(): Promise<void>;
}

/** `fetch` through an undici Agent whose connections use {@link guardedLookup}. */
export async function guardedFetch(allowlist: string[]): Promise<GuardedFetch> {
  const [undici, dns, ipaddrModule] = await Promise.all([
    nodeImport<typeof import('undici')>('undici'),
    nodeImport<typeof import('node:dns')>('node:dns'),
    nodeImport<{ default: IpAddr }>('ipaddr.js'),
  ]);
  const lookup = guardedLookup(ipaddrModule.default, allowlist, dns.lookup as unknown as Resolve);
  const dispatcher = new undici.Agent({ connect: { lookup: lookup as never } });
  return {
    fetch: ((input: URL | string, init?: RequestInit) => undici.fetch(input, { ...(init as object), dispatcher } as never)) as unknown as typeof globalThis.fetch,
    close: () => dispatcher.close(),
  };
}
