/**
 * A sandbox's own calls: pause, resume, stop, start, timeout, labels, snapshots, one-shot exec (its create, get,
 * list and destroy are routes-shared.ts's). A daemon serves them; a gateway passes them to the
 * sandbox's node (sandbox-calls.ts).
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import { servedBy, type SandboxCalls } from './sandbox-calls.js';
import {
  ExecBody,
  ExecResultView,
  IdParams,
  LabelsBody,
  SandboxView,
  SnapshotBody,
  TimeoutBody,
  errors,
} from './schemas.js';
import { execView } from './exec-view.js';
import type { StateVerb } from './daemon.js';
import type { OnTimeout } from '../sdk/api.js';

const tags = ['sandboxes'];

export async function sandboxRoutes(app: FastifyInstance, s: SandboxCalls): Promise<void> {
  stateRoutes(app, s);
  controlRoutes(app, s);
  usageRoute(app, s);
  execAndSnapshotRoutes(app, s);
}

/**
 * The calls that change what runs in a sandbox, each answered with the sandbox as it is after
 * (the daemon's `changeState`): what the OpenAPI document says of each.
 */
const STATE_CALLS: Record<StateVerb, string> = {
  pause: 'Freeze every process (its timeout clock stops)',
  resume: 'Thaw it (its timeout starts again)',
  stop: 'Halt every process and keep its filesystem, user namespace range and address (its timeout clock stops); 409 SANDBOX_STOPPED when it is stopped already',
  start:
    'Raise a stopped sandbox again on its volume under the same id: new processes, the files it had (its timeout starts again); 409 SANDBOX_RUNNING when it runs or is paused',
};

/** Pause, resume, stop (its filesystem kept) and start (a fresh boot on it, under the same id). */
function stateRoutes(app: FastifyInstance, s: SandboxCalls): void {
  for (const [verb, summary] of Object.entries(STATE_CALLS) as [StateVerb, string][])
    app.post(
      `/sandboxes/:id/${verb}`,
      {
        schema: { tags, summary, params: IdParams, response: { 200: SandboxView, ...errors } },
      },
      servedBy(
        s,
        (d) => async (req) => d.view(await d.changeState(verb, (req.params as { id: string }).id, req.caller)),
      ),
    );
}

/** One sandbox's use now (the Lab API's `sandbox.usage()`). */
function usageRoute(app: FastifyInstance, s: SandboxCalls): void {
  app.get(
    '/sandboxes/:id/usage',
    {
      schema: {
        tags,
        summary:
          'Its memory, CPU time and processes (from its cgroup) and disk (from its storage) now, with the CPUs, memory and disk it may use',
        params: IdParams,
        response: { 200: Type.Object({}, { additionalProperties: true }), ...errors },
      },
    },
    servedBy(s, (d) => async (req) => (await d.sandbox((req.params as { id: string }).id, req.caller)).usage()),
  );
}

/** Timeout, labels. */
function controlRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.post(
    '/sandboxes/:id/timeout',
    {
      schema: {
        tags,
        summary: 'Set its timeout from now (0: none)',
        params: IdParams,
        body: TimeoutBody,
        response: { 200: SandboxView, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const b = req.body as { timeoutS: number; onTimeout?: OnTimeout };
      return d.view(await d.setTimeout((req.params as { id: string }).id, b.timeoutS, b.onTimeout, req.caller));
    }),
  );

  app.patch(
    '/sandboxes/:id',
    {
      schema: {
        tags,
        summary: 'Replace its labels and/or metadata',
        params: IdParams,
        body: LabelsBody,
        response: { 200: SandboxView, ...errors },
      },
    },
    servedBy(s, (d) => async (req) => {
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      await box.setLabels(req.body as { labels?: Record<string, string> });
      return d.view(box);
    }),
  );
}

function execAndSnapshotRoutes(app: FastifyInstance, s: SandboxCalls): void {
  app.post(
    '/sandboxes/:id/exec',
    {
      schema: {
        tags,
        summary:
          'Run a command and return its result; its deadline (timeoutMs) kills its whole process group, and so does the client going away',
        params: IdParams,
        body: ExecBody,
        response: { 200: ExecResultView, ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const b = req.body as ExecBody;
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      const opts = {
        env: b.env,
        cwd: b.cwd,
        user: b.user,
        timeoutMs: b.timeoutMs,
        ...(b.stdin !== undefined ? { stdin: Buffer.from(b.stdin, b.encoding ?? 'utf8') } : {}),
      };
      // the client went before its answer: the command is killed (nobody could read its result)
      const r = await d.runExec(req.caller, box, b.argv, opts, 'oneshot', (p) =>
        reply.raw.once('close', () => {
          if (!reply.raw.writableFinished) p.kill(9);
        }),
      );
      return execView(r, b.encoding);
    }),
  );

  app.post(
    '/sandboxes/:id/snapshots',
    {
      schema: {
        tags: ['snapshots'],
        summary: 'Snapshot its filesystem (and memory, VM driver: memory: true)',
        params: IdParams,
        body: SnapshotBody,
        response: { 201: Type.Object({}, { additionalProperties: true }), ...errors },
      },
    },
    servedBy(s, (d) => async (req, reply) => {
      const b = req.body as { name: string; memory?: boolean };
      const box = await d.sandbox((req.params as { id: string }).id, req.caller);
      const snap = await d.snapshotOf(req.caller, box, b.name, { memory: b.memory });
      req.opId = snap.lastTrace?.id ?? null;
      return reply.status(201).send(snap.toJSON());
    }),
  );
}
