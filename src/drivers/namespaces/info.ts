import type { DriverInfo } from '../driver.js';

/** The namespaces driver as the lab sees it before any machine (registry.ts). */
export const NAMESPACES_INFO: DriverInfo = {
  name: 'namespaces',
  capabilities: {
    pause: true,
    execHold: true,
    memorySnapshot: false,
    guestCache: false,
    pauseStandbys: false,
    userns: true,
    clockStopsWhilePaused: false,
    hostRootWithoutUserns: true,
    rootIsVolumeTree: true,
    pidIsMachineInit: true,
    ownKernel: false,
  },
  // a cgroup's limit, not a reservation: the lab's default (lab/lifecycle/limits.ts) applies
  memory: {},
  machineNoun: 'a sandbox',
  consoleLog: 'agent.log',
};
