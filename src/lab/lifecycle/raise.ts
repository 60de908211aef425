import type { AgentClient } from '../../agent/client.js';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { type Driver, MACHINE_AGENT_PATH, type MachineSpec, type RaisedMachine } from '../../drivers/driver.js';
import { SnaplabError } from '../../errors.js';
import type { StorageBackend, StorageKind, Volume } from '../../storage/backend.js';
import { inflight } from './inflight.js';
import type { MemoryImage } from '../../drivers/driver.js';
import type { Limits, SandboxRecord } from '../../store/records.js';
import type { Trace } from '../../timing/trace.js';
import type { LabContext } from '../context.js';
import { checkName, defaultName, newId } from '../names.js';
import { undoRaise } from './teardown.js';
import { me } from './owner.js';
import { DEFAULT_DISK_BYTES } from '../../defaults.js';
import { DEFAULT_ENV } from '../io/exec.js';
import { SYSTEMD_PATHS, waitSystemRunning } from './system.js';
import { USERNS_SIZE } from '../../host/userns/id-ranges.js';
import { checkRangeSize, claimRange, releaseRange } from '../../host/userns/registry.js';
import { attachEgress } from '../../host/net/egress.js';
import { GATEWAY, GUEST_LINK, newMark, type EgressLists } from '../../host/net/egress-rules.js';

export interface RaiseInput {
  name?: string;
  image: string;
  storage: StorageKind;
  driver: string;
  limits: Limits;
  /** volume to clone the root filesystem from (an image's or a snapshot's) */
  base: () => Promise<Volume>;
  origin: string | null;
  /** raise as a standby of this pool */
  pool?: string;
  /**
   * held by this process once running (pools: a member until it is paused or handed out, or the
   * pool's template VM), in the same write: the reason it then carries, and the template's pool
   */
  heldBy?: { reason: string; templateOf?: string };
  /** a machine of this scenario */
  scenario?: string;
  /** default: the sandbox's name */
  hostname?: string;
  /** a network namespace snaplab made, to join (scenario machines) */
  netns?: string;
  /** (a VM scenario machine) its interfaces: taps in `netns` (MachineSpec.nics) */
  nics?: { tap: string; mac: string; address: string }[];
  /** continue from this memory snapshot instead of booting (drivers that can) */
  memory?: MemoryImage;
  /** false: no user namespace (--no-userns); default: one wherever driver and storage allow (usernsFor) */
  userns?: boolean;
  /**
   * a scenario machine's range, claimed by `up` for the user namespace that owns the machine's
   * network namespace: the sandbox joins that namespace instead of making one
   */
  uidBase?: number;
  /** 'systemd': a system machine (the image's init as PID 1; usable once systemd is up) */
  init?: 'systemd';
  /** ids in its user namespace, a power of two (registry.ts checkRangeSize); default USERNS_SIZE */
  ids?: number;
  /**
   * the disk cap was asked for (true: refused where it cannot hold) or is a default (false: dropped
   * where it cannot, and when setting it fails); 'server': a key's default, dropped only where the
   * storage says no cap can hold here, a failure to set it failing the create (a key's ceilings
   * stand on it). Default: true when limits.diskBytes is set.
   */
  diskAsked?: boolean | 'server';
  /** outbound network with these lists (docs/egress.md); default: loopback only */
  egress?: EgressLists;
}

/** Storage on which a sandbox's root filesystem can be idmapped into its user namespace. */
export const USERNS_STORAGE: readonly StorageKind[] = ['btrfs', 'dir', 'overlay'];

/**
 * Whether a sandbox gets a user namespace: always where the driver and storage can give one,
 * unless the caller says no. (Overlay clones are then mounted inside the namespace, over idmapped
 * layers: an overlay mount itself cannot be idmapped.)
 * A scenario machine joins the user namespace that owns its network namespace (made by `up`, kept
 * across resets: `uidBase`); one raised into a network namespace without one has none.
 */
export function usernsFor(
  ctx: LabContext,
  input: Pick<RaiseInput, 'driver' | 'storage' | 'userns' | 'netns' | 'uidBase'>,
): boolean {
  return (
    input.userns !== false &&
    ctx.driver(input.driver).capabilities.userns &&
    USERNS_STORAGE.includes(input.storage) &&
    (input.netns === undefined || input.uidBase !== undefined)
  );
}

/** A smaller range (`ids`) is for a sandbox in a user namespace of its own, and not for systemd. */
function checkIds(input: RaiseInput, userns: boolean): void {
  if (input.ids === undefined || input.ids === USERNS_SIZE) return;
  checkRangeSize(input.ids);
  if (!userns || input.uidBase !== undefined)
    throw new SnaplabError(
      'BAD_INPUT',
      `ids ${input.ids} sizes a user namespace, and this sandbox has none of its own`,
      "leave out --ids (a VM, --no-userns, a scenario machine: the range is not the create's)",
    );
  if (input.init === 'systemd')
    throw new SnaplabError(
      'BAD_INPUT',
      `a system machine needs all ${USERNS_SIZE} ids (systemd's nobody is 65534, its dynamic users 61184-65519)`,
      'leave out --ids, or use --init agent',
    );
}

/**
 * Make a sandbox: record it first (so a crash leaves a record that reconciliation and gc can
 * act on), clone its root filesystem, raise the machine, and run a first command in it.
 * Any failure removes everything made so far.
 */
export async function raiseSandbox(
  ctx: LabContext,
  input: RaiseInput,
  trace: Trace,
  signal?: AbortSignal,
): Promise<{ record: SandboxRecord; agent: AgentClient }> {
  const given = input.name === undefined ? undefined : checkName('sandbox', input.name);
  if (given !== undefined && ctx.store.getSandbox(given)) {
    throw new SnaplabError(
      'SANDBOX_EXISTS',
      `a sandbox named ${given} already exists`,
      `pick another --name, or remove it with \`snaplab rm ${given}\``,
    );
  }
  const driver = ctx.driver(input.driver);
  const userns = usernsFor(ctx, input);
  // a VM is its own boundary; on namespaces systemd holds CAP_SYS_ADMIN, safe only in a user namespace
  if (input.init === 'systemd' && driver.capabilities.hostRootWithoutUserns && !userns) {
    throw new SnaplabError(
      'BAD_INPUT',
      'a system machine (--init systemd) needs a user namespace: its systemd holds CAP_SYS_ADMIN',
      'leave out --no-userns (and use storage that can idmap: see `snaplab doctor`), or use --driver qemu',
    );
  }
  checkIds(input, userns);
  const record = await trace.phase('record', () => recordSandbox(ctx, input, driver.name, given, userns));
  trace.target ??= record.name;
  let agent: AgentClient | undefined;
  try {
    const raised = await raiseMachine(ctx, input, record, driver, userns, trace, signal);
    agent = raised.agent;
    record.pid = raised.handle.pid;
    record.pidStart = raised.handle.pidStart;
    const note = await firstAnswer(input, raised.agent, trace);
    Object.assign(record, {
      state: 'running',
      reason: input.heldBy?.reason ?? note,
      owner: input.heldBy ? me('hold') : null,
    });
    await trace.phase('record running', () =>
      ctx.store.updateSandbox(record.id, {
        state: 'running',
        reason: record.reason,
        owner: record.owner,
        pid: record.pid,
        pidStart: record.pidStart,
        limits: record.limits,
      }),
    );
    return { record, agent };
  } catch (e) {
    void agent?.close();
    await undoRaise(ctx, record);
    throw e;
  }
}

/**
 * The sandbox's record, inserted as `creating`. A generated name (24 bits of the id) can collide
 * with a live one when there are hundreds: drawn again rather than fail the user's create. The
 * user namespace range is claimed host-wide first (host/userns/registry.ts) and recorded in the same
 * insert, so gc can always account for it.
 */
async function recordSandbox(
  ctx: LabContext,
  input: RaiseInput,
  driver: string,
  given: string | undefined,
  userns: boolean,
): Promise<SandboxRecord> {
  const make = (): SandboxRecord => {
    const id = newId();
    return {
      id,
      name: given ?? defaultName(id),
      image: input.image,
      storage: input.storage,
      driver,
      state: 'creating',
      reason: `being created by pid ${process.pid}`,
      owner: me('create'),
      volume: null,
      pid: null,
      pidStart: null,
      limits: input.limits,
      origin: input.origin,
      createdAt: Date.now(),
      pool: input.pool ?? null,
      baseline: null,
      scenario: input.scenario ?? null,
      uidBase: null,
      ids: userns && input.ids !== undefined && input.ids !== USERNS_SIZE ? input.ids : null,
      init: input.init ?? null,
      templateOf: input.heldBy?.templateOf ?? null,
      egress: input.egress ? { slot: 0, ...input.egress, mark: newMark() } : null,
    };
  };
  let record = make();
  for (let attempt = 0; ; attempt++) {
    const own = userns && input.uidBase === undefined; // a machine's range is its scenario's
    record.uidBase = !userns
      ? null
      : own
        ? await claimRange(ctx.home, record.id, record.ids ?? USERNS_SIZE)
        : input.uidBase!;
    let taken: boolean;
    try {
      taken = !ctx.store.insertSandbox(record);
    } catch (e) {
      if (own && record.uidBase !== null) await releaseRange(record.uidBase, ctx.home, record.id, record.ids ?? null);
      throw e;
    }
    if (!taken) return record;
    if (own && record.uidBase !== null) await releaseRange(record.uidBase, ctx.home, record.id, record.ids ?? null);
    if (given !== undefined || attempt >= 20)
      throw new SnaplabError('SANDBOX_EXISTS', `a sandbox named ${record.name} already exists`, 'pick another --name');
    record = make();
  }
}

/**
 * Clone the root filesystem while the driver makes what does not need it (the cgroup), then raise
 * the machine on it, or continue one from a memory snapshot. The volume is in the record once made.
 */
async function raiseMachine(
  ctx: LabContext,
  input: RaiseInput,
  record: SandboxRecord,
  driver: Driver,
  userns: boolean,
  trace: Trace,
  signal?: AbortSignal,
): Promise<RaisedMachine> {
  const backend = await trace.phase('storage ready', () => ctx.readyBackend(input.storage));
  const base = await input.base();
  // an image without systemd cannot boot one: said before a machine is launched (a VM's boot
  // would take seconds to find out)
  if (input.init === 'systemd' && input.origin === null && !SYSTEMD_PATHS.some((p) => existsSync(join(base.path, p)))) {
    throw new SnaplabError(
      'BAD_INPUT',
      `image ${input.image} has no systemd (no ${SYSTEMD_PATHS.join(' or ')} in it)`,
      `build one with it (snaplab image build debian --packages systemd,systemd-sysv), or use --init agent`,
    );
  }
  // a machine with egress gets its network namespace while its root is cloned (it needs neither)
  const egress = record.egress ? trace.phase('egress', () => egressNetns(ctx, record, driver, input.netns)) : undefined;
  const netns = input.netns;
  const machine = {
    id: record.id,
    hostname: input.hostname ?? record.name,
    limits: input.limits,
    netns,
    ...(input.nics ? { nics: input.nics } : {}),
    ...(record.uidBase !== null ? { userns: { base: record.uidBase, count: record.ids ?? USERNS_SIZE } } : {}),
    ...(input.init ? { init: input.init } : {}),
  };
  // the cgroup does not need the root filesystem: make both at once
  const [cloned, prepared, linked] = await Promise.allSettled([
    trace.phase('clone rootfs', () => cloneRoot(ctx, input, record, base, driver, userns, trace)),
    driver.prepare(machine, trace),
    egress ?? Promise.resolve(undefined),
  ]);
  if (cloned.status === 'rejected') throw cloned.reason;
  const volume = cloned.value;
  if (prepared.status === 'rejected') throw prepared.reason;
  if (linked.status === 'rejected') throw linked.reason;
  const spec = {
    ...machine,
    ...(linked.value ? { netns: linked.value, ...guestNic(machine.nics, driver) } : {}),
    rootfs: volume.path,
    source: { id: base.id, path: base.path, image: input.origin === null },
    ...(userns && backend.stack ? { stack: backend.stack(volume) } : {}),
  };
  // a restored machine comes back on the host's clock, with an identity of its own (Driver.restoreMemory)
  return input.memory && driver.restoreMemory
    ? driver.restoreMemory(spec, input.memory, trace)
    : driver.raise(spec, trace, signal);
}

/** A VM with egress: its NICs and the one on its namespace's tap, addressed with its gateway. */
export function guestNic(nics: MachineSpec['nics'], driver: Driver): Pick<MachineSpec, 'nics'> {
  if (!driver.capabilities.ownKernel) return {};
  const g = GUEST_LINK;
  return { nics: [...(nics ?? []), { tap: g.tap, mac: g.mac, address: g.address, gateway: g.gateway }] };
}

/** The machine's network namespace, linked to the home's egress router (host/net/egress.ts). */
export async function egressNetns(
  ctx: LabContext,
  record: SandboxRecord,
  driver: Driver,
  into?: string,
): Promise<string> {
  const e = record.egress!;
  return attachEgress(ctx.home, {
    slot: e.slot,
    lists: e,
    mark: e.mark,
    ...(into ? { into } : {}),
    // a VM's guest has a NIC of its own on a tap there (GUEST_LINK)
    ...(driver.capabilities.ownKernel ? { guest: true } : {}),
    ...(record.uidBase !== null ? { userns: { base: record.uidBase, count: record.ids ?? USERNS_SIZE } } : {}),
  });
}

/** The machine's root volume, recorded before gc's mark on clones is lifted (gc always sees an owner), and capped. */
function cloneRoot(
  ctx: LabContext,
  input: RaiseInput,
  record: SandboxRecord,
  base: Volume,
  driver: Driver,
  userns: boolean,
  trace: Trace,
): Promise<Volume> {
  return inflight(ctx, 'clone', async () => {
    // ready again under the mark (cached: no cost): a gc that collected meanwhile may have
    // unmounted an empty btrfs pool, and forgot that it was ready
    const b = await ctx.readyBackend(input.storage);
    const v = await b.clone(base, { mountOnHost: !userns });
    record.volume = v;
    ctx.store.updateSandbox(record.id, { volume: v });
    await trace.phase('disk cap', () =>
      capDisk(b, v, record, driver, input.diskAsked ?? input.limits.diskBytes !== undefined),
    );
    return v;
  });
}

/**
 * The new machine's first answer (a restored one's was its identity): the agent's own binary,
 * which every machine has at /run/snaplab/agent (an image need not have `true`: distroless and
 * scratch images do not), and the command still goes through everything a command does (fork,
 * exec, the seccomp filter). A system machine then waits for systemd: a note when degraded. A
 * started machine (start.ts) is asked the same.
 */
export async function firstAnswer(
  input: Pick<RaiseInput, 'memory' | 'egress' | 'init'>,
  agent: AgentClient,
  trace: Trace,
): Promise<string | null> {
  const first = input.memory
    ? { exitCode: 0, stderr: Buffer.alloc(0) }
    : await trace.phase(
        'first exec',
        () => agent.exec({ argv: [MACHINE_AGENT_PATH, '--version'], env: DEFAULT_ENV }).result,
      );
  if (first.exitCode !== 0) {
    throw new SnaplabError(
      'LAUNCH_FAILED',
      `the first command in the new sandbox failed (exit ${first.exitCode}): ${first.stderr.toString().trim()}`,
      'see `snaplab trace` of the operation; the machine is removed',
    );
  }
  // its resolver is the router, which sends DNS on to the uplink's
  if (input.egress && !input.memory)
    await trace.phase('resolv.conf', () => agent.putFile('/etc/resolv.conf', Buffer.from(`nameserver ${GATEWAY}\n`)));
  if (input.init !== 'systemd') return null;
  const up = await trace.phase('systemd up', () => waitSystemRunning(agent));
  return up.state === 'degraded' ? `degraded: ${up.failed.join(', ') || 'some units'} failed` : null;
}

/**
 * Why a disk cap cannot be put on a machine of this storage and driver (null: it can, unless the
 * storage then says otherwise): `asked`, a cap given (--disk, a snapshot's); else the default,
 * which holds only where it costs nothing. What a pool's take will get reads it too (pools/admin.ts).
 */
export function capRefused(backend: StorageBackend, driver: Driver, asked: boolean): string | null {
  if (!asked && backend.capsByDefault === false) return `${backend.kind} storage caps a disk only when asked (--disk)`;
  if (!driver.capabilities.rootIsVolumeTree) return `the ${driver.name} driver's disk is an image file, not capped yet`;
  if (!backend.limitDisk) return `${backend.kind} storage cannot cap a machine's disk`;
  return null;
}

/**
 * Cap what the machine may write (limits.diskBytes; the default where the storage enforces one),
 * before anything runs in it. An explicit cap that cannot be enforced here is refused; the default
 * is then dropped from the record, so what `ls` and the API show is what holds (stored with the
 * running state, in the create's one last write).
 */
async function capDisk(
  backend: StorageBackend,
  volume: Volume,
  record: SandboxRecord,
  driver: Driver,
  asked: boolean | 'server',
): Promise<void> {
  const explicit = asked === true;
  const given = record.limits.diskBytes;
  if (given === 0) return;
  const bytes = given ?? DEFAULT_DISK_BYTES;
  let why = capRefused(backend, driver, given !== undefined);
  if (why === null) {
    try {
      why = await backend.limitDisk!(volume, bytes); // (capRefused: there is one)
    } catch (e) {
      if (asked !== false) throw e;
      why = (e as Error).message; // a default that fails is dropped (and said nowhere but here), not a failed create
    }
  }
  if (why === null) {
    record.limits = { ...record.limits, diskBytes: bytes };
    return;
  }
  if (explicit)
    throw new SnaplabError(
      'BAD_INPUT',
      `--disk cannot be enforced here: ${why}`,
      'caps hold on the namespaces driver (`snaplab doctor` says which storage caps disks); leave out --disk',
    );
  const { diskBytes: _, ...rest } = record.limits;
  record.limits = rest;
}
