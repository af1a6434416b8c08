/**
 * Node's default `fetch` for the sandbox bridge: the allowlist names hosts, and this checks
 * where those names actually lead. Every connection resolves its host through
 * {@link guardedLookup}, which refuses addresses outside the public unicast space (loopback,
 * private, link-local, CGNAT, unique-local, multicast, reserved, tunnel forms embedding IPv4)
 * unless that exact address is itself allowlisted, on the port connected to: an entry
 * `10.0.0.5:8443` lets a name reach 10.0.0.5 on 8443 only, as it lets a URL reach the literal on
 * 8443 only (an entry without a port allows every port, as it does for a host). The address
 * checked is the address connected to — the check runs inside the socket's own lookup, which
 * each connection gets for its own port — so a name that answers with a public address first
 * and a private one later (DNS rebinding) gains nothing.
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

/** Every port: the ports of an address allowlisted by an entry without one. */
const ANY_PORT = 'any';

/**
 * Allowlisted IP literals, in the form `ipaddr.js` prints resolved addresses (IPv6
 * unbracketed), each with the ports its entries allow ({@link ANY_PORT} for an entry without
 * one). Ports are `normaliseAllowlist`'s, so they mean what they mean for the URL check.
 */
function allowedAddresses(ipaddr: IpAddr, allowlist: string[]): Map<string, Set<string> | typeof ANY_PORT> {
  const allowed = new Map<string, Set<string> | typeof ANY_PORT>();
  for (const { host, port } of normaliseAllowlist(allowlist)) {
    const literal = host.replace(/^\[|\]$/g, '');
    if (!ipaddr.isValid(literal)) continue;
    const address = ipaddr.process(literal).toString();
    const ports = allowed.get(address);
    if (port === undefined || ports === ANY_PORT) allowed.set(address, ANY_PORT);
    else allowed.set(address, new Set([...(ports ?? []), port]));
  }
  return allowed;
}

/**
 * A `net.connect` lookup that only hands out public addresses and allowlisted literals.
 * `ipaddr` is the `ipaddr.js` module (passed in: it is loaded only in Node); `resolve` is
 * `dns.lookup` unless a test substitutes an answer. `port` is the port the connection goes to
 * (Node's lookup is not told it, so each port gets its own lookup); `undefined` stands for a
 * port no allowlist entry names, where only addresses allowlisted without a port are reached.
 */
export function guardedLookup(ipaddr: IpAddr, allowlist: string[], resolve: Resolve, port?: string) {
  const allowed = allowedAddresses(ipaddr, allowlist);
  /** Why `address` is refused on `port`, or `undefined` if it is not. */
  const verdict = (address: string): { range: string; otherPorts: boolean } | undefined => {
    const parsed = ipaddr.process(address);
    const range = parsed.range();
    if (range === PUBLIC_RANGE) return undefined;
    const ports = allowed.get(parsed.toString());
    if (ports === ANY_PORT || (ports !== undefined && port !== undefined && ports.has(port))) return undefined;
    return { range, otherPorts: ports !== undefined };
  };
  return (hostname: string, options: LookupOneOptions | LookupAllOptions, callback: LookupCallback): void => {
    resolve(hostname, { ...options, all: true }, (error, addresses) => {
      if (error) return callback(error, []);
      const usable = addresses.filter((a) => verdict(a.address) === undefined);
      if (usable.length === 0) {
        const refused = addresses[0] && verdict(addresses[0].address)!;
        // The address itself stays out of the message: the guest reads it, and it would map
        // the host's internal network for it. Nor does it say which ports are allowlisted.
        const reason = !refused
          ? `'${hostname}' did not resolve to any address`
          : refused.otherPorts
            ? `'${hostname}' resolves to a ${refused.range} address allowlisted for other ports only; allowlist that address with this port too to reach it`
            : `'${hostname}' resolves to a ${refused.range} address; allowlist that address too to reach it`;
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

/**
 * `fetch` through an undici Agent whose connections use {@link guardedLookup}. A connection's
 * lookup must know its port, and undici builds a connector's socket options once: so each port
 * an allowlisted address is pinned to gets a connector of its own, and every other port shares
 * one (at most one connector per port the allowlist names, plus one).
 */
export async function guardedFetch(allowlist: string[]): Promise<GuardedFetch> {
  const [undici, dns, ipaddrModule] = await Promise.all([
    nodeImport<typeof import('undici')>('undici'),
    nodeImport<typeof import('node:dns')>('node:dns'),
    nodeImport<{ default: IpAddr }>('ipaddr.js'),
  ]);
  const ipaddr = ipaddrModule.default;
  const pinnedPorts = new Set<string>();
  for (const ports of allowedAddresses(ipaddr, allowlist).values()) {
    if (ports !== ANY_PORT) for (const port of ports) pinnedPorts.add(port);
  }
  type Connector = ReturnType<typeof undici.buildConnector>;
  const connectors = new Map<string | undefined, Connector>();
  const connect: Connector = (options, callback) => {
    // undici passes the origin's port, '' for the scheme's default (which it connects to).
    const port = String(options.port || (options.protocol === 'https:' ? 443 : 80));
    const key = pinnedPorts.has(port) ? port : undefined;
    let connector = connectors.get(key);
    if (!connector) {
      const lookup = guardedLookup(ipaddr, allowlist, dns.lookup as unknown as Resolve, key);
      connector = undici.buildConnector({ lookup: lookup as never });
      connectors.set(key, connector);
    }
    connector(options, callback);
  };
  const dispatcher = new undici.Agent({ connect });
  return {
    fetch: ((input: URL | string, init?: RequestInit) => undici.fetch(input, { ...(init as object), dispatcher } as never)) as unknown as typeof globalThis.fetch,
    close: () => dispatcher.close(),
  };
}
