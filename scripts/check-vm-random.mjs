#!/usr/bin/env node
// Do two restores of one VM memory snapshot draw different random numbers? (docs/security.md,
// "Restores' random numbers"). Boots a busybox VM, makes its generator ready, waits until it is
// past the kernel's early boot (two minutes of uptime: before that the generator reseeds every few
// seconds by itself, which hides a missing reseed), snapshots it with its memory, restores it
// twice and reads 16 bytes of /dev/urandom in each. Exit 0 when they differ, 1 when they are the
// same. Everything it makes is removed (its own home). ~3 minutes.
// Usage: node scripts/check-vm-random.mjs [--wait-s 130]
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab } from '../dist/sdk/index.js';

const i = process.argv.indexOf('--wait-s');
const WAIT_S = i > 0 ? Number(process.argv[i + 1]) : 130;
const home = mkdtempSync(join(tmpdir(), 'snaplab-vm-random-'));
const lab = await Lab.open({ home });
const out = async (box, argv, opts) => (await box.exec(argv, opts)).stdout.toString().trim();
let same = true;
try {
  const vm = await lab.create({ driver: 'qemu', name: 'vm' });
  await vm.exec(['sh', '-c', 'head -c 1 /dev/random >/dev/null'], { timeoutMs: 60_000 });
  console.error(`waiting ${WAIT_S} s for the guest to leave early boot`);
  await new Promise((r) => setTimeout(r, WAIT_S * 1000));
  console.log(`guest uptime ${(await out(vm, ['cat', '/proc/uptime'])).split(' ')[0]} s`);
  await vm.snapshot('snap', { memory: true });
  const draws = [];
  for (const name of ['a', 'b']) {
    const r = await lab.restore('snap', { name });
    draws.push(await out(r, ['sh', '-c', 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"']));
  }
  same = draws[0] === draws[1];
  console.log(
    `restore a: ${draws[0]}\nrestore b: ${draws[1]}\n${same ? 'THE SAME: restores share their random numbers' : 'different'}`,
  );
} finally {
  for (const b of await lab.list()) await b.destroy().catch((e) => console.error(`cleanup: ${e.message}`));
  for (const s of await lab.snapshots())
    await lab.removeSnapshot(s.name).catch((e) => console.error(`cleanup: ${e.message}`));
  await lab.removeImage('busybox').catch((e) => console.error(`cleanup: ${e.message}`));
  await lab.close();
  spawnSync(process.env.SNAPLAB_BIN ?? 'snaplab', ['gc'], { env: { ...process.env, SNAPLAB_HOME: home } });
  rmSync(home, { recursive: true, force: true });
}
process.exit(same ? 1 : 0);
