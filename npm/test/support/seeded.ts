/**
 * A seeded pseudo-random source for the fuzz-style tests: a fixed seed makes a failure
 * reproduce, and `FUZZ_ITERATIONS` (read by the tests) runs longer.
 */
export interface Seeded {
  /** An integer in [0, n). */
  below(n: number): number;
  /** One of `items`. */
  pick<T>(items: readonly T[]): T;
}

/** A 32-bit xorshift generator starting from `seed` (not zero). */
export function seeded(seed: number): Seeded {
  let state = seed >>> 0 || 1;
  const below = (n: number) => {
    state ^= state << 13;
    state ^= state >>> 17;
    state ^= state << 5;
    return (state >>> 0) % n;
  };
  return { below, pick: (items) => items[below(items.length)]! };
}

/** How many cases a fuzz-style test runs: `FUZZ_ITERATIONS`, else `fallback`. */
export function iterations(fallback: number): number {
  return Number(process.env.FUZZ_ITERATIONS ?? fallback);
}
