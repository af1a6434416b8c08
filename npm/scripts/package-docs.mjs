// Run by `npm pack` / `npm publish` (prepack): the package carries the project's README and
// licenses, which live once, at the repository root.
import { copyFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));
const packageDir = fileURLToPath(new URL('../', import.meta.url));
for (const file of ['README.md', 'LICENSE-MIT', 'LICENSE-APACHE']) copyFileSync(root + file, packageDir + file);
