// Bundle the CLI (npm run build): one ES module for start-up plus a chunk per lazily loaded part
// (the lab, scenario parsing, bench, doctor), so that a command loads only what it uses and Node
// resolves a handful of files instead of ~150. better-sqlite3 stays external (a native addon), and etcd3
// (its gRPC client reads .proto files beside its own code at run time).
import { rmSync } from 'node:fs';
import { build } from 'esbuild';

rmSync('dist/bin', { recursive: true, force: true }); // no chunks of an earlier build left beside these

await build({
  entryPoints: { snaplab: 'src/cli/main.ts' },
  outdir: 'dist/bin',
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  external: ['better-sqlite3', 'etcd3'],
  sourcemap: true,
  chunkNames: 'chunks/[name]-[hash]',
  // commander and better-sqlite3's loader are CommonJS: give the bundle a require of its own
  banner: {
    js: "import { createRequire as __snaplabRequire } from 'node:module';\nconst require = __snaplabRequire(import.meta.url);",
  },
  logLevel: 'warning',
});
