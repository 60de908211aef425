import { lstat, readdir, rename } from 'node:fs/promises';
import { pidAlive } from '../../host/procs.js';
import { removeTree } from '../../storage/tree.js';
import { join } from 'node:path';
import { BUILTIN_IMAGE } from '../../defaults.js';
import { SnaplabError } from '../../errors.js';
import { run } from '../../host/run.js';
import type { Store } from '../../store/store.js';
import type { ImageRecord } from '../../store/records.js';
import type { ImportOptions } from '../../image/import.js';
import { archiveSource, busyboxSource } from '../../image/registry.js';
import { type ImagePlan, type ProduceOptions, produceImage } from '../../image/source.js';
import { checkName, newId } from '../names.js';
import { noted, orElse } from '../../cleanup.js';

async function sizeOf(dir: string): Promise<number> {
  const r = await run('du', ['-sb', dir]);
  return Number(r.stdout.split(/\s/)[0]);
}

export interface CreateOptions extends Partial<Omit<ProduceOptions, 'name'>> {
  /** `image build --rebuild`: remove the old image, called once the new tree is whole */
  replace?: () => Promise<void>;
}

/** Image trees live in `${home}/images/<name>/rootfs`; storage backends import from there. */
export class Images {
  private building: Promise<ImageRecord> | undefined;

  constructor(
    private readonly home: string,
    private readonly store: Store,
  ) {}

  private dir(name: string): string {
    return join(this.home, 'images', name);
  }

  /** The image record, building the built-in busybox image on first use. */
  async resolve(name: string): Promise<ImageRecord> {
    const found = this.store.getImage(name);
    if (found) return found;
    if (name === BUILTIN_IMAGE) {
      // several machines of a scenario may ask at once: build it once
      this.building ??= this.buildBusybox().finally(() => (this.building = undefined));
      return this.building;
    }
    const known = this.store.listImages().map((i) => i.name);
    throw new SnaplabError(
      'IMAGE_NOT_FOUND',
      `no image named ${JSON.stringify(name)}`,
      `known images: ${[...new Set([BUILTIN_IMAGE, ...known])].join(', ')}; build one with \`snaplab image build debian --packages PKG,... --name ${name}\` (a scenario file can say how: \`image: { name: ${name}, debian: { packages: [...] } }\`), or import one with \`snaplab image import <rootfs.tar|dir> --name ${name}\``,
    );
  }

  /** The built-in image: Debian's static busybox and a symlink per applet. No network needed. */
  async buildBusybox(): Promise<ImageRecord> {
    return this.create(BUILTIN_IMAGE, await busyboxSource.plan({}));
  }

  /**
   * Import an image: a root filesystem (tarball or directory), a `docker save` tarball, or an OCI
   * image layout (directory or tarball). Archives are applied by the helper (native/unpack.c),
   * which resolves every path inside the new tree; see docs/architecture.md "Images".
   */
  async import(source: string, name: string, opts: ImportOptions = {}): Promise<ImageRecord> {
    checkName('image', name);
    if (this.store.getImage(name)) {
      throw new SnaplabError(
        'IMAGE_EXISTS',
        `an image named ${name} already exists`,
        `remove it first with \`snaplab image rm ${name}\`, or pick another --name`,
      );
    }
    const { signal, onProgress, ...input } = opts;
    return this.create(name, await archiveSource.plan({ path: source, ...input }), { signal, onProgress });
  }

  /**
   * Produce `plan` in a temporary directory, then rename into place and record: a crash or a
   * failure leaves no half image (gc removes a `.tmp-*` left by a process that died).
   */
  async create(name: string, plan: ImagePlan, opts: CreateOptions = {}): Promise<ImageRecord> {
    const tmp = join(this.home, 'images', `.tmp-${process.pid}-${name}-${newId()}`);
    try {
      const got = await produceImage(plan, tmp, { ...opts, name });
      // measured before it is moved into place: from the rename to the record is a moment, not a
      // `du` of the tree (gc takes an unrecorded tree after a minute)
      const sizeBytes = await sizeOf(join(tmp, 'rootfs'));
      const dir = this.dir(name);
      await opts.replace?.();
      const raced = this.store.getImage(name);
      if (raced) {
        // another process made and recorded an image of this name meanwhile: theirs stands
        await removeTree(tmp);
        return raced;
      }
      await removeTree(dir); // a tree no record names (a crash's)
      await rename(tmp, dir);
      const rec: ImageRecord = {
        name,
        source: plan.source,
        path: join(dir, 'rootfs'),
        sizeBytes,
        createdAt: Date.now(),
        config: got.config ?? null,
        provenance: got.provenance,
        buildKey: plan.buildKey ?? null,
      };
      if (this.store.putImage(rec)) return rec;
      // another process recorded the same image meanwhile: theirs stands
      const theirs = this.store.getImage(name);
      if (!theirs) throw new Error(`image ${name} was recorded by another process and then removed`);
      return theirs;
    } catch (e) {
      await removeTree(tmp).catch(noted(`remove ${tmp}`, 'ENOENT')); // (what is mounted there stays; gc tries again)
      throw e;
    }
  }

  /**
   * Image directories nothing owns: a build whose process died (`.tmp-PID-…`), and a tree that
   * was renamed into place by a process that died before recording it (after a grace period).
   */
  async collect(graceMs = 60_000): Promise<string[]> {
    const removed: string[] = [];
    const base = join(this.home, 'images');
    for (const d of await readdir(base).catch(orElse([] as string[], 'readdir', 'ENOENT'))) {
      const dir = join(base, d);
      const tmp = /^\.tmp-(\d+)-/.exec(d);
      if (tmp) {
        if (await pidAlive(Number(tmp[1]))) continue;
      } else if (d.startsWith('.') || this.store.getImage(d)) {
        continue;
      } else if (
        Date.now() - ((await lstat(dir).catch(orElse(undefined, `lstat ${dir}`, 'ENOENT')))?.ctimeMs ?? 0) <
        graceMs
      ) {
        continue;
      }
      // never through a mount a build left (mmdebstrap binds /proc, /sys and /dev into its tree)
      if (
        !(await removeTree(dir).then(
          () => true,
          () => false,
        ))
      )
        continue;
      removed.push(`image directory ${dir}${tmp ? ' (an import or build that did not finish)' : ' (no image record)'}`);
    }
    return removed;
  }

  async removeTree(name: string): Promise<void> {
    await removeTree(this.dir(name));
  }
}
