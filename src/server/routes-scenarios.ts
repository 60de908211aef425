/**
 * Scenarios (docs/scenarios.md), served by a single daemon and a cluster gateway alike over a
 * RouteHost (served-lab.ts): a daemon's on its host, a cluster's each on one node.
 */
import type { FastifyInstance } from 'fastify';
import { Type } from 'typebox';
import type { NetFault, RouteHost } from './served-lab.js';
import { ScenarioBody, errors } from './schemas.js';

const any = Type.Object({}, { additionalProperties: true });
const NameParams = Type.Object({ name: Type.String() });

export function scenarioRoutesOf(app: FastifyInstance, h: RouteHost): void {
  scenarioRoutes(app, h);
  scenarioControlRoutes(app, h);
}

function scenarioRoutes(app: FastifyInstance, h: RouteHost): void {
  app.get(
    '/scenarios',
    { schema: { tags: ['scenarios'], response: { 200: Type.Array(any), ...errors } } },
    async (req) => h.scenariosFor(req.caller).list(),
  );
  app.get(
    '/scenarios/:name',
    {
      schema: { tags: ['scenarios'], params: NameParams, response: { 200: any, ...errors } },
    },
    async (req) => h.scenariosFor(req.caller).status((req.params as { name: string }).name),
  );
  app.post(
    '/scenarios',
    {
      schema: {
        tags: ['scenarios'],
        summary: "Raise a scenario file on the daemon's host (returns an operation)",
        body: ScenarioBody,
        response: { 202: any, ...errors },
      },
    },
    async (req, reply) =>
      reply
        .status(202)
        .send(await h.scenariosFor(req.caller).up(req.body as { file: string; name?: string; driver?: string })),
  );
  app.delete(
    '/scenarios/:name',
    {
      schema: { tags: ['scenarios'], params: NameParams, response: { 200: any, ...errors } },
    },
    async (req) => h.scenariosFor(req.caller).down((req.params as { name: string }).name),
  );
}

/** `standby` of a scenario snapshot or reset: 0, none (the machines raised again); 1, the scenario's standby. */
const Standby = Type.Union([Type.Literal(0), Type.Literal(1)]);

/** Snapshot, reset and network faults of a running scenario. */
function scenarioControlRoutes(app: FastifyInstance, h: RouteHost): void {
  app.post(
    '/scenarios/:name/snapshot',
    {
      schema: {
        tags: ['scenarios'],
        params: NameParams,
        body: Type.Object({ name: Type.String(), standby: Type.Optional(Standby) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) => {
      const b = req.body as { name: string; standby?: 0 | 1 };
      return h
        .scenariosFor(req.caller)
        .snapshot((req.params as { name: string }).name, b.name, b.standby === undefined ? {} : { standby: b.standby });
    },
  );
  app.post(
    '/scenarios/:name/reset',
    {
      schema: {
        tags: ['scenarios'],
        params: NameParams,
        body: Type.Object({ to: Type.Optional(Type.String()), standby: Type.Optional(Standby) }),
        response: { 200: any, ...errors },
      },
    },
    async (req) => {
      const b = (req.body ?? {}) as { to?: string; standby?: 0 | 1 };
      return h
        .scenariosFor(req.caller)
        .reset((req.params as { name: string }).name, b.to, b.standby === undefined ? {} : { standby: b.standby });
    },
  );
  app.post(
    '/scenarios/:name/net',
    {
      schema: {
        tags: ['scenarios'],
        summary: 'Network faults: block/unblock two machines, partition into groups, heal',
        params: NameParams,
        body: Type.Object({
          action: Type.Union([
            Type.Literal('block'),
            Type.Literal('unblock'),
            Type.Literal('partition'),
            Type.Literal('heal'),
          ]),
          machines: Type.Optional(Type.Array(Type.String())),
          groups: Type.Optional(Type.Array(Type.Array(Type.String()))),
        }),
        response: { 204: Type.Null(), ...errors },
      },
    },
    async (req, reply) => {
      await h.scenariosFor(req.caller).net((req.params as { name: string }).name, req.body as NetFault);
      return reply.status(204).send();
    },
  );
}
