/**
 * The one place that names drivers: a driver's name maps to what is known of it (DriverInfo) and
 * to its implementation. Everything else asks a driver for a capability, a default or a verb
 * (DESIGN.md: a name test outside a driver's folder is a missing capability of its contract).
 */
import { DEFAULT_DRIVER } from '../defaults.js';
import { SnaplabError } from '../errors.js';
import type { Driver, DriverInfo } from './driver.js';
import { NamespacesDriver } from './namespaces/driver.js';
import { NAMESPACES_INFO } from './namespaces/info.js';
import { QemuDriver } from './qemu/driver.js';
import { QEMU_INFO } from './qemu/info.js';

const INFOS: readonly DriverInfo[] = [NAMESPACES_INFO, QEMU_INFO];
/** every driver's name (the schemas' lists: server/schemas.ts, scenario/schema.ts); never empty */
export const DRIVER_NAMES = INFOS.map((i) => i.name) as readonly string[] as readonly [string, ...string[]];

export function unknownDriver(name: string): SnaplabError {
  return new SnaplabError(
    'DRIVER_UNAVAILABLE',
    `unknown driver ${JSON.stringify(name)}`,
    `available drivers: ${DRIVER_NAMES.join(', ')}`,
  );
}

/** What is known of a driver by name, without a host (capabilities, defaults, console log). */
export function driverInfo(name: string = DEFAULT_DRIVER): DriverInfo {
  const info = findDriverInfo(name);
  if (!info) throw unknownDriver(name);
  return info;
}

/** driverInfo, or undefined for a name no driver has */
export function findDriverInfo(name: string = DEFAULT_DRIVER): DriverInfo | undefined {
  return INFOS.find((i) => i.name === name);
}

/** One instance of every driver, for a lab home (LabContext). */
export function createDrivers(home: string): Map<string, Driver> {
  return new Map<string, Driver>([
    [NAMESPACES_INFO.name, new NamespacesDriver(home)],
    [QEMU_INFO.name, new QemuDriver(home)],
  ]);
}
