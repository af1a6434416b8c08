// Run by `npm pack` / `npm publish` (prepack): the package carries a README made from the
// project's (which lives once, at the repository root) and the licenses. The package's README
// is for someone who installed it: how to install and use it, not the repository's quick start
// (scripts that are not in the package), its layout or its benchmarks.
import { copyFileSync, readFileSync, writeFileSync } from 'node:fs';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

// Writes only when run (`node scripts/package-docs.mjs`), not when a test imports it.
if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const root = fileURLToPath(new URL('../../', import.meta.url));
  const packageDir = fileURLToPath(new URL('../', import.meta.url));
  for (const file of ['LICENSE-MIT', 'LICENSE-APACHE']) copyFileSync(root + file, packageDir + file);
  writeFileSync(packageDir + 'README.md', packageReadme(readFileSync(root + 'README.md', 'utf8')));
}

/** The root README's introduction and "Using the package", with an install line first. */
export function packageReadme(readme) {
  const sections = topSections(readme);
  const intro = sections[0];
  const using = sections.find((s) => s.startsWith('## Using the package'));
  if (!using) throw new Error('README.md has no "## Using the package" section');
  const install = [
    '## Install',
    '',
    '```sh',
    'npm install crucible-agents',
    '```',
    '',
    'Node 20+ or a current browser (the wasm core and the sandbox Worker load on their own; bundlers find them through `new URL(…, import.meta.url)`).',
    'The demo page, the benchmarks and the Rust sources are in the source repository.',
    '',
    '',
  ].join('\n');
  // Paths of the repository mean nothing inside the package.
  const from = 'see `npm/src/stores/README.md` for';
  if (!using.includes(from)) throw new Error(`README.md no longer says "${from}": update package-docs.mjs`);
  const text = using.replace(from, "the source repository's `npm/src/stores/README.md` explains");
  return `${intro}${install}${text.trimEnd()}\n`;
}

/** The text split before each `## ` heading, leaving alone `## ` lines inside code fences. */
function topSections(readme) {
  const sections = [''];
  let fenced = false;
  for (const line of readme.split('\n')) {
    if (line.startsWith('```')) fenced = !fenced;
    if (!fenced && line.startsWith('## ')) sections.push('');
    sections[sections.length - 1] += `${line}\n`;
  }
  return sections;
}
