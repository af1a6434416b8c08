// The Quick-start demo's terminal output (npm/examples): what a model or a tool says is
// printed, never interpreted by the terminal.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { printable } from '../examples/terminal.js';

test('model text printed by the demo cannot drive the terminal: control characters are shown escaped', () => {
  const hostile = 'ok\x1b]52;c;ZWNobyBwd25lZA==\x07 \x1b[2J\x1b]0;title\x07\x9b31m\x7f\rdone';
  const shown = printable(hostile);
  assert.doesNotMatch(shown, /[\u0000-\u0008\u000b-\u001f\u007f-\u009f]/);
  assert.equal(shown, 'ok\\u001b]52;c;ZWNobyBwd25lZA==\\u0007 \\u001b[2J\\u001b]0;title\\u0007\\u009b31m\\u007f\\u000ddone');
  // Lines, tabs and any other text are printed as they are.
  assert.equal(printable('a\n\tb — ünï ⚒ 😀'), 'a\n\tb — ünï ⚒ 😀');
});
