import { join } from 'node:path';
import { driverInfo } from '../drivers/registry.js';

/**
 * Host object names of a scenario, all derived from its short id so that gc can find them after a
 * crash: network namespaces `snaplab-<id>-n<i>` (one per network, holding its bridge) and
 * `snaplab-<id>-m<j>` (one per machine), veths `sl<id><j><k>` in the network's namespace. The
 * directory `<home>/run/net/<id>` is made before any of them and removed after: it is how a home
 * knows these namespaces are its own (several homes may share a host).
 */
export const networkNetns = (sid: string, i: number): string => `snaplab-${sid}-n${i}`;
export const machineNetns = (sid: string, j: number): string => `snaplab-${sid}-m${j}`;
export const vethName = (sid: string, j: number, k: number): string => `sl${sid}${j.toString(36)}${k.toString(36)}`;
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
