/**
 * A daemon's AdminApi and ScenariosApi (served-lab.ts): its lab's pools, images and scenarios,
 * each long change run as one of its operations (operations.ts). A pool it defines is kept at its
 * target while the daemon runs.
 */
import { DEFAULT_IMAGE } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import type { Operations } from './operations.js';
import { cgroupFor, stats } from '../host/cgroups/cgroups.js';
import { orElse } from '../cleanup.js';
import type { AdminApi, Placement, ScenariosApi, ServedLab } from './served-lab.js';
import type { SandboxApi } from '../sdk/api.js';
import { mapLimit } from '../concurrency.js';

/** cgroups read at once by a usage call */
const USAGE_READS = 32;

/** A placement names a cluster's nodes: a single daemon has none to choose from. */
export function noPlacement(b: Placement): void {
  if (b.placement !== undefined)
    throw new SnaplabError(
      'BAD_INPUT',
      'placement is for a cluster gateway: this daemon is a single host',
      'leave placement out, or send this to the gateway',
    );
}

export function labAdmin(lab: ServedLab, operations: Operations): AdminApi {
  return {
    createPool: async (spec) => {
      noPlacement(spec);
      return operations.start('pool create', spec.name, async (progress) => {
        const pool = await lab.createPool(
          { ...spec, image: spec.image ?? DEFAULT_IMAGE, limits: spec.limits ?? {} },
          (ready, target) => progress(`${ready}/${target} ready`),
        );
        pool.start();
        return pool.stats();
      });
    },
    resizePool: async (name, size) => {
      const pool = lab.pool(name);
      return operations.start('pool resize', pool.name, async (progress) => {
        await pool.resize(size, (ready, target) => progress(`${ready}/${target} ready`));
        pool.start();
        return pool.stats();
      });
    },
    removePool: async (name) => ({ removed: await lab.pool(name).remove() }),
    images: async () => lab.images(),
    importImage: async (b) => {
      noPlacement(b);
      return operations.start('image import', b.name, () => lab.importImage(b.source, b.name));
    },
    buildImage: async (b) => {
      noPlacement(b);
      return operations.start('image build', b.name ?? null, (progress) =>
        lab.buildImage(b.spec, { name: b.name, onProgress: progress }),
      );
    },
    removeImage: (name, force) => lab.removeImage(name, { force }),
  };
}

export function labScenarios(lab: ServedLab, operations: Operations): ScenariosApi {
  return {
    // one scenario that cannot be read now (being torn down) is shown as such, not a failed list
    list: async () =>
      Promise.all(
        lab.scenarios().map((s) =>
          s.status().catch((e: Error) => ({
            name: s.name,
            state: 'error',
            reason: e.message,
            machines: [],
            networks: [],
            blocked: [],
            snapshots: [],
          })),
        ),
      ),
    status: (name) => lab.scenario(name).status(),
    up: async (b) => {
      noPlacement(b);
      return operations.start('up', b.name ?? b.file, async (progress) =>
        (
          await lab.up(b.file, { name: b.name, driver: b.driver, onProgress: (m, s) => progress(`${m}: ${s}`) })
        ).status(),
      );
    },
    down: (name) => lab.scenario(name).down(),
    snapshot: (name, snapshot, opts) => lab.scenario(name).snapshot(snapshot, opts),
    reset: (name, to, opts) => lab.scenario(name).reset(to, opts),
    net: async (name, b) => {
      const s = lab.scenario(name);
      const [x, y] = b.machines ?? [];
      if ((b.action === 'block' || b.action === 'unblock') && (!x || !y))
        throw new SnaplabError('BAD_INPUT', `${b.action} needs two machines`, 'give machines: ["a", "b"]');
      if (b.action === 'block') await s.block(x!, y!);
      else if (b.action === 'unblock') await s.unblock(x!, y!);
      else if (b.action === 'partition') await s.partition(...(b.groups ?? []));
      else await s.heal();
    },
  };
}

/**
 * The memory, pids and CPU time of the lab's running and paused machines (of `owner`'s, if named),
 * from their cgroups; with `ids`, of those only (a dashboard's page: its cost follows the page, not
 * the host's count). An id that names nothing, or another owner's machine, is left out, as a list
 * leaves it out.
 */
export async function labUsage(lab: ServedLab, owner: string | undefined, ids?: string[]): Promise<unknown[]> {
  const at = Date.now();
  const visible = (r: SandboxApi | undefined): r is SandboxApi => !!r && (owner === undefined || r.owner === owner);
  const recs = ids
    ? (
        await Promise.all(
          [...new Set(ids)].map((id) =>
            lab.get(id, { check: false }).catch(orElse(undefined, 'usage', 'SANDBOX_NOT_FOUND', 'BAD_INPUT')),
          ),
        )
      ).filter(visible)
    : await lab.list({ owner, check: false });
  // a few cgroups at a time: every machine's files opened at once ran out of descriptors at 10 000
  return mapLimit(
    recs.filter((r) => r.state === 'running' || r.state === 'paused'),
    USAGE_READS,
    async (r) => ({
      id: r.id,
      at,
      ...(await stats(cgroupFor(r.id)).catch(orElse({}, `stats of ${r.id}`, 'ENOENT'))),
    }),
  );
}
