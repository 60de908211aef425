import { describe, expect, it } from 'vitest';
import { bestOfK, eligible, score } from './placement.js';
import { parseClusterUrl } from './store.js';
import type { NodeInfo } from './store.js';

const GiB = 2 ** 30;

function node(name: string, over: Partial<NodeInfo> = {}): NodeInfo {
  return {
    name,
    url: `http://127.0.0.1:1/${name}`,
    labels: {},
    version: 'x',
    pid: 1,
    home: `/h/${name}`,
    startedAt: 0,
    updatedAt: 0,
    capacity: {
      cores: 2,
      memoryBytes: 8 * GiB,
      memoryFreeBytes: 4 * GiB,
      diskBytes: 100 * GiB,
      diskFreeBytes: 50 * GiB,
    },
    sandboxes: 0,
    pools: {},
    images: ['busybox'],
    snapshots: [],
    drivers: ['namespaces'],
    storage: ['overlay'],
    ...over,
  };
}

describe('placement', () => {
  it('keeps only the nodes that can take the request, and says why none can', () => {
    const a = node('a', { labels: { zone: 'x' }, pools: { p: { image: 'busybox', size: 2, ready: 1 } } });
    const b = node('b', { labels: { zone: 'y' }, snapshots: ['s'] });
    expect(eligible([], {}, new Set())).toEqual({ reason: 'no node is in the cluster' });
    expect((eligible([a, b], { labels: { zone: 'y' } }, new Set()) as NodeInfo[]).map((n) => n.name)).toEqual(['b']);
    expect(eligible([a, b], { labels: { zone: 'z' } }, new Set())).toEqual({ reason: 'no node has the labels zone=z' });
    expect((eligible([a, b], { pool: 'p' }, new Set()) as NodeInfo[]).map((n) => n.name)).toEqual(['a']);
    expect((eligible([a, b], { snapshot: 's' }, new Set()) as NodeInfo[]).map((n) => n.name)).toEqual(['b']);
    expect(eligible([a, b], { pool: 'q' }, new Set())).toEqual({ reason: 'no node holds pool q' });
    expect(eligible([a, b], {}, new Set(['a', 'b']))).toEqual({ reason: 'every node is drained or was tried' });
    expect((eligible([a, b], { exclude: new Set(['a']) }, new Set()) as NodeInfo[]).map((n) => n.name)).toEqual(['b']);
    // an image only some nodes have: those; the built-in one: any
    const c = node('c', { images: ['busybox', 'deb'] });
    expect((eligible([a, c], { image: 'deb' }, new Set()) as NodeInfo[]).map((n) => n.name)).toEqual(['c']);
    expect((eligible([a, node('d', { images: [] })], { image: 'busybox' }, new Set()) as NodeInfo[]).length).toBe(2);
    expect(eligible([a], { image: 'deb' }, new Set())).toMatchObject({
      reason: expect.stringMatching(/no node has image deb/),
    });
  });

  it('scores a ready standby above any free capacity, then the emptier node', () => {
    const warm = node('warm', {
      capacity: { ...node('x').capacity, memoryFreeBytes: 1 * GiB },
      pools: { p: { image: 'busybox', size: 1, ready: 1 } },
    });
    const cold = node('cold', { pools: { p: { image: 'busybox', size: 1, ready: 0 } } });
    expect(score(warm, { pool: 'p' }, 5)).toBeGreaterThan(score(cold, { pool: 'p' }, 0));
    // a standby another run of this gateway is about to take does not count
    expect(score(warm, { pool: 'p' }, 5, 1)).toBeLessThan(score(cold, { pool: 'p' }, 0));
    expect(score(node('a'), {}, 0)).toBeGreaterThan(score(node('a'), {}, 3));
    // the image already there counts like a standby
    expect(score(node('a'), { image: 'busybox' }, 9)).toBeGreaterThan(
      score(node('b', { images: [] }), { image: 'busybox' }, 0),
    );
  });

  it('draws K candidates and takes the best of them', () => {
    const nodes = ['a', 'b', 'c', 'd'].map((n) => node(n));
    const rate = (n: NodeInfo): number => ({ a: 1, b: 2, c: 3, d: 4 })[n.name as 'a']!;
    // K ≥ the nodes: the best overall
    expect(bestOfK(nodes, 4, rate).node.name).toBe('d');
    // a fixed draw: indexes 0 then 0 of what is left (a, b) → b
    let i = 0;
    expect(bestOfK(nodes, 2, rate, () => [0, 0][i++]!).node.name).toBe('b');
    // K = 1 is a random choice
    expect(bestOfK(nodes, 1, rate, () => 0.99).node.name).toBe('d');
  });
});

describe('cluster addresses', () => {
  it('reads etcd://host:port lists and an optional prefix', () => {
    expect(parseClusterUrl('etcd://127.0.0.1:2379')).toEqual({ hosts: ['127.0.0.1:2379'], prefix: '/snaplab/' });
    expect(parseClusterUrl('etcd://a:1,b:2,[::1]:3/lab1')).toEqual({
      hosts: ['a:1', 'b:2', '[::1]:3'],
      prefix: '/lab1/',
    });
    for (const bad of ['http://a:1', 'etcd://', 'etcd://a', 'etcd://a:1,b'])
      expect(() => parseClusterUrl(bad)).toThrow(/invalid cluster address/);
  });
});
