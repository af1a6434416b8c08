// Property tests of the three providers reading mutated wire streams from a local server:
// OpenAI-compatible SSE, Anthropic's `event:`/`data:` SSE and Ollama's NDJSON, each mutated
// event by event and byte by byte (see support/fuzz-wire.ts). Every run ends with a result or
// a typed error, and the next run against a plain answer is served. A fixed seed by default;
// FC_SEED, FC_RUNS and FC_STATS=1 explore.
import { describe, test } from 'node:test';
import { anthropic, ollama, openai } from '../src/node.js';
import { failOnUnhandledRejections } from './support/fuzz-harness.js';
import { anthropicWire, checkMutatedStreams, ollamaWire, openaiWire } from './support/fuzz-wire.js';

failOnUnhandledRejections();

describe('providers against a local server streaming mutated answers', () => {
  test('openai(): mutated SSE', () => checkMutatedStreams(openaiWire(openai), 300));
  test('anthropic(): mutated event stream', () => checkMutatedStreams(anthropicWire(anthropic), 300));
  test('ollama(): mutated NDJSON', () => checkMutatedStreams(ollamaWire(ollama), 300));
});
