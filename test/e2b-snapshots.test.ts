/**
 * E2B's snapshots (docs/e2b.md "Snapshots") through a real `snaplab serve --e2b-listen`, driven by
 * E2B's own SDK (the latest pinned: 2.14.1 has no snapshots): a sandbox's snapshot, named or not,
 * made while it runs on; a create from it has its files; listed by sandbox and by name, paged;
 * deleted once; another key neither sees nor uses it. A VM's keeps its memory: its processes resume.
 */
import { Sandbox } from 'e2b';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cli, e2bHome, type E2bHome } from './daemon-helpers.js';

let h: E2bHome;
let other: string;

beforeAll(async () => {
  // a template of VMs (the qemu driver): their snapshots keep their memory
  h = await e2bHome(
    'e2bsnap',
    [],
    [['pool', 'create', 'vms', '--image', 'busybox', '--driver', 'qemu', '--size', '1']],
  );
  other = cli(h.home, ['key', 'create', 'other', '--e2b']).out.trim();
}, 120_000);

afterAll(() => h?.close());

const snapshotsOf = async (opts: Parameters<typeof Sandbox.listSnapshots>[0] = {}) => {
  const out = [];
  const pages = Sandbox.listSnapshots(opts);
  while (pages.hasNext) out.push(...(await pages.nextItems()));
  return out;
};

describe('snapshots', () => {
  it('a snapshot of a running sandbox, named or not: a create from it has its files; listed, paged, deleted once', async () => {
    const sbx = await Sandbox.create();
    const made: Sandbox[] = [];
    try {
      await sbx.files.write('/root/state.txt', 'before');
      const fresh = await sbx.createSnapshot();
      expect(fresh.snapshotId).toMatch(/^[a-z0-9]{20}:default$/);
      expect(fresh.names).toEqual([]);
      // the sandbox runs on, and what it does later is not in the snapshot
      expect(await sbx.isRunning()).toBe(true);
      await sbx.files.write('/root/state.txt', 'after');
      const named = await sbx.createSnapshot({ name: 'my-snap' });
      expect(named).toEqual({ snapshotId: 'my-snap:default', names: ['my-snap:default'] });
      // the same name again: the name goes to the new one (E2B's tag moves)
      await sbx.files.write('/root/state.txt', 'later');
      expect((await sbx.createSnapshot({ name: 'my-snap' })).snapshotId).toBe('my-snap:default');
      const tagged = await sbx.createSnapshot({ name: 'my-snap:v2' });
      expect(tagged.snapshotId).toBe('my-snap:v2');

      for (const [template, want] of [
        [fresh.snapshotId, 'before'],
        ['my-snap', 'later'],
        ['my-snap:default', 'later'],
        ['my-snap:v2', 'later'],
      ] as const) {
        const from = await Sandbox.create(template, { envs: { FROM: 'snap' } });
        made.push(from);
        expect(await from.files.read('/root/state.txt')).toBe(want);
        expect((await from.commands.run('echo $FROM')).stdout).toBe('snap\n');
        expect((await from.getInfo()).templateId).toBe(template);
      }

      const all = (await snapshotsOf()).map((s) => s.snapshotId).sort();
      expect(all).toEqual([fresh.snapshotId, 'my-snap:default', 'my-snap:v2'].sort());
      expect((await snapshotsOf({ sandboxId: sbx.sandboxId })).length).toBe(3);
      expect((await snapshotsOf({ sandboxId: made[0]!.sandboxId })).length).toBe(0);
      expect((await snapshotsOf({ name: 'my-snap' })).map((s) => s.snapshotId).sort()).toEqual([
        'my-snap:default',
        'my-snap:v2',
      ]);
      expect((await snapshotsOf({ name: 'my-snap:v2' })).map((s) => s.snapshotId)).toEqual(['my-snap:v2']);
      // two a page: every one once, also when a page's are removed before the next is asked for
      const paged = await snapshotsOf({ limit: 2 });
      expect(paged.map((s) => s.snapshotId).sort()).toEqual(all);
      // the newest two, removed once read: the pages after them go on from where they were
      await sbx.createSnapshot({ name: 'spare-a' });
      await sbx.createSnapshot({ name: 'spare-b' });
      const pages = Sandbox.listSnapshots({ limit: 2 });
      const first = await pages.nextItems();
      expect(first.map((s) => s.snapshotId).sort()).toEqual(['spare-a:default', 'spare-b:default']);
      for (const s of first) expect(await Sandbox.deleteSnapshot(s.snapshotId)).toBe(true);
      const rest = [];
      while (pages.hasNext) rest.push(...(await pages.nextItems()));
      expect(rest.map((s) => s.snapshotId).sort()).toEqual(all);
      // a name the host has (a snapshot made without a key) is not this key's to move: 409
      expect(cli(h.home, ['create', '--name', 'hs']).code).toBe(0);
      expect(cli(h.home, ['snapshot', 'hs', '--name', 'hostsnap']).code).toBe(0);
      expect(cli(h.home, ['rm', 'hs']).code).toBe(0);
      await expect(sbx.createSnapshot({ name: 'hostsnap' })).rejects.toThrow(/409|not this key's/);
      expect(cli(h.home, ['snapshot', 'rm', 'hostsnap']).code).toBe(0);

      // another key sees none, uses none, removes none
      expect(await snapshotsOf({ apiKey: other })).toEqual([]);
      await expect(Sandbox.create('my-snap', { apiKey: other })).rejects.toThrow();
      expect(await Sandbox.deleteSnapshot('my-snap:v2', { apiKey: other })).toBe(false);

      expect(await Sandbox.deleteSnapshot('my-snap:v2')).toBe(true);
      expect(await Sandbox.deleteSnapshot('my-snap:v2')).toBe(false);
      await expect(Sandbox.create('my-snap:v2')).rejects.toThrow();
      expect(await Sandbox.deleteSnapshot('my-snap')).toBe(true);
      expect(await Sandbox.deleteSnapshot(fresh.snapshotId)).toBe(true);
      expect(await snapshotsOf()).toEqual([]);
      // (the VM pool's own template aside)
      const left = JSON.parse(cli(h.home, ['snapshot', 'ls', '--json']).out) as { name: string }[];
      expect(left.map((s) => s.name).filter((n) => !n.startsWith('_pool.'))).toEqual([]);
    } finally {
      for (const s of made) await s.kill();
      await sbx.kill();
    }
  });

  it("a VM's snapshot keeps its memory: a create from it resumes its processes, on the network it had", async () => {
    const vm = await Sandbox.create('vms');
    const made: Sandbox[] = [];
    try {
      // (the file first, in its own command: a background command's start is not its first line done)
      await vm.commands.run('echo 41 > /root/n');
      await vm.commands.run('sleep 1234', { background: true });
      const snap = await vm.createSnapshot();
      // E2B's default (internet access) asked: the VM had none, so none, as its snapshot keeps its network
      const from = await Sandbox.create(snap.snapshotId);
      made.push(from);
      expect(await from.files.read('/root/n')).toBe('41\n');
      expect((await from.commands.run('ps')).stdout).toContain('sleep 1234');
      expect((await from.getInfo()).allowInternetAccess).toBe(false);
      expect(await Sandbox.deleteSnapshot(snap.snapshotId)).toBe(true);
    } finally {
      for (const s of made) await s.kill();
      await vm.kill();
    }
  });
});
