import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { isMountPoint, listMounts, mountsUnder, parseMountinfo, unmount } from './mounts.js';
import { run } from './run.js';

let base = '';

beforeAll(async () => {
  base = await mkdtemp(join(tmpdir(), 'snaplab-test-mounts-'));
});

afterAll(async () => {
  for (const m of await mountsUnder(base)) await unmount(m.target, { lazy: true });
  await rm(base, { recursive: true, force: true });
  expect(await mountsUnder(base)).toEqual([]);
});

it('parses mountinfo lines, optional fields and \\040 escapes included', () => {
  const [m] = parseMountinfo(
    '36 35 98:0 /mnt1 /mnt/a\\040b rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue\n',
  );
  expect(m).toEqual({
    root: '/mnt1',
    target: '/mnt/a b',
    options: 'rw,noatime',
    fstype: 'ext3',
    source: '/dev/root',
    superOptions: 'rw,errors=continue',
  });
});

it('lists, orders and unmounts tmpfs mounts under a prefix', async () => {
  const outer = join(base, 'with space');
  const inner = join(outer, 'inner');
  await mkdir(outer);
  await run('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'snaplab-test', outer]);
  await mkdir(inner);
  await run('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'snaplab-test', inner]);

  const all = await listMounts();
  expect(all.find((m) => m.target === outer)).toMatchObject({ fstype: 'tmpfs', source: 'snaplab-test' });
  expect((await mountsUnder(base)).map((m) => m.target)).toEqual([inner, outer]); // deepest first
  expect(await mountsUnder(join(base, 'with'))).toEqual([]); // a prefix is a path, not a string
  expect(await isMountPoint(outer)).toBe(true);
  expect(await isMountPoint(base)).toBe(false);

  await unmount(inner);
  expect(await isMountPoint(inner)).toBe(false);
  await unmount(inner); // idempotent
  expect((await mountsUnder(base)).map((m) => m.target)).toEqual([outer]);
});

it('falls back to a lazy unmount when the mount is busy', async () => {
  const dir = join(base, 'busy');
  await mkdir(dir);
  await run('mount', ['-t', 'tmpfs', '-o', 'size=1m', 'snaplab-test', dir]);
  await writeFile(join(dir, 'f'), 'x');
  // a process whose cwd is inside keeps the mount busy
  const { spawn } = await import('node:child_process');
  const holder = spawn('sleep', ['30'], { cwd: dir, stdio: 'ignore' });
  try {
    await unmount(dir);
    expect(await isMountPoint(dir)).toBe(false);
  } finally {
    holder.kill('SIGKILL');
  }
});
