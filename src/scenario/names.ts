import { join } from 'node:path';
import { driverInfo } from '../drivers/registry.js';

/**
 * Host object names of a scenario, all derived from its short id so that gc can find them after a
 * crash: network namespaces `snaplab-<id>-n<i>` (one per network, holding its bridge) and
 * `snaplab-<id>-m<j>` (one per machine), with `s-` or `x-` before the n or m for a standby copy
 * or a set-aside one (Copy), veths `sl<id><j><k>` in the network's namespace. The
 * directory `<home>/run/net/<id>` is made before any of them and removed after: it is how a home
 * knows these namespaces are its own (several homes may share a host).
 */
export const networkNetns = (sid: string, i: number, copy: Copy = 'live'): string =>
  `snaplab-${sid}-${COPY_TAG[copy]}n${i}`;
export const machineNetns = (sid: string, j: number, copy: Copy = 'live'): string =>
  `snaplab-${sid}-${COPY_TAG[copy]}m${j}`;
/** Every network namespace name of a scenario's, whichever copy: its id is the first group. */
export const SCENARIO_NETNS = /^snaplab-([0-9a-f]{6})-([sx]-)?[nm]\d+$/;
/** The scenario id and copy a network namespace name is of, or undefined when it is no scenario's. */
export function netnsOf(ns: string): { sid: string; copy: Copy } | undefined {
  const m = SCENARIO_NETNS.exec(ns);
  if (!m) return undefined;
  return { sid: m[1]!, copy: m[2] === 's-' ? 'standby' : m[2] === 'x-' ? 'aside' : 'live' };
}
/** The sandbox name of a machine of the standby copy (scenario/standby.ts). */
export const standbySandbox = (scenario: string, machine: string): string =>
  `${machineSandbox(scenario, machine)}_standby`;
export const vethName = (sid: string, j: number, k: number): string => `sl${sid}${j.toString(36)}${k.toString(36)}`;
/**
 * Which copy of a scenario's machines and networks: the live one; a standby raised from a snapshot
 * in the background (`snaplab-<id>-s-…`); or the one a swap set aside, being removed (`-x-…`).
 */
export type Copy = 'live' | 'standby' | 'aside';
const COPY_TAG: Record<Copy, string> = { live: '', standby: 's-', aside: 'x-' };
export const ownerDir = (home: string, sid: string): string => join(home, 'run', 'net', sid);
/** a VM machine's tap on its k-th network, in its own network namespace (host/net/wire.ts) */
export const tapName = (k: number): string => `tap${k}`;
/**
 * A machine with a kernel of its own (DriverCapabilities.ownKernel): its network stack is its
 * guest's, reached through taps in its network namespace, not the namespace itself.
 */
export const isVm = (m: { driver?: string }): boolean => driverInfo(m.driver).capabilities.ownKernel;
/** the sandbox name of a scenario machine: `SCENARIO.MACHINE`; the CLI also takes SCENARIO/MACHINE */
export const machineSandbox = (scenario: string, machine: string): string => `${scenario}.${machine}`;
