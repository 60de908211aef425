#!/usr/bin/env node
// Many machines with egress talking at once (docs/egress.md "Flows"): N machines each send one DNS
// query to their gateway, then the script reports the router's neighbour entries and whether the
// kernel logged "neighbor table overflow" meanwhile (its one neighbour table, every namespace's,
// refuses new entries past net.ipv4.neigh.default.gc_thresh3 while the ones it has are in use).
// Its own uplink namespace on documentation addresses: no packet leaves the host.
//   node scripts/egress-neighbours.mjs [N=600]
import { spawnSync } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab, createMany, removeMany } from '../dist/sdk/index.js';

const N = Number(process.argv[2] ?? 600);
const UP = `slneigh-up-${process.pid}`;
const sh = (c, a) => {
  const r = spawnSync(c, a, { encoding: 'utf8' });
  if (r.status) throw new Error(`${c} ${a.join(' ')}: ${r.stderr}`);
  return r.stdout;
};
const overflows = () =>
  (spawnSync('dmesg', [], { encoding: 'utf8' }).stdout.match(/neighbor table overflow/g) ?? []).length;
sh('ip', ['netns', 'add', UP]);
sh('ip', ['-n', UP, 'link', 'set', 'lo', 'up']);
sh('ip', ['-n', UP, 'addr', 'add', '203.0.113.10/32', 'dev', 'lo']);
process.env.SNAPLAB_UPLINK_NETNS = UP;
const lab = await Lab.open({ home: mkdtempSync(join(tmpdir(), 'snaplab-neigh-')) });
try {
  const before = overflows();
  const t0 = Date.now();
  const boxes = await createMany(lab, N, { egress: true }, { parallel: 8 });
  console.log(`made ${boxes.length} machines with egress in ${Date.now() - t0} ms`);
  await Promise.all(
    boxes.map((b) => b.exec(['sh', '-c', 'nslookup -timeout=1 x.test 100.96.0.1 >/dev/null 2>&1; true'])),
  );
  const router = sh('ip', ['netns', 'list'])
    .split('\n')
    .map((l) => l.split(' ')[0])
    .find((n) => /^snaplab-e[0-9a-f]{6}$/.test(n));
  const entries = sh('ip', ['netns', 'exec', router, 'ip', 'neigh', 'show']).split('\n').filter(Boolean);
  console.log(
    `router's neighbour entries: ${entries.length} (${entries.filter((l) => l.includes('PERMANENT')).length} permanent); ` +
      `"neighbor table overflow" logged ${overflows() - before} times meanwhile (gc_thresh3 ${sh('cat', ['/proc/sys/net/ipv4/neigh/default/gc_thresh3']).trim()})`,
  );
} finally {
  await removeMany(lab, await lab.list(), { parallel: 8 }).catch((e) => console.error(`rm: ${e.message}`));
  await lab.removeImage('busybox', { force: true }).catch((e) => console.error(`image rm: ${e.message}`));
  await lab.gc();
  lab.close();
  spawnSync('rm', ['-rf', lab.home]);
  spawnSync('ip', ['netns', 'del', UP]);
}
