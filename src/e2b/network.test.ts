import { describe, expect, it } from 'vitest';
import { ALL_TRAFFIC, e2bNetwork, egressFor } from './network.js';

describe("E2B's network options as egress", () => {
  it('gives internet by default, as E2B does', () => {
    expect(egressFor(e2bNetwork({}))).toBe(true);
    expect(egressFor(e2bNetwork({ allow_internet_access: true }))).toBe(true);
  });

  it('gives none without internet access or when all traffic is denied, unless allowOut names some', () => {
    expect(egressFor(e2bNetwork({ allow_internet_access: false }))).toBe(false);
    expect(egressFor(e2bNetwork({ network: { denyOut: [ALL_TRAFFIC] } }))).toBe(false);
    expect(
      egressFor(e2bNetwork({ network: { denyOut: [ALL_TRAFFIC], allowOut: ['1.1.1.1', 'example.com'] } })),
    ).toEqual({
      allow: ['1.1.1.1', 'example.com'],
    });
    expect(egressFor(e2bNetwork({ allow_internet_access: false, network: { allowOut: ['8.8.8.0/24'] } }))).toEqual({
      allow: ['8.8.8.0/24'],
    });
  });

  it('lets allowOut win over denyOut, by taking its prefixes out of the deny list', () => {
    expect(egressFor(e2bNetwork({ network: { denyOut: ['8.8.8.0/24'] } }))).toEqual({ deny: ['8.8.8.0/24'] });
    expect(egressFor(e2bNetwork({ network: { denyOut: ['8.8.8.8'], allowOut: ['8.8.8.0/24'] } }))).toBe(true);
    const left = egressFor(e2bNetwork({ network: { denyOut: ['10.0.0.0/30'], allowOut: ['10.0.0.1'] } }));
    expect(left).toEqual({ deny: ['10.0.0.2/31', '10.0.0.0'] });
    const big = egressFor(e2bNetwork({ network: { denyOut: ['10.0.0.0/8'], allowOut: ['10.1.2.3'] } })) as {
      deny: string[];
    };
    expect(big.deny).toHaveLength(24);
    expect(big.deny).not.toContain('10.1.2.3');
  });

  it('refuses what E2B refuses', () => {
    expect(() => e2bNetwork({ network: { denyOut: ['example.com'] } })).toThrow(/host name/);
    expect(() => e2bNetwork({ network: { allowOut: 'x' } })).toThrow(/list of strings/);
    expect(() => e2bNetwork({ allow_internet_access: 'yes' })).toThrow(/true or false/);
    expect(() => egressFor(e2bNetwork({ network: { allowOut: ['1.2.3.4/40'] } }))).toThrow(/not an IPv4/);
  });
});
