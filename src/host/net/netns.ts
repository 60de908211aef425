/**
 * Scenario networks without the host: a network is a namespace holding a bridge; a machine is a
 * namespace with a veth into each bridge (eth0, eth1, ...). Everything is named snaplab-* under
 * /run/netns and every link is in interface group NET_GROUP, so gc finds and removes it after a crash.
 */
export { NETNS_PREFIX, NET_GROUP, DEFAULT_BRIDGE, netnsPath, checkIfName, macFor } from './names.js';
export { createNetns, deleteNetns, listSnaplabNetns, runIn } from './ns.js';
export { addBridge, attach, detach, block, unblock, setImpairment } from './links.js';
export type { AttachOptions, Impairment } from './links.js';
export { probeNetworking, probeNetem } from './probe.js';
export { wire, unwire } from './wire.js';
export type { WirePlan } from './wire.js';
