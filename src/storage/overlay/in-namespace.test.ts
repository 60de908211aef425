import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Volume } from '../backend.js';
import { isMountPoint, unmountAll } from '../mounts.js';
import { MAX_LAYERS } from './layers.js';
import { OverlayBackend } from './overlay-backend.js';

// A clone for a sandbox in a user namespace is mounted inside it, never on the host: the host
// reads it through its layers (an upper dir cannot serve two mounts).
let top: string;
let b: OverlayBackend;
beforeAll(async () => {
  top = await mkdtemp(join(tmpdir(), 'snaplab-test-ovl-ns-'));
  b = new OverlayBackend(top);
  await b.init();
});
afterAll(async () => {
  await unmountAll(top);
  await rm(top, { recursive: true, force: true });
});

describe('overlay clones mounted in a namespace', () => {
  it('are not mounted on the host, give their layers, and snapshot (deep chains flattened) from them', async () => {
    const src = join(top, 'src');
    await mkdir(join(src, 'etc'), { recursive: true });
    await writeFile(join(src, 'etc', 'base'), 'base\n');
    let v: Volume = await b.importImage(src, 'img');
    // a chain just short of flattening, then a clone the host does not mount
    for (let i = 0; i < MAX_LAYERS - 1; i++) {
      const c = await b.clone(v);
      await writeFile(join(c.path, `f${i}`), `${i}\n`);
      v = await b.snapshot(c);
    }
    const ns = await b.clone(v, { mountOnHost: false });
    expect(await isMountPoint(ns.path)).toBe(false);
    const s = b.stack(ns);
    expect(s.lowers).toHaveLength(MAX_LAYERS);
    expect(s.upper).toBe(join(top, 'storage', 'overlay', ns.id, 'upper'));
    // what a sandbox wrote lands in the upper dir; a snapshot takes it, flattening the stack
    await writeFile(join(s.upper, 'mine'), 'inside\n');
    const snap = await b.snapshot(ns);
    expect(snap.ref).toEqual({ layers: [snap.id] }); // flattened: one layer
    expect(await readFile(join(snap.path, 'mine'), 'utf8')).toBe('inside\n');
    expect(await readFile(join(snap.path, 'etc', 'base'), 'utf8')).toBe('base\n');
    expect(await readFile(join(snap.path, `f${MAX_LAYERS - 2}`), 'utf8')).toBe(`${MAX_LAYERS - 2}\n`);
    expect(await isMountPoint(join(top, 'storage', 'overlay', ns.id, 'view'))).toBe(false); // the read-only view is gone
    // and a restart of the host (init) does not mount it either
    await b.init();
    expect(await isMountPoint(ns.path)).toBe(false);
    expect(await b.changeMarker(ns)).toMatch(/^changed:/);
  });

  it('moves layers written before userxattr (trusted.overlay.* marks) to user.overlay.* once, and they stack right', async () => {
    const src = join(top, 'src2');
    await mkdir(join(src, 'd'), { recursive: true });
    await writeFile(join(src, 'd', 'lower'), 'from the image\n');
    const img = await b.importImage(src, 'img2');
    const c = await b.clone(img);
    await rm(join(c.path, 'd'), { recursive: true });
    await mkdir(join(c.path, 'd'));
    await writeFile(join(c.path, 'd', 'upper'), 'mine\n');
    const snap = await b.snapshot(c);
    const layer = join(top, 'storage', 'overlay', snap.id, 'layer', 'd');
    const attrs = (): string => execFileSync('getfattr', ['--absolute-names', '-d', '-m', '.', layer]).toString();
    expect(attrs()).toContain('user.overlay.opaque');
    // the layer as an older snaplab (no userxattr) wrote it
    execFileSync('setfattr', ['-x', 'user.overlay.opaque', layer]);
    execFileSync('setfattr', ['-n', 'trusted.overlay.opaque', '-v', 'y', layer]);
    await rm(join(top, 'storage', 'overlay', '.userxattr'));
    await b.init();
    expect(attrs()).toContain('user.overlay.opaque');
    expect(attrs()).not.toContain('trusted.overlay');
    const again = await b.clone(snap);
    expect(await readdir(join(again.path, 'd'))).toEqual(['upper']);
  });
});
