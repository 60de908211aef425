import type { DriverInfo } from '../driver.js';

/** A VM's memory is its guest's RAM (and the size of its memory snapshots): smaller by default. */
export const VM_DEFAULT_MEMORY = 256 * 1024 * 1024;
/**
 * The least a VM boots in: the guest kernel ran out of memory in its initcalls at 72 MiB and
 * booted at 80 (Debian's cloud kernel 6.1, busybox image, measured); 96 leaves room.
 */
export const VM_MIN_MEMORY = 96 * 1024 * 1024;

/** The VM driver as the lab sees it before any machine (registry.ts). */
export const QEMU_INFO: DriverInfo = {
  name: 'qemu',
  capabilities: {
    execHold: false, // its connection is the relay's: a hold from 1.7 (sandbox-ops.ts)
    pause: true,
    memorySnapshot: true,
    guestCache: true,
    pauseStandbys: true,
    userns: false,
    clockStopsWhilePaused: true,
    hostRootWithoutUserns: false,
    rootIsVolumeTree: false,
    pidIsMachineInit: false,
    ownKernel: true,
  },
  memory: { defaultBytes: VM_DEFAULT_MEMORY, minBytes: VM_MIN_MEMORY },
  // a guest's virtual CPUs are what its limit rounds up to, else one
  defaultCpus: 1,
  // the guest's console (kernel, init, systemd) on its serial port
  machineNoun: 'a VM',
  consoleLog: 'serial.log',
};
