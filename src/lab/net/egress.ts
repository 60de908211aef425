/**
 * A sandbox's egress as the lab keeps it (docs/egress.md): its record's slot and lists, the
 * router's rules and counters (host/net/egress.ts), changed together.
 */
import { SnaplabError } from '../../errors.js';
import { egressCounters, pinNames, setEgressLists, sweepFlows, underEgressLock } from '../../host/net/egress.js';
import { checkLists, newMark, slotAddress } from '../../host/net/egress-rules.js';
import type { EgressRequest, EgressUsage, EgressView } from '../../sdk/api.js';
import type { SandboxRecord } from '../../store/records.js';
import type { LabContext } from '../context.js';

export function egressView(r: SandboxRecord): EgressView | null {
  if (!r.egress) return null;
  return { address: slotAddress(r.egress.slot), allow: r.egress.allow, deny: r.egress.deny };
}

function egressOf(r: SandboxRecord): NonNullable<SandboxRecord['egress']> {
  if (!r.egress)
    throw new SnaplabError(
      'EGRESS_OFF',
      `sandbox ${r.name} has no egress (it reaches loopback only)`,
      'egress is chosen at create: `snaplab create --egress` (docs/egress.md)',
    );
  return r.egress;
}

/**
 * New lists for a running machine. Names are resolved first (they may be slow); then, under the
 * home's egress lock, the record is read again: a sandbox removed meanwhile, whose slot another
 * may hold by now, is not changed (SANDBOX_NOT_FOUND). `fresh`: a standby handed to its next user
 * (a new holder's mark, counters from zero).
 */
async function applyLists(ctx: LabContext, r: SandboxRecord, req: EgressRequest, fresh = false): Promise<EgressView> {
  const e = egressOf(r);
  const lists = checkLists(req);
  const pinned = await pinNames(lists);
  await underEgressLock(ctx.home, async () => {
    const now = ctx.store.getSandbox(r.id);
    if (!now || now.id !== r.id || now.egress?.slot !== e.slot)
      throw new SnaplabError('SANDBOX_NOT_FOUND', `sandbox ${r.name} is gone`, 'its egress went with it');
    const mark = now.egress.mark;
    const next = fresh ? newMark() : mark;
    await setEgressLists(ctx.home, e.slot, pinned, { mark, ...(fresh ? { newMark: next } : {}) });
    ctx.store.setSandboxEgress(r.id, { ...lists, mark: next });
    r.egress = { ...e, ...lists, mark: next };
  });
  return egressView(r)!;
}

/** New lists for a running machine: every packet meets them from now on. */
export const changeEgress = (ctx: LabContext, r: SandboxRecord, req: EgressRequest): Promise<EgressView> =>
  applyLists(ctx, r, req);

/** A recycled standby's egress as its pool gives it: the pool's lists, a new holder, counters from zero. */
export async function resetEgress(
  ctx: LabContext,
  r: SandboxRecord,
  lists: { allow: string[]; deny: string[] },
): Promise<void> {
  await applyLists(ctx, r, lists, true);
}

export async function egressUsage(ctx: LabContext, r: SandboxRecord): Promise<EgressUsage> {
  const e = egressOf(r);
  const c = (await egressCounters(ctx.home)).get(e.slot) ?? { bytesOut: 0, connections: 0, denied: 0 };
  return { ...egressView(r)!, ...c };
}

/** Every machine's counters summed, and how many machines have egress (one read of the router). */
export async function egressTotals(
  ctx: LabContext,
): Promise<{ machines: number; bytesOut: number; connections: number; denied: number }> {
  const slots = ctx.store.egressSlots();
  const t = { machines: slots.size, bytesOut: 0, connections: 0, denied: 0 };
  if (!slots.size) return t;
  for (const [slot, c] of await egressCounters(ctx.home)) {
    if (!slots.has(slot)) continue;
    t.bytesOut += c.bytesOut;
    t.connections += c.connections;
    t.denied += c.denied;
  }
  return t;
}

/**
 * What the uplink's (the host's) connection table holds of this home's router that the router's
 * own no longer does, removed (host/net/egress-router.ts sweepFlows): a daemon does it every
 * minute, gc at each run. Nothing when the home has no router (a router outlives its last machine
 * until gc, and that machine's flows with it). Returns how many went.
 */
export function sweepEgress(ctx: LabContext): Promise<number> {
  return sweepFlows(ctx.home);
}
