// Plain object (no `import from 'vite'`) so the browser tests can build with the Vite that
// npm/ installs even where www/ has not been installed.
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const linked = existsSync(fileURLToPath(new URL('./node_modules/crucible-agents/package.json', import.meta.url)));

export default {
  root: fileURLToPath(new URL('.', import.meta.url)),
  base: './',
  // Without `npm install` here, point straight at the local package's browser entry.
  resolve: linked ? {} : { alias: { 'crucible-agents': fileURLToPath(new URL('../npm/dist/browser.js', import.meta.url)) } },
  build: { target: 'es2022', outDir: 'dist', emptyOutDir: true, sourcemap: true },
  // The dev server must be allowed to read the linked package (its wasm lives in ../npm/wasm).
  server: { host: '127.0.0.1', fs: { allow: [fileURLToPath(new URL('.', import.meta.url)), fileURLToPath(new URL('../npm', import.meta.url))] } },
  preview: { host: '127.0.0.1' },
};
