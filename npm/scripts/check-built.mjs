// Run by `npm pack` / `npm publish` (prepack), before the README is made: `dist/` and `wasm/`
// are build output (gitignored), so what a tarball carries is whatever lies in the folder. A
// pack of a tree whose TypeScript or Rust changed since its last build would ship the old
// build under the new sources' version: refused here, with the command that fixes it.
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';

const packageDir = fileURLToPath(new URL('../', import.meta.url));
const root = join(packageDir, '..');

/** Every file under `dir` whose name passes `keep`. */
function files(dir, keep) {
  return readdirSync(dir, { withFileTypes: true, recursive: true })
    .filter((e) => e.isFile() && keep(e.name))
    .map((e) => join(e.parentPath ?? e.path, e.name));
}

const modified = (path) => statSync(path).mtimeMs;
const problems = [];

for (const source of files(join(packageDir, 'src'), (n) => n.endsWith('.ts') && !n.endsWith('.d.ts'))) {
  const built = join(packageDir, 'dist', relative(join(packageDir, 'src'), source)).replace(/\.ts$/, '.js');
  if (!existsSync(built)) problems.push(`${relative(packageDir, built)} is missing`);
  else if (modified(built) < modified(source)) problems.push(`${relative(packageDir, source)} changed after ${relative(packageDir, built)} was built`);
}
const rust = [...files(join(root, 'src'), (n) => n.endsWith('.rs')), join(root, 'Cargo.toml'), join(root, 'Cargo.lock')];
const newestRust = Math.max(...rust.map(modified));
for (const artifact of ['crucible_core', 'crucible_sandbox']) {
  for (const file of [`${artifact}.js`, `${artifact}_bg.wasm`]) {
    const path = join(packageDir, 'wasm', file);
    if (!existsSync(path)) problems.push(`wasm/${file} is missing`);
    else if (file.endsWith('.wasm') && modified(path) < newestRust) problems.push(`wasm/${file} is older than the Rust sources`);
  }
}
if (problems.length > 0) {
  console.error(`crucible-agents: not packed, the build is missing or stale (run \`npm run build\` in npm/):\n- ${problems.slice(0, 10).join('\n- ')}`);
  process.exit(1);
}
