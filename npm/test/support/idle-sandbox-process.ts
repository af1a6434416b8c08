/**
 * A Node process whose only work is a lazy sandbox that ran once and is left idle, never
 * closed (sandbox-idle.test.ts): it prints the execution's output and must then exit by
 * itself, long before the Workers' idle timeout would retire them.
 */
import { createSandbox } from '../../src/sandbox/index.js';

const sandbox = await createSandbox({ lazy: true, poolSize: 2, idleTimeoutMs: 60_000 });
const result = await sandbox.execute({ code: 'function execute(i){ return i + 1; }', input: 41 });
process.stdout.write(`${JSON.stringify(result.output)}\n`);
