import { randomBytes } from 'node:crypto';
import type { Availability } from '../probe-types.js';
import { run, which } from '../run.js';
import { createNetns, deleteNetns } from './ns.js';
import { NETNS_PREFIX } from './names.js';
import { noted } from '../../cleanup.js';

function scratchName(what: string): string {
  return `${NETNS_PREFIX}probe-${what}-${process.pid}-${randomBytes(3).toString('hex')}`;
}

function firstLine(e: unknown): string {
  return (e instanceof Error ? e.message : String(e)).split('\n')[0] ?? '';
}

/** Can this host make what a scenario network needs: a namespace, a bridge, a veth pair? */
export async function probeNetworking(): Promise<Availability> {
  if (!(await which('ip')))
    return { ok: false, reason: 'the ip command (iproute2) is not installed', fix: 'apt-get install iproute2' };
  if (process.getuid?.() !== 0)
    return { ok: false, reason: 'network namespaces need root', fix: 'run snaplab as root' };
  const ns = scratchName('net');
  try {
    await createNetns(ns);
  } catch (e) {
    return {
      ok: false,
      reason: `cannot create a network namespace: ${firstLine(e)}`,
      fix: 'run as root on a kernel with CONFIG_NET_NS',
    };
  }
  try {
    const res = await run('ip', ['-n', ns, '-batch', '-'], {
      input: 'link add br0 type bridge\nlink add v0 master br0 type veth peer name v1\n',
      allowFail: true,
    });
    if (res.code !== 0) {
      const bridge = /-:1\b/.test(res.stderr);
      return {
        ok: false,
        reason: `cannot create a ${bridge ? 'bridge' : 'veth pair'} in a network namespace: ${res.stderr.trim().split('\n')[0]}`,
        fix: bridge ? 'modprobe bridge' : 'modprobe veth',
      };
    }
    return { ok: true, reason: 'network namespaces, bridges and veth pairs work (iproute2)' };
  } finally {
    await deleteNetns(ns).catch(noted(`delete probe network namespace ${ns}`));
  }
}

/** Can tc netem delay and drop packets here? Tried on the loopback of a scratch namespace. */
export async function probeNetem(): Promise<Availability> {
  if (!(await which('tc')))
    return { ok: false, reason: 'the tc command (iproute2) is not installed', fix: 'apt-get install iproute2' };
  const ns = scratchName('netem');
  try {
    await createNetns(ns);
  } catch (e) {
    return {
      ok: false,
      reason: `cannot create a network namespace to try netem in: ${firstLine(e)}`,
      fix: 'run snaplab doctor as root',
    };
  }
  try {
    const res = await run(
      'tc',
      ['-n', ns, 'qdisc', 'add', 'dev', 'lo', 'root', 'netem', 'delay', '1ms', 'loss', '0%'],
      { allowFail: true },
    );
    if (res.code === 0) return { ok: true, reason: 'tc netem works (delay, jitter, loss)' };
    const msg = res.stderr.trim().split('\n')[0] ?? '';
    return /kind is unknown|Unknown qdisc/i.test(msg)
      ? { ok: false, reason: `the kernel has no netem qdisc: ${msg}`, fix: 'modprobe sch_netem' }
      : { ok: false, reason: `tc netem failed: ${msg}`, fix: 'apt-get install iproute2' };
  } finally {
    await deleteNetns(ns).catch(noted(`delete probe network namespace ${ns}`));
  }
}
