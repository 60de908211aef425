import { describe, expect, it } from 'vitest';
import { DAEMON_DEFAULTS, DEFAULT_DRIVER, DEFAULT_IMAGE, DEFAULT_LIMITS } from '../defaults.js';
import { DRIVER_NAMES, driverInfo } from '../drivers/registry.js';
import { machineInit, resolveCreate, type CreateInputs } from './create-options.js';

const VM = DRIVER_NAMES.find((n) => driverInfo(n).memory.defaultBytes !== undefined)!;

/** the error resolveCreate throws for these inputs, as JSON (code, message, hint) */
function refusal(o: CreateInputs, timeoutS?: number): unknown {
  try {
    resolveCreate(o, { timeoutS });
  } catch (e) {
    return (e as { toJSON(): unknown }).toJSON();
  }
  throw new Error(`resolveCreate accepted ${JSON.stringify(o)}`);
}

describe('resolveCreate: a create from an image', () => {
  it('gives nothing asked the lab-wide defaults: image, driver, limits; storage stays for the host to pick', () => {
    expect(resolveCreate({})).toEqual({
      from: 'image',
      image: DEFAULT_IMAGE,
      driver: DEFAULT_DRIVER,
      storage: undefined,
      limits: DEFAULT_LIMITS,
      userns: undefined,
      init: undefined,
    });
    expect(DEFAULT_IMAGE).toBe('busybox');
    expect(DEFAULT_DRIVER).toBe('namespaces');
  });

  it('keeps what was asked, and a limit asked over the defaults of the others', () => {
    const r = resolveCreate({
      image: 'debian',
      driver: VM,
      storage: 'dir',
      limits: { pids: 50, diskBytes: 1 << 30 },
      userns: false,
      init: 'systemd',
    });
    expect(r).toEqual({
      from: 'image',
      image: 'debian',
      driver: VM,
      storage: 'dir',
      limits: { memoryBytes: driverInfo(VM).memory.defaultBytes, pids: 50, diskBytes: 1 << 30 },
      userns: false,
      init: 'systemd',
    });
  });

  it("gives a driver's own default memory over the lab's, and an asked memory over both", () => {
    const vm = resolveCreate({ driver: VM });
    expect(vm.from === 'image' && vm.limits.memoryBytes).toBe(driverInfo(VM).memory.defaultBytes);
    expect(driverInfo(VM).memory.defaultBytes).not.toBe(DEFAULT_LIMITS.memoryBytes);
    const asked = resolveCreate({ driver: VM, limits: { memoryBytes: 512 << 20 } });
    expect(asked.from === 'image' && asked.limits).toEqual({ memoryBytes: 512 << 20, pids: DEFAULT_LIMITS.pids });
    // a name no driver has gets the lab's limits: its raise says it is unknown
    const unknown = resolveCreate({ driver: 'firecracker' });
    expect(unknown.from === 'image' && unknown.limits).toEqual(DEFAULT_LIMITS);
  });
});

describe('resolveCreate: a pool standby and a snapshot', () => {
  it("takes a pool's standby with its lifetime only", () => {
    expect(resolveCreate({ pool: 'warm', labels: { a: 'b' } })).toEqual({ from: 'pool', pool: 'warm' });
    expect(resolveCreate({ pool: 'warm' }, { timeoutS: 60 })).toEqual({ from: 'pool', pool: 'warm', timeoutS: 60 });
  });

  it("restores a snapshot with the limits and userns asked (the snapshot's otherwise: none given here)", () => {
    expect(resolveCreate({ snapshot: 's1' })).toEqual({
      from: 'snapshot',
      snapshot: 's1',
      limits: undefined,
      userns: undefined,
    });
    expect(resolveCreate({ snapshot: 's1', limits: { pids: 9 }, userns: false, timeoutS: 5 })).toEqual({
      from: 'snapshot',
      snapshot: 's1',
      limits: { pids: 9 },
      userns: false,
      timeoutS: 5,
    });
  });
});

describe('resolveCreate: lifetime', () => {
  it("gives the caller's default lifetime (a daemon's) unless one is asked; 0 asked is none, not the default", () => {
    const d = DAEMON_DEFAULTS.defaultTimeoutS;
    expect(resolveCreate({}, { timeoutS: d }).timeoutS).toBe(300);
    expect(resolveCreate({ timeoutS: 0 }, { timeoutS: d }).timeoutS).toBe(0);
    expect(resolveCreate({ timeoutS: 7 }, { timeoutS: d }).timeoutS).toBe(7);
    // the embedded lab has no default: no lifetime at all
    expect('timeoutS' in resolveCreate({})).toBe(false);
  });

  it('refuses a lifetime that is not whole seconds ≥ 0', () => {
    for (const t of [-1, 1.5, Number.NaN])
      expect(refusal({ timeoutS: t })).toEqual({
        code: 'BAD_INPUT',
        message: `invalid timeoutS ${t}`,
        hint: 'give whole seconds ≥ 0 (0: no timeout)',
      });
  });
});

describe('resolveCreate: refusals', () => {
  it('refuses two sources at once', () => {
    const two = {
      code: 'BAD_INPUT',
      message: 'give one of image, snapshot and pool',
      hint: 'a sandbox comes from an image (default busybox), a snapshot, or a pool standby',
    };
    expect(refusal({ image: 'busybox', pool: 'p' })).toEqual(two);
    expect(refusal({ image: 'busybox', snapshot: 's' })).toEqual(two);
    expect(refusal({ snapshot: 's', pool: 'p' })).toEqual(two);
  });

  it("refuses a pool standby with anything that is the pool's", () => {
    const given: CreateInputs[] = [
      { pool: 'p', name: 'n' },
      { pool: 'p', limits: {} },
      { pool: 'p', storage: 'dir' },
      { pool: 'p', driver: DEFAULT_DRIVER },
      { pool: 'p', egress: true },
      { pool: 'p', ids: 1024 },
    ];
    for (const o of given)
      expect(refusal(o)).toEqual({
        code: 'BAD_INPUT',
        message: 'a pool standby takes no name, limits, storage, driver, ids or egress',
        hint: "they are the pool's; give labels, metadata and a timeout only",
      });
  });
});

describe('machineInit', () => {
  const ns = { driver: DEFAULT_DRIVER };
  it('boots the image’s own systemd unless told --init agent', () => {
    expect(machineInit(ns, 'systemd')).toBe('systemd');
    expect(machineInit({ ...ns, init: 'agent' }, 'systemd')).toBeUndefined();
    expect(machineInit(ns, undefined)).toBeUndefined();
    expect(machineInit({ ...ns, init: 'systemd' }, undefined)).toBe('systemd');
  });

  it('does not boot an image’s systemd where a system machine cannot run (host root on the namespaces driver), unless asked', () => {
    expect(machineInit({ ...ns, userns: false }, 'systemd')).toBeUndefined();
    expect(machineInit({ ...ns, userns: false, init: 'systemd' }, 'systemd')).toBe('systemd');
    // a VM needs no user namespace for one
    expect(machineInit({ driver: VM, userns: false }, 'systemd')).toBe('systemd');
  });
});

describe('resolveCreate: egress', () => {
  it('is off unless asked; true is on with empty lists; lists are checked', () => {
    expect(resolveCreate({}).egress).toBeUndefined();
    expect(resolveCreate({ egress: false }).egress).toBeUndefined();
    expect(resolveCreate({ egress: true }).egress).toEqual({ allow: [], deny: [] });
    expect(resolveCreate({ egress: { deny: ['198.51.100.9/24'] } }).egress).toEqual({
      allow: [],
      deny: ['198.51.100.0/24'],
    });
    expect(refusal({ egress: { allow: ['300.0.0.1'] } })).toMatchObject({ code: 'BAD_INPUT' });
  });
});
