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
import type { KeyedLabApi, SandboxApi, SnapshotApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError } from '../errors.js';
import { defaultName } from '../names.js';
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
  const ref = typeof body.name === 'string' ? parseRef(body.name) : { alias: freshId(), tag: DEFAULT_TAG };
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
    if (!isSnaplabError(e, 'SNAPSHOT_EXISTS') || !(await lab.snapshots()).some((s) => s.name === name)) throw e;
    await lab.removeSnapshot(name);
    return take();
  });
  return reply.code(201).send(infoOf(snap, typeof body.name === 'string'));
}

/** A VM's snapshot keeps its memory (its processes resume from it, as E2B's do); a namespace machine's cannot. */
const memoryOf = (box: SandboxApi): boolean => box.driver === 'qemu';

/**
 * GET /snapshots?sandboxID&name&limit&nextToken: the key's snapshots, newest first; `sandboxID`
 * those of that sandbox (by its name, the default one of its id while it is gone), `name` those of
 * that alias (any tag) or that `alias:tag`; X-Next-Token pages.
 */
async function list(state: E2bState, req: FastifyRequest, reply: FastifyReply): Promise<FastifyReply> {
  const lab = await state.lab(req);
  const q = req.query as Record<string, string | undefined>;
  // (not a VM pool's own template, `_pool.…`: snaplab's, no user's)
  let snaps = (await lab.snapshots()).filter((s) => !s.name.startsWith('_'));
  if (q.sandboxID) {
    const names = await namesOf(lab, q.sandboxID);
    snaps = snaps.filter((s) => names.has(String(s.toJSON().sandbox)));
  }
  if (q.name) {
    const ref = parseRef(q.name);
    const exact = q.name.includes(':');
    snaps = ref ? snaps.filter((s) => (exact ? s.name === nameOf(ref) : idOf(s.name).split(':')[0] === ref.alias)) : [];
  }
  const createdAt = (s: SnapshotApi): string => String(s.toJSON().createdAt);
  snaps.sort((a, b) => createdAt(b).localeCompare(createdAt(a)) || a.name.localeCompare(b.name));
  const limit = q.limit === undefined ? 100 : Number(q.limit);
  if (!Number.isInteger(limit) || limit < 1 || limit > 100)
    throw new SnaplabError('BAD_INPUT', 'limit must be 1 to 100', 'e.g. ?limit=50');
  const from = q.nextToken ? snaps.findIndex((s) => s.name === q.nextToken) + 1 : 0;
  if (q.nextToken && from === 0)
    throw new SnaplabError('BAD_INPUT', 'nextToken is not one this list gave', 'list again from the start');
  const page = snaps.slice(from, from + limit);
  if (from + limit < snaps.length) reply.header('x-next-token', page[page.length - 1]!.name);
  return reply.send(page.map((s) => infoOf(s, true)));
}

/** The names a sandbox's snapshots give as theirs: its own while it is there, and its default one. */
async function namesOf(lab: KeyedLabApi, id: string): Promise<Set<string>> {
  const names = new Set([/^[0-9a-f]{6}/.test(id) ? defaultName(id) : id]);
  const box = await lab.get(id).catch(orElse(undefined, 'find the sandbox a snapshot list names', 'SANDBOX_NOT_FOUND'));
  if (box) names.add(box.name);
  return names;
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
