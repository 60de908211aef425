/**
 * The API's JSON schemas (TypeBox): they validate requests and they are the OpenAPI document
 * (/openapi.json, through @fastify/swagger), so the two cannot drift apart.
 */
import { Type, type Static } from 'typebox';
import { DAEMON_DEFAULTS, DEFAULT_DRIVER, DEFAULT_IMAGE, DEFAULT_ON_TIMEOUT, ON_TIMEOUT_ACTIONS } from '../defaults.js';
import { DRIVER_NAMES } from '../drivers/registry.js';

/** a driver's name: the registry's list, so that a new driver is in the API's schema (and OpenAPI) at once */
const DriverName = (description = `machine driver (default ${DEFAULT_DRIVER})`) =>
  Type.Union(
    DRIVER_NAMES.map((n) => Type.Literal(n)),
    { description },
  );

/** what the end of a timeout does: the defaults' list, so that the schema (and OpenAPI) says every one */
const OnTimeout = Type.Union(
  ON_TIMEOUT_ACTIONS.map((a) => Type.Literal(a)),
  {
    description: `at the end of its timeout: kill (destroy it), pause (freeze it, memory kept) or stop (its processes end, its files are kept) (default ${DEFAULT_ON_TIMEOUT})`,
  },
);

const open = { additionalProperties: true } as const;

export const ErrorBody = Type.Object(
  {
    code: Type.String({ description: 'a SnaplabError code, e.g. SANDBOX_NOT_FOUND' }),
    message: Type.String(),
    hint: Type.Optional(Type.String()),
    operationId: Type.Optional(Type.String({ description: 'the trace of the failed operation: GET /traces/{id}' })),
    limit: Type.Optional(Type.String({ description: '429: which quota' })),
  },
  open,
);

const StringMap = Type.Record(Type.String(), Type.String());

/** Where a cluster gateway places a sandbox, or runs a change made on each node; a single daemon refuses it (it has no nodes). */
const Placement = Type.Optional(
  Type.Object(
    { labels: Type.Optional(StringMap) },
    { additionalProperties: false, description: "a cluster gateway's: on the nodes with these labels (default: all)" },
  ),
);

export const Limits = Type.Object(
  {
    memoryBytes: Type.Optional(Type.Integer({ minimum: 1 })),
    pids: Type.Optional(Type.Integer({ minimum: 1 })),
    cpus: Type.Optional(Type.Number({ minimum: 0.01 })),
    diskBytes: Type.Optional(
      Type.Integer({ minimum: 0, description: 'most the machine may write beyond its image (0: no cap)' }),
    ),
  },
  { additionalProperties: false },
);

const EgressEntries = Type.Array(Type.String({ maxLength: 253 }), {
  maxItems: 4096,
  description: 'IPv4 addresses, prefixes or host names, e.g. 203.0.113.7, 198.51.100.0/24 or deb.debian.org',
});
/** A machine's egress lists (docs/egress.md): deny wins over allow; with an allow list nothing else passes. */
export const EgressBody = Type.Object(
  { allow: Type.Optional(EgressEntries), deny: Type.Optional(EgressEntries) },
  { additionalProperties: false },
);
export const EgressUsageView = Type.Object(
  {
    address: Type.String(),
    allow: Type.Array(Type.String()),
    deny: Type.Array(Type.String()),
    bytesOut: Type.Integer(),
    connections: Type.Integer(),
    denied: Type.Integer(),
  },
  { additionalProperties: false },
);

export const CreateBody = Type.Object(
  {
    image: Type.Optional(Type.String({ description: `image name (default ${DEFAULT_IMAGE})` })),
    snapshot: Type.Optional(Type.String({ description: 'restore this snapshot instead' })),
    pool: Type.Optional(Type.String({ description: 'take a ready standby of this pool instead' })),
    name: Type.Optional(Type.String()),
    storage: Type.Optional(Type.Union([Type.Literal('btrfs'), Type.Literal('overlay'), Type.Literal('dir')])),
    driver: Type.Optional(DriverName()),
    limits: Type.Optional(Limits),
    userns: Type.Optional(Type.Boolean()),
    ids: Type.Optional(
      Type.Integer({
        minimum: 1024,
        maximum: 65536,
        description: 'ids of its user namespace, a power of two (default 65536; docs/architecture.md "Ranges")',
      }),
    ),
    init: Type.Optional(Type.Union([Type.Literal('agent'), Type.Literal('systemd')])),
    labels: Type.Optional(StringMap),
    metadata: Type.Optional(StringMap),
    timeoutS: Type.Optional(
      Type.Integer({
        minimum: 0,
        description: `TTL in seconds from now (0: none; default: the daemon's --default-timeout, ${DAEMON_DEFAULTS.defaultTimeoutS})`,
      }),
    ),
    onTimeout: Type.Optional(OnTimeout),
    egress: Type.Optional(
      Type.Union([Type.Boolean(), EgressBody], {
        description: 'outbound network: true, or allow/deny lists (default: none, loopback only; docs/egress.md)',
      }),
    ),
    placement: Placement,
  },
  { additionalProperties: false },
);
export type CreateBody = Static<typeof CreateBody>;

export const SandboxView = Type.Object(
  {
    id: Type.String(),
    name: Type.String(),
    state: Type.String(),
    stopped: Type.Optional(
      Type.Boolean({ description: 'stopped (POST /sandboxes/{id}/stop): dead, its filesystem kept for a start' }),
    ),
    reason: Type.Union([Type.String(), Type.Null()]),
    image: Type.String(),
    storage: Type.String(),
    driver: Type.String(),
    labels: StringMap,
    metadata: StringMap,
    owner: Type.Union([Type.String(), Type.Null()]),
    timeoutS: Type.Integer(),
    onTimeout: Type.String(),
    expiresAt: Type.Union([Type.String(), Type.Null()]),
    createdAt: Type.String(),
  },
  open,
);

export const IdParams = Type.Object({ id: Type.String() });

export const ExecBody = Type.Object(
  {
    argv: Type.Array(Type.String(), { minItems: 1 }),
    env: Type.Optional(StringMap),
    cwd: Type.Optional(Type.String()),
    user: Type.Optional(Type.String()),
    timeoutMs: Type.Optional(
      Type.Integer({
        minimum: 0,
        description: `deadline: kills the command's process group (0: none; default: the daemon's --exec-timeout, ${DAEMON_DEFAULTS.execTimeoutMs})`,
      }),
    ),
    stdin: Type.Optional(Type.String({ description: 'input, as text (or base64 with encoding: base64)' })),
    encoding: Type.Optional(
      Type.Union([Type.Literal('utf8'), Type.Literal('base64')], {
        description: 'of stdin and of the output in the result',
      }),
    ),
  },
  { additionalProperties: false },
);
export type ExecBody = Static<typeof ExecBody>;

export const ExecResultView = Type.Object(
  {
    exitCode: Type.Integer(),
    signal: Type.Union([Type.Integer(), Type.Null()]),
    timedOut: Type.Boolean(),
    notFound: Type.Boolean(),
    oomKilled: Type.Boolean(),
    truncated: Type.Boolean(),
    stdout: Type.String(),
    stderr: Type.String(),
    encoding: Type.String(),
    usage: Type.Object({
      wallMs: Type.Number(),
      userMs: Type.Number(),
      systemMs: Type.Number(),
      maxRssKb: Type.Number(),
    }),
  },
  open,
);

export const ProcessBody = Type.Object(
  {
    argv: Type.Array(Type.String(), { minItems: 1 }),
    tag: Type.Optional(Type.String({ maxLength: 1024 })),
    env: Type.Optional(StringMap),
    cwd: Type.Optional(Type.String()),
    user: Type.Optional(Type.String()),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 0 })),
    tty: Type.Optional(
      Type.Object({
        cols: Type.Integer({ minimum: 1, maximum: 65535 }),
        rows: Type.Integer({ minimum: 1, maximum: 65535 }),
      }),
    ),
    stdin: Type.Optional(Type.Boolean({ description: 'keep stdin open for the attach stream (else /dev/null)' })),
    waitOutput: Type.Optional(
      Type.Boolean({
        description:
          'its end waits for the end of its output: what it left in the background writing there is read until it closes it (default false)',
      }),
    ),
    keep: Type.Optional(
      Type.Boolean({
        description:
          "the machine's agent keeps it past its connection, so it outlives the daemon (default: true for a background process, false for a streamed exec)",
      }),
    ),
  },
  { additionalProperties: false },
);
export type ProcessBody = Static<typeof ProcessBody>;

export const SnapshotBody = Type.Object(
  { name: Type.String(), memory: Type.Optional(Type.Boolean()) },
  { additionalProperties: false },
);
export const TimeoutBody = Type.Object(
  {
    timeoutS: Type.Integer({ minimum: 0 }),
    onTimeout: Type.Optional(OnTimeout),
  },
  { additionalProperties: false },
);
export const LabelsBody = Type.Object(
  { labels: Type.Optional(StringMap), metadata: Type.Optional(StringMap) },
  { additionalProperties: false },
);
export const PathQuery = Type.Object({ path: Type.String({ minLength: 1 }), user: Type.Optional(Type.String()) });

export const PoolBody = Type.Object(
  {
    name: Type.String(),
    image: Type.Optional(Type.String()),
    size: Type.Integer({ minimum: 0 }),
    limits: Type.Optional(Limits),
    storage: Type.Optional(Type.Union([Type.Literal('btrfs'), Type.Literal('overlay'), Type.Literal('dir')])),
    driver: Type.Optional(DriverName()),
    recycle: Type.Optional(Type.Boolean()),
    userns: Type.Optional(Type.Boolean()),
    egress: Type.Optional(
      Type.Union([Type.Boolean(), EgressBody], { description: "its standbys' outbound network, as a create's" }),
    ),
    warm: Type.Optional(
      Type.Literal('interpreter', {
        description:
          "what each standby starts before it waits: the code interpreter's server and kernel (never recycled)",
      }),
    ),
    placement: Placement,
  },
  { additionalProperties: false },
);

export const RunBody = Type.Object(
  {
    argv: Type.Array(Type.String()),
    env: Type.Optional(StringMap),
    cwd: Type.Optional(Type.String()),
    user: Type.Optional(Type.String()),
    timeoutMs: Type.Optional(Type.Integer({ minimum: 0 })),
    stdin: Type.Optional(Type.String()),
    encoding: Type.Optional(Type.Union([Type.Literal('utf8'), Type.Literal('base64')])),
  },
  { additionalProperties: false },
);
export type RunBody = Static<typeof RunBody>;

export const ImportBody = Type.Object(
  { source: Type.String({ description: "a path on the daemon's host" }), name: Type.String(), placement: Placement },
  { additionalProperties: false },
);
export const BuildBody = Type.Object(
  {
    spec: Type.Record(Type.String(), Type.Unknown(), { description: 'as `image build` takes (docs/images.md)' }),
    name: Type.Optional(Type.String()),
    placement: Placement,
  },
  { additionalProperties: false },
);
export const ScenarioBody = Type.Object(
  {
    file: Type.String({ description: "a scenario file on the daemon's host" }),
    name: Type.Optional(Type.String()),
    driver: Type.Optional(DriverName(`the driver of machines whose file names none (default ${DEFAULT_DRIVER})`)),
    placement: Placement,
  },
  { additionalProperties: false },
);
export const KeyBody = Type.Object(
  {
    name: Type.String(),
    scopes: Type.Optional(Type.Array(Type.String())),
    maxSandboxes: Type.Optional(Type.Integer({ minimum: 0 })),
    maxExecs: Type.Optional(Type.Integer({ minimum: 0 })),
    /** what its sandboxes may ask (docs/api.md#ceilings): null lifts one, not named is the default */
    ceilings: Type.Optional(
      Type.Object(
        {
          memoryBytes: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          pids: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          cpus: Type.Optional(Type.Union([Type.Number({ minimum: 0 }), Type.Null()])),
          diskBytes: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          totalMemoryBytes: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          totalDiskBytes: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          snapshots: Type.Optional(Type.Union([Type.Integer({ minimum: 1 }), Type.Null()])),
          egress: Type.Optional(
            Type.Boolean({ description: 'false: its sandboxes may not have egress (docs/egress.md); default true' }),
          ),
        },
        { additionalProperties: false },
      ),
    ),
  },
  { additionalProperties: false },
);

/** The error responses every route may give. */
export const errors = {
  400: ErrorBody,
  401: ErrorBody,
  403: ErrorBody,
  404: ErrorBody,
  409: ErrorBody,
  429: ErrorBody,
  500: ErrorBody,
};
