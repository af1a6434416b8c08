// A child process for the durable-run test: one agent over a nodeStore, either starting a run
// that pauses for approval (`start`) or resuming it by run id (`resume <runId> <approvalId>`).
// Prints one JSON line with the result.
import { createAgent, nodeStore, openai, tool } from '../../src/node.js';

const [mode, storePath, baseURL, runId, approvalId] = process.argv.slice(2);
const store = await nodeStore({ path: storePath! });
const refunds: number[] = [];
const refund = tool({
  name: 'refund',
  description: 'Refund an order',
  inputSchema: { type: 'object', properties: { order: { type: 'integer' }, amount: { type: 'number' } }, required: ['order', 'amount'] },
  needsApproval: ({ amount }: { order: number; amount: number }) => amount > 10,
  execute: ({ order }: { order: number; amount: number }) => {
    refunds.push(order);
    return { refunded: order };
  },
});
const agent = await createAgent({ model: openai({ baseURL: baseURL!, apiKey: 'none', model: 'm', retry: { maxRetries: 0 } }), tools: [refund], store, agentId: 'support-bot' });
const result = mode === 'start'
  ? await agent.run('Refund order 42', { sessionId: 's1' })
  : await agent.resume(runId!, { approvals: [{ id: approvalId!, approved: true }] });
console.log(JSON.stringify({ status: result.status, runId: result.runId, approvals: result.pendingApprovals, output: result.output, refunds }));
await store.close();
// Exit without any cleanup beyond the store: the next process must find everything it needs.
process.exit(0);
