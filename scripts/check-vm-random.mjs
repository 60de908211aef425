#!/usr/bin/env node
// Do two restores of one VM memory snapshot draw different random numbers? (docs/security.md,
// "Restores' random numbers"). Boots a busybox VM, makes its generator ready, waits until it is
// past the kernel's early boot (two minutes of uptime: before that the generator reseeds every few
// seconds by itself, which hides a missing reseed), snapshots it with its memory, restores it
// twice and reads 16 bytes of /dev/urandom in each. Exit 0 when they differ, 1 when they are the
// same, 2 when it could not tell (an error). Everything it makes is removed (its own home). ~3 minutes.
// Usage: node scripts/check-vm-random.mjs [--wait-s 130]
import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Lab } from '../dist/sdk/index.js';

const i = process.argv.indexOf('--wait-s');
const WAIT_S = i > 0 ? Number(process.argv[i + 1]) : 130;
if (!Number.isFinite(WAIT_S) || WAIT_S < 0) {
  console.error('--wait-s takes a number of seconds (at least 120 for the check to mean anything)');
  process.exit(2);
}
const home = mkdtempSync(join(tmpdir(), 'snaplab-vm-random-'));
const lab = await Lab.open({ home });
const out = async (box, argv, opts) => (await box.exec(argv, opts)).stdout.toString().trim();
/** the two restores' first draws from /dev/urandom */
async function draws() {
  const vm = await lab.create({ driver: 'qemu', name: 'vm' });
  await vm.exec(['sh', '-c', 'head -c 1 /dev/random >/dev/null'], { timeoutMs: 60_000 });
  console.error(`waiting ${WAIT_S} s for the guest to leave early boot`);
  await new Promise((r) => setTimeout(r, WAIT_S * 1000));
  console.log(`guest uptime ${(await out(vm, ['cat', '/proc/uptime'])).split(' ')[0]} s`);
  await vm.snapshot('snap', { memory: true });
  const first = [];
  for (const name of ['a', 'b']) {
    const r = await lab.restore('snap', { name });
    first.push(await out(r, ['sh', '-c', 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \\n"']));
  }
  return first;
}

/** Remove what this made, step by step (a step that fails is said, and the next runs); false if any failed. */
async function cleanup() {
  let ok = true;
  const step = async (what, f) => {
    try {
      await f();
    } catch (e) {
      ok = false;
      console.error(`cleanup: ${what}: ${e.message}`);
    }
  };
  await step('sandboxes', async () => {
    for (const b of await lab.list()) await b.destroy();
  });
  await step('snapshots', async () => {
    for (const s of await lab.snapshots()) await lab.removeSnapshot(s.name);
  });
  await step('image', () => lab.removeImage('busybox'));
  await step('lab', () => lab.close());
  const gc = spawnSync(process.env.SNAPLAB_BIN ?? 'snaplab', ['gc'], { env: { ...process.env, SNAPLAB_HOME: home } });
  // the home goes only once gc ran (it unmounts the home's storage; a mount left under it must not be emptied)
  if (gc.status === 0) rmSync(home, { recursive: true, force: true });
  else {
    ok = false;
    console.error(`cleanup: snaplab gc failed (${gc.error?.message ?? gc.stderr}); ${home} is left for \`snaplab gc\``);
  }
  return ok;
}

let code = 2;
try {
  const [a, b] = await draws();
  const same = a === b;
  console.log(
    `restore a: ${a}\nrestore b: ${b}\n${same ? 'THE SAME: restores share their random numbers' : 'different'}`,
  );
  code = same ? 1 : 0;
} catch (e) {
  console.error(`could not tell: ${e.message}`);
} finally {
  if (!(await cleanup()) && code === 0) code = 2;
}
process.exit(code);
