/**
 * E2B's snapshots (`sandbox.createSnapshot`, `Sandbox.listSnapshots`, `Sandbox.deleteSnapshot`, and
 * `Sandbox.create(snapshotId)`) as the Lab API's snapshots of the caller's key: `POST
 * /sandboxes/{id}/snapshots`, `GET /snapshots`, `DELETE /templates/{id}`. E2B names a snapshot
 * `[namespace/]alias:tag` (tag `default` unless given); here its snaplab name is the alias, or
 * `alias.tag` for another tag (an E2B alias has no dot), and one made without a name is named by a
 * fresh id, as E2B's are. A sandbox's snapshot keeps its files; a VM's (`--driver qemu`) its memory
 * too, as E2B's does: a create from it resumes its processes. A namespace machine's processes
 * start afresh on the files (docs/e2b.md).
 */
import { randomBytes } from 'node:crypto';
import type { FastifyInstance, FastifyReply, FastifyRequest } from 'fastify';
import type { SandboxApi, SnapshotApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import type { E2bState } from './state.js';
import { jsonBody } from './control.js';
import { DEFAULT_TAG, idOf, nameOf, parseRef } from './snapshot-names.js';
import { orElse } from '../cleanup.js';

/** E2B's SnapshotInfo: its id, and the names it goes by (none for one made without a name). */
function infoOf(snap: SnapshotApi, named: boolean): { snapshotID: string; names: string[] } {
  const id = idOf(snap.name);
  return { snapshotID: id, names: named ? [id] : [] };
}

/** A name of E2B's fresh ids' shape: 20 lowercase letters and digits. */
const freshId = (): string => [...randomBytes(20)].map((b) => 'abcdefghijklmnopqrstuvwxyz0123456789'[b % 36]).join('');

/**
 * POST /sandboxes/{id}/snapshots {name?}: the sandbox's files (a VM's memory too) as a snapshot
 * of the key's; the sandbox runs on. A name the key has already is taken again by this one, as
 * E2B's tag moves to the new build; one another key has is refused (409: names are the daemon's).
 */
async function create(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const body = jsonBody(req) as { name?: unknown };
  if (body.name !== undefined && body.name !== null && typeof body.name !== 'string')
    throw new SnaplabError('BAD_INPUT', 'name must be a string', 'e.g. {"name": "my-snapshot"}');
  // lowercased, as E2B keeps a name
  const ref =
    typeof body.name === 'string' ? parseRef(body.name.toLowerCase()) : { alias: freshId(), tag: DEFAULT_TAG };
  if (!ref)
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid name: ${JSON.stringify(body.name)}`,
      'name it ALIAS or ALIAS:TAG (letters, digits, "-" and "_"; a tag may have "." too)',
    );
  const box = await lab.get((req.params as { id: string }).id);
  const name = nameOf(ref);
  const take = (): Promise<SnapshotApi> => box.snapshot(name, { memory: memoryOf(box) });
  const snap = await take().catch(async (e: unknown) => {
    // the name moves only from the key's own snapshot (not the host's, not another key's, which an
    // admin key sees too), and only from a sandbox that can be taken now: the old one goes first
    if (!isSnaplabError(e, 'SNAPSHOT_EXISTS')) throw e;
    const me = (await lab.whoami()).key;
    const old = (await lab.snapshots()).find((s) => s.name === name);
    if (old?.toJSON().owner !== me || !['running', 'paused'].includes(box.state))
      throw new SnaplabError(
        'SNAPSHOT_EXISTS',
        `a snapshot named ${JSON.stringify(body.name)} exists and is not this key's to replace`,
        'give another name',
      );
    await lab.removeSnapshot(name);
    return take();
  });
  return reply.code(201).send(infoOf(snap, typeof body.name === 'string'));
}

/** A VM's snapshot keeps its memory (its processes resume from it, as E2B's do); a namespace machine's cannot. */
const memoryOf = (box: SandboxApi): boolean => box.driver === 'qemu';

/**
 * GET /snapshots?sandboxID&name&limit&nextToken: the snapshots the key may see (its own, and the
 * host's, made without a key), newest first; `sandboxID` those of that sandbox while it is there
 * (a snapshot names its sandbox by name), `name` those of that alias (any tag) or that
 * `alias:tag`; X-Next-Token pages by position (the last one's time and name), so a page's
 * snapshots removed before the next page is asked for move nothing.
 */
async function list(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const q = req.query as Record<string, string | undefined>;
  // (not a VM pool's own template, `_pool.…`: snaplab's, no user's)
  let snaps = (await lab.snapshots()).filter((s) => !s.name.startsWith('_'));
  if (q.sandboxID) {
    const box = await lab
      .get(q.sandboxID)
      .catch(orElse(undefined, 'find the sandbox a snapshot list names', 'SANDBOX_NOT_FOUND'));
    snaps = box ? snaps.filter((s) => s.toJSON().sandbox === box.name) : [];
  }
  if (q.name) {
    const ref = parseRef(q.name);
    const exact = q.name.includes(':');
    snaps = ref ? snaps.filter((s) => (exact ? s.name === nameOf(ref) : idOf(s.name).split(':')[0] === ref.alias)) : [];
  }
  const keyOf = (s: SnapshotApi): [string, string] => [String(s.toJSON().createdAt), s.name];
  // newest first, then by name
  const before = (a: [string, string], b: [string, string]): boolean => a[0] > b[0] || (a[0] === b[0] && a[1] < b[1]);
  snaps.sort((a, b) => (before(keyOf(a), keyOf(b)) ? -1 : before(keyOf(b), keyOf(a)) ? 1 : 0));
  const limit = q.limit === undefined ? 100 : Number(q.limit);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100)
    throw new SnaplabError('BAD_INPUT', 'limit must be 1 to 100', 'e.g. ?limit=50');
  const after = q.nextToken ? tokenKey(q.nextToken) : undefined;
  const rest = after ? snaps.filter((s) => before(after, keyOf(s))) : snaps;
  const page = rest.slice(0, limit);
  if (rest.length > limit)
    reply.header('x-next-token', Buffer.from(JSON.stringify(keyOf(page[page.length - 1]!))).toString('base64url'));
  return reply.send(page.map((s) => infoOf(s, true)));
}

/** A page's position from its token: the last snapshot's time and name. */
function tokenKey(token: string): [string, string] {
  try {
    const k = JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as unknown;
    if (Array.isArray(k) && k.length === 2 && k.every((x) => typeof x === 'string')) return k as [string, string];
  } catch {
    // said below
  }
  throw new SnaplabError('BAD_INPUT', 'nextToken is not one this list gave', 'list again from the start');
}

/** DELETE /templates/{id}: a snapshot of the key's removed (204), else 404 (the SDK's false). */
async function remove(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const id = (req.params as { id: string }).id;
  const ref = parseRef(id);
  if (!ref) throw new SnaplabError('SNAPSHOT_NOT_FOUND', `no snapshot ${JSON.stringify(id)}`, 'list them');
  await lab.removeSnapshot(nameOf(ref));
  return reply.code(204).send();
}

export function registerSnapshots(app: FastifyInstance, state: E2bState): void {
  app.post('/sandboxes/:id/snapshots', (req, reply) => create(state, req, reply));
  app.get('/snapshots', (req, reply) => list(state, req, reply));
  app.delete('/templates/:id', (req, reply) => remove(state, req, reply));
}
