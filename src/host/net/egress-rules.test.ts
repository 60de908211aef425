import { describe, expect, it } from 'vitest';
import { SnaplabError } from '../../errors.js';
import {
  EGRESS_NETNS,
  checkEntry,
  checkLists,
  flowCaps,
  homeTag,
  machineEgressNetns,
  machineRules,
  routerNetns,
  slotAddress,
  slotOf,
  transit,
} from './egress-rules.js';

describe('egress addresses and names', () => {
  it('gives each slot its own address in 100.96.0.0/12, after the gateway', () => {
    expect(slotAddress(1)).toBe('100.96.0.2');
    expect(slotAddress(254)).toBe('100.96.0.255');
    expect(slotAddress(255)).toBe('100.96.1.0');
    expect(slotAddress(2 ** 20 - 3)).toBe('100.111.255.254');
    for (const n of [1, 254, 255, 2 ** 20 - 3]) expect(slotOf(slotAddress(n))).toBe(n);
    expect(() => slotAddress(0)).toThrow(SnaplabError);
    expect(() => slotAddress(2 ** 20)).toThrow(SnaplabError);
  });

  it("names a home's namespaces by its tag, which gc reads back", () => {
    const tag = homeTag('/var/lib/snaplab');
    expect(tag).toMatch(/^[0-9a-f]{6}$/);
    expect(EGRESS_NETNS.exec(routerNetns(tag))?.slice(1)).toEqual([tag, undefined]);
    expect(EGRESS_NETNS.exec(machineEgressNetns(tag, 42))?.slice(1)).toEqual([tag, '42']);
    // a scenario's namespaces (snaplab-<6 hex>-n0) are not egress's
    expect(EGRESS_NETNS.test('snaplab-abcdef-n0')).toBe(false);
    const t = transit(tag);
    expect(t.router.split('.').slice(0, 2)).toEqual(['100', '127']);
  });
});

const CAPS = flowCaps(262_144).machine;

describe('egress lists', () => {
  it('takes addresses, prefixes (host bits cleared) and host names', () => {
    expect(checkEntry('203.0.113.7')).toBe('203.0.113.7');
    expect(checkEntry('203.0.113.7/32')).toBe('203.0.113.7');
    expect(checkEntry('198.51.100.77/24')).toBe('198.51.100.0/24');
    expect(checkEntry('0.0.0.0/0')).toBe('0.0.0.0/0');
    expect(checkEntry('Example.COM.')).toBe('example.com');
    expect(checkLists({ allow: ['203.0.113.7', '203.0.113.7/32'] })).toEqual({ allow: ['203.0.113.7'], deny: [] });
  });

  it('refuses what is neither, with a hint', () => {
    for (const bad of ['300.1.2.3', '1.2.3.4/33', 'a b', '1.2.3', '::1', 'x;flush ruleset', '"e1"'])
      expect(() => checkEntry(bad), bad).toThrow(/not an IPv4 address, prefix or host name/);
    expect(() => checkLists({ allow: 'x' as unknown as string[] })).toThrow(/list of strings/);
  });

  it('puts deny before allow, a named private range before the defaults, a wide allow after them, and with an allow list nothing else', () => {
    const rules = machineRules(
      3,
      { allow: ['203.0.113.0/24', '10.1.2.0/24', '0.0.0.0/0', '192.0.2.2'], deny: ['203.0.113.9'] },
      { mark: 42, hostAddrs: ['192.0.2.2/32'], caps: CAPS },
    );
    const lines = rules.split('\n');
    const at = (re: RegExp): number => lines.findIndex((l) => re.test(l));
    expect(at(/ip saddr != 100\.96\.0\.4 .* drop/)).toBeGreaterThan(-1);
    // another holder's flows pass neither way; other machines and the router's links never
    expect(at(/ct mark != 42 .*drop/)).toBeLessThan(at(/@m3_deny/));
    expect(at(/ip daddr \{ 100\.96\.0\.0\/12, 100\.127\.0\.0\/16 \}/)).toBeLessThan(at(/@m3_narrow/));
    expect(at(/@m3_deny/)).toBeLessThan(at(/@m3_narrow/));
    expect(at(/@m3_narrow/)).toBeLessThan(at(/@defaults/));
    expect(at(/@defaults/)).toBeLessThan(at(/@m3_wide/));
    expect(at(/@host/)).toBeLessThan(at(/@m3_wide/));
    // 10.1.2.0/24 and the host's own address are named on purpose; 0.0.0.0/0 and 203.0.113.0/24 are wide
    expect(rules).toMatch(/add element ip snaplab m3_narrow \{ 10\.1\.2\.0\/24, 192\.0\.2\.2 \}/);
    expect(rules).toMatch(/add element ip snaplab m3_wide \{ 203\.0\.113\.0\/24, 0\.0\.0\.0\/0 \}/);
    expect(lines.filter((l) => /^add rule ip snaplab m3 +counter name m3_denied/.test(l))).toHaveLength(2);
    expect(rules).toMatch(/add element ip snaplab inbound \{ 100\.96\.0\.4 \. 42 : accept \}/);
    const open = machineRules(3, { allow: [], deny: [] }, { mark: 42, hostAddrs: [], caps: CAPS });
    expect(open).toMatch(/add rule ip snaplab m3 jump m3_ok\n/);
  });
});

describe("the caps on machines' connections", () => {
  it("scale with the host's table, a machine's within its home's", () => {
    const { machine, home } = flowCaps(262_144);
    expect(machine).toEqual({ rate: 64, burst: 1024, active: 1024 });
    expect(home).toEqual({ rate: 256, burst: 8192 });
    expect(flowCaps(1_048_576).machine.rate).toBe(256);
    // a table too small (or unread) for a whole cap: never less than one
    expect(flowCaps(0).machine).toEqual({ rate: 1, burst: 1, active: 1 });
    // what a machine may hold at most: its open connections, and what closed within the uplink's
    // longest timeout for a connection that is not established (60 s) after its burst; a home's
    // flows that are not open likewise (the kernel's default M is 8192 a GiB of memory up to
    // 1 GiB, 65 536 to 4, 262 144 above)
    for (const m of [4096, 8192, 65_536, 262_144, 2_097_152]) {
      const c = flowCaps(m);
      expect(c.machine.active + c.machine.burst + 60 * c.machine.rate, String(m)).toBeLessThanOrEqual(m / 40);
      expect(c.home.burst + 60 * c.home.rate, String(m)).toBeLessThanOrEqual(m / 10);
      for (const k of ['rate', 'burst'] as const) expect(c.machine[k]).toBeLessThanOrEqual(c.home[k]);
    }
  });

  it("takes SNAPLAB_EGRESS_CAPS, a machine's then its home's, and refuses one that is not whole numbers from 1", async () => {
    const { flowCapsNow } = await import('./egress-router.js');
    const was = process.env.SNAPLAB_EGRESS_CAPS;
    try {
      process.env.SNAPLAB_EGRESS_CAPS = '1/20/8,2/30';
      expect(flowCapsNow()).toEqual({
        machine: { rate: 1, burst: 20, active: 8 },
        home: { rate: 2, burst: 30 },
      });
      for (const bad of ['1/20/8', '0/20/8,2/30', '1/20/8,2/-30', '1/20/8,2/30/9', '1/2/3,4/5;flush ruleset', 'x'])
        try {
          process.env.SNAPLAB_EGRESS_CAPS = bad;
          flowCapsNow();
          expect.unreachable(bad);
        } catch (e) {
          expect(e, bad).toMatchObject({ code: 'BAD_INPUT', hint: expect.stringMatching(/RATE|e\.g\./) });
        }
    } finally {
      if (was === undefined) delete process.env.SNAPLAB_EGRESS_CAPS;
      else process.env.SNAPLAB_EGRESS_CAPS = was;
    }
  });

  it("refuses a machine's connection over its cap before it is counted as passing", () => {
    const rules = machineRules(3, { allow: [], deny: [] }, { mark: 42, hostAddrs: [], caps: CAPS });
    const ok = rules.split('\n').filter((l) => l.startsWith('add rule ip snaplab m3_ok '));
    expect(ok[0]).toMatch(
      /ct state new ct status ! confirmed limit rate over 64\/second burst 1024 packets counter name m3_denied reject$/,
    );
    expect(ok[1]).toMatch(/ct state new ct status ! confirmed ct count over 1024 counter name m3_denied reject$/);
    expect(ok.at(-1)).toMatch(/ accept$/);
    // a change of lists keeps the cap's counts (the chain is not made again); a new holder's starts afresh
    const change = machineRules(
      3,
      { allow: ['203.0.113.0/24'], deny: [] },
      { mark: 42, oldMark: 42, hostAddrs: [], caps: CAPS, update: true },
    );
    expect(change).not.toMatch(/m3_ok \w/);
    expect(change).toMatch(/add rule ip snaplab m3 ct state invalid counter name m3_denied drop\n/);
    const handedOn = machineRules(
      3,
      { allow: [], deny: [] },
      { mark: 43, oldMark: 42, hostAddrs: [], caps: CAPS, update: true },
    );
    expect(handedOn).toMatch(/flush chain ip snaplab m3_ok\n.*ct count over 1024/s);
  });
});

describe("the host's local addresses (fib_trie)", () => {
  it('takes every host LOCAL entry of the Local table, prefixes too, and nothing of Main', async () => {
    const { localPrefixes } = await import('./egress.js');
    const text = `Main:
  +-- 0.0.0.0/0 3 0 5
     |-- 10.9.9.9
        /32 host LOCAL
Local:
  +-- 0.0.0.0/0 3 0 5
     +-- 127.0.0.0/8 2 0 2
        +-- 127.0.0.0/31 1 0 0
           |-- 127.0.0.0
              /8 host LOCAL
           |-- 127.0.0.1
              /32 host LOCAL
        |-- 127.255.255.255
           /32 link BROADCAST
     |-- 203.0.113.99
        /32 host LOCAL
     |-- 198.51.100.0
        /24 host LOCAL
`;
    expect(localPrefixes(text).sort()).toEqual(['127.0.0.0/8', '127.0.0.1/32', '198.51.100.0/24', '203.0.113.99/32']);
  });
});
