import { posix } from 'node:path';
import * as z from 'zod';
import type { Check } from './spec.js';
import { DEFAULT_CHECK_TIMEOUT_MS, DEFAULT_RUN_TIMEOUT_MS } from '../defaults.js';
import { DRIVER_NAMES } from '../drivers/registry.js';
import { parseDisk, parseDuration, parseMemory, parsePort, Problem } from './values.js';

/*
 * The file's shape. Values that need nothing but themselves (durations, sizes, ports, argv,
 * in-machine paths) are converted here, so that a bad one is reported at its own position;
 * what needs the whole file (names, networks, addresses, host files) is checked in build.ts.
 */

type Ctx = z.core.$RefinementCtx;

/** Run `fn`; a Problem it throws becomes an issue at this value. */
function conv<I, O>(fn: (v: I) => O) {
  return (v: I, ctx: Ctx): O => {
    try {
      return fn(v);
    } catch (e) {
      if (!(e instanceof Problem)) throw e;
      ctx.issues.push({ code: 'custom', message: e.message, input: v, params: { hint: e.hint } });
      return z.NEVER;
    }
  };
}

type Kind = 'string' | 'number' | 'boolean' | 'array' | 'object' | 'null';

function kindOf(v: unknown): Kind | 'other' {
  if (v === null || v === undefined) return 'null';
  if (Array.isArray(v)) return 'array';
  const t = typeof v;
  return t === 'string' || t === 'number' || t === 'boolean' || t === 'object' ? t : 'other';
}

/** Like a union, but picks the branch by the value's kind, so the branch's own errors survive. */
function byKind<T>(expected: string, branches: Partial<Record<Kind, z.ZodType<T>>>) {
  return z.unknown().transform((v, ctx): T => {
    const kind = kindOf(v);
    const branch = kind === 'other' ? undefined : branches[kind];
    if (!branch) {
      ctx.issues.push({ code: 'custom', message: `expected ${expected}`, input: v });
      return z.NEVER;
    }
    return pass(branch, v, ctx);
  });
}

/** A map told apart by which of some keys it has (a step has `copy` or `run`). */
function byKey<T>(expected: string, branches: Record<string, z.ZodType<T>>) {
  const names = Object.keys(branches);
  return z.unknown().transform((v, ctx): T => {
    const present = kindOf(v) === 'object' ? names.filter((k) => k in (v as object)) : [];
    if (present.length !== 1) {
      const message =
        present.length > 1 ? `${present.join(' and ')} in one item: give one per list item` : `expected ${expected}`;
      ctx.issues.push({ code: 'custom', message, input: v });
      return z.NEVER;
    }
    return pass(branches[present[0]!]!, v, ctx);
  });
}

function pass<T>(schema: z.ZodType<T>, v: unknown, ctx: Ctx): T {
  const r = schema.safeParse(v, { reportInput: true });
  if (r.success) return r.data;
  for (const issue of r.error.issues) ctx.issues.push(issue as unknown as z.core.$ZodRawIssue);
  return z.NEVER;
}

const str = (what = 'a string') => z.string({ error: `expected ${what}` });
const strOrNum = (what: string) => z.union([z.string(), z.number()], { error: `expected ${what}` });

const Duration = strOrNum('a duration such as 5s, 500ms, 2m or a number of seconds').transform(conv(parseDuration));
const Port = strOrNum('a port number').transform(conv(parsePort));

const ENV_KEY = /^[A-Za-z_][A-Za-z0-9_]*$/;

const Env = z
  .record(
    z.string(),
    z.union([z.string(), z.number(), z.boolean()], {
      error: 'expected a string (or a number or boolean, taken as text)',
    }),
  )
  .nullish()
  .transform((env, ctx): Record<string, string> => {
    const out: Record<string, string> = {};
    for (const [k, v] of Object.entries(env ?? {})) {
      if (!ENV_KEY.test(k)) {
        ctx.issues.push({
          code: 'custom',
          message: `invalid environment variable name ${JSON.stringify(k)}`,
          input: k,
          path: [k],
          params: { key: true, hint: 'use letters, digits and "_", not starting with a digit' },
        });
        continue;
      }
      out[k] = String(v);
    }
    return out;
  });

// YAML reads `[sleep, 1]` as a number: arguments that are numbers or booleans are taken as text.
const Arg = z
  .union([z.string(), z.number(), z.boolean()], { error: 'expected a string (one argument)' })
  .transform(String);
const Argv = z
  .array(Arg, { error: 'expected a list of arguments' })
  .min(1, { error: 'expected at least the program to run' });
const shell = (text: string): string[] => ['sh', '-c', text];
const ShellText = str('a shell command').min(1, { error: 'expected a shell command, not an empty string' });
const Command = byKind<string[]>('a shell command (a string) or an argv list', {
  string: ShellText.transform(shell),
  array: Argv,
});

/** An absolute path inside the machine, normalised. */
const MachinePath = str('an absolute path inside the machine').transform(
  conv((p: string) => {
    if (!p.startsWith('/'))
      throw new Problem(`${JSON.stringify(p)} is not an absolute path`, 'paths inside a machine start with /');
    return posix.normalize(p);
  }),
);

const RunObject = z
  .strictObject({ argv: Argv.optional(), sh: ShellText.optional(), timeout: Duration.optional(), env: Env })
  .transform((r, ctx) => {
    if ((r.argv === undefined) === (r.sh === undefined)) {
      ctx.issues.push({
        code: 'custom',
        message: 'a run map takes exactly one of argv (a list) or sh (a shell command)',
        input: r,
      });
      return z.NEVER;
    }
    return { argv: r.argv ?? shell(r.sh!), timeoutMs: r.timeout, env: r.env };
  });

type RunParts = { argv: string[]; timeoutMs?: number | undefined; env?: Record<string, string> };
const Run = byKind<RunParts>('a shell command (a string), an argv list, or a map with argv or sh', {
  string: ShellText.transform((t) => ({ argv: shell(t) })),
  array: Argv.transform((argv) => ({ argv })),
  object: RunObject,
});

export interface RawCopy {
  from: string;
  to: string;
  mode?: string | number | undefined;
}

export type RawStep = { copy: RawCopy } | { run: { argv: string[]; timeoutMs: number; env: Record<string, string> } };

const CopyStep = z.strictObject({
  copy: z.strictObject(
    {
      from: str('a host path (relative to the scenario file)').min(1),
      to: MachinePath,
      mode: strOrNum('a file mode such as 0644 or "0755"').optional(),
    },
    { error: 'expected a map with from, to and optionally mode' },
  ),
});

const RunStep = z.strictObject({ run: Run, timeout: Duration.optional(), env: Env }).transform((s, ctx): RawStep => {
  if (s.timeout !== undefined && s.run.timeoutMs !== undefined) {
    ctx.issues.push({
      code: 'custom',
      message: 'timeout given twice: beside run and inside it',
      input: s,
      path: ['timeout'],
    });
    return z.NEVER;
  }
  const timeoutMs = s.timeout ?? s.run.timeoutMs ?? DEFAULT_RUN_TIMEOUT_MS;
  return { run: { argv: s.run.argv, timeoutMs, env: { ...s.env, ...s.run.env } } };
});

const Step = byKey<RawStep>('a step: a map with copy or run', { copy: CopyStep, run: RunStep });

const timeoutMs = (t: number | undefined) => t ?? DEFAULT_CHECK_TIMEOUT_MS;

const TcpTarget = byKind<{ port: number; host?: string }>('a port, "host:port", or a map with port and host', {
  number: Port.transform((port) => ({ port })),
  string: z.string().transform(
    conv((s: string) => {
      const m = /^(.+):(\d+)$/.exec(s);
      return m ? { host: checkHost(m[1]!), port: parsePort(m[2]!) } : { port: parsePort(s) };
    }),
  ),
  object: z.strictObject({ port: Port, host: str('a host name or address').transform(conv(checkHost)).optional() }),
});

function checkHost(h: string): string {
  if (!/^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$/.test(h))
    throw new Problem(`invalid host ${JSON.stringify(h)}`, 'give a machine name or an IPv4 address');
  return h;
}

/** A log check's line: a substring, or /regex/flags tested against the file's whole text. */
const LogLine = str('a line to wait for (a substring, or /regex/)')
  .min(1)
  .transform(
    conv((line: string) => {
      const re = /^\/(.*)\/([a-z]*)$/.exec(line);
      if (re) {
        try {
          new RegExp(re[1]!, re[2]);
        } catch (e) {
          throw new Problem(
            `invalid regular expression ${line}: ${(e as Error).message}`,
            'a line written as /.../ is a JavaScript regular expression (flags after the last /, e.g. /ready/m)',
          );
        }
      }
      return line;
    }),
  );

const ReadinessCheck = byKey<Check>('a readiness check: a map with command, tcp, file, log, unit or systemd', {
  unit: z
    .strictObject({ unit: str('a unit name such as nginx.service'), timeout: Duration.optional() })
    .transform((c): Check => ({ kind: 'unit', unit: c.unit, timeoutMs: timeoutMs(c.timeout) })),
  systemd: z
    .strictObject({ systemd: z.literal('running', { error: 'expected running' }), timeout: Duration.optional() })
    .transform((c): Check => ({ kind: 'systemd', state: c.systemd, timeoutMs: timeoutMs(c.timeout) })),
  command: z
    .strictObject({ command: Command, timeout: Duration.optional() })
    .transform((c): Check => ({ kind: 'command', argv: c.command, timeoutMs: timeoutMs(c.timeout) })),
  tcp: z
    .strictObject({ tcp: TcpTarget, timeout: Duration.optional() })
    .transform((c): Check => ({ kind: 'tcp', ...c.tcp, timeoutMs: timeoutMs(c.timeout) })),
  file: z
    .strictObject({ file: MachinePath, timeout: Duration.optional() })
    .transform((c): Check => ({ kind: 'file', path: c.file, timeoutMs: timeoutMs(c.timeout) })),
  log: z
    .strictObject({
      log: z.strictObject({ file: MachinePath, line: LogLine }, { error: 'expected a map with file and line' }),
      timeout: Duration.optional(),
    })
    .transform((c): Check => ({ kind: 'log', file: c.log.file, line: c.log.line, timeoutMs: timeoutMs(c.timeout) })),
});

const Attachment = byKind<{ address?: string | undefined }>('an address, {} or a map with address', {
  null: z
    .null()
    .optional()
    .transform(() => ({})),
  string: z.string().transform((address) => ({ address })),
  object: z.strictObject({ address: str('an IPv4 address').optional() }),
});

const list = <T>(item: z.ZodType<T>) =>
  z
    .array(item, { error: 'expected a list' })
    .nullish()
    .transform((l) => l ?? []);

/** How a machine's image is made: a Debian build (mmdebstrap, cached by its inputs), maybe named. */
const ImageBuild = z.strictObject(
  {
    name: str('an image name').optional(),
    debian: z.strictObject(
      {
        suite: str('a Debian suite such as bookworm').optional(),
        variant: str('an mmdebstrap variant such as minbase').optional(),
        /** a list, or the path of a file (relative to the scenario file) of comma- or space-separated names */
        packages: z.union([z.array(str('a package name')), str('a file of package names')]).optional(),
      },
      { error: 'expected a map with suite, variant, packages' },
    ),
  },
  { error: 'expected a map with debian (and name)' },
);
export type RawImageBuild = z.output<typeof ImageBuild>;

const Machine = z.strictObject(
  {
    image: byKind<string | RawImageBuild>('an image name, or a map saying how it is built ({ debian: { packages } })', {
      string: z.string(),
      object: ImageBuild,
    }).optional(),
    init: z.enum(['agent', 'systemd'], { error: 'expected agent or systemd' }).optional(),
    driver: z.enum(DRIVER_NAMES, { error: `expected ${DRIVER_NAMES.join(' or ')}` }).optional(),
    hostname: str('a host name').optional(),
    memory: strOrNum('a size such as 128M').transform(conv(parseMemory)).optional(),
    pids: z
      .number({ error: 'expected a whole number' })
      .int({ error: 'expected a whole number' })
      .positive({ error: 'expected a positive number' })
      .optional(),
    cpus: z
      .number({ error: 'expected a number of cores such as 1 or 0.5' })
      .positive({ error: 'expected a positive number of cores' })
      .optional(),
    disk: strOrNum('a size such as 1G, or 0 for no cap').transform(conv(parseDisk)).optional(),
    env: Env,
    networks: z.record(z.string(), Attachment, { error: 'expected a map of network name to {address}' }).nullish(),
    provision: list(Step),
    start: list(Step),
    ready: list(ReadinessCheck),
    /** [LOCAL:]REMOTE, forwarded from 127.0.0.1 by `snaplab up --ports` / `snaplab port-forward SCENARIO` */
    ports: list(strOrNum('a port such as "8080:80" or 80')),
    /** Ansible groups of the machine in `snaplab inventory` (beside one per network it is on) */
    groups: list(str('a group name')),
  },
  { error: 'expected a map of machine settings' },
);
export type RawMachine = z.output<typeof Machine>;

/** A network's uplink: true, or egress lists (docs/egress.md) */
const Uplink = z.union(
  [
    z.boolean(),
    z.strictObject({
      allow: z.array(z.string()).optional(),
      deny: z.array(z.string()).optional(),
    }),
  ],
  { error: 'expected true, false or { allow: [...], deny: [...] }' },
);

const Network = byKind<{ subnet: string; uplink?: z.output<typeof Uplink> }>(
  'a map with subnet, or a subnet such as 10.77.1.0/24',
  {
    string: z.string().transform((subnet) => ({ subnet })),
    object: z.strictObject({ subnet: str('an IPv4 CIDR such as 10.77.1.0/24'), uplink: Uplink.optional() }),
  },
);

export const ScenarioFile = z.strictObject(
  {
    name: str('a scenario name').optional(),
    /** 1 (default): snapshots and resets keep a standby copy raised in the background; 0: none */
    standby: z.union([z.literal(0), z.literal(1)], { error: 'expected 0 or 1' }).optional(),
    networks: z.record(z.string(), Network, { error: 'expected a map of network name to {subnet}' }).nullish(),
    machines: z.record(
      z.string(),
      byKind<RawMachine>('a map of machine settings', {
        null: z.null().transform((): RawMachine => Machine.parse({})),
        object: Machine,
      }),
      { error: 'expected a map of machine name to settings' },
    ),
  },
  { error: 'expected a map with name, standby, networks and machines' },
);
export type RawScenario = z.output<typeof ScenarioFile>;

/** Keys a map at a path takes, for the hint of an unknown-key error. */
export function allowedKeys(path: readonly (string | number)[]): string[] {
  const p = path.map((s) => (typeof s === 'number' ? '#' : s));
  const at = (...shape: string[]) => p.length === shape.length && shape.every((s, i) => s === '*' || s === p[i]);
  if (at()) return ['name', 'standby', 'networks', 'machines'];
  if (at('networks', '*')) return ['subnet', 'uplink'];
  if (at('machines', '*')) return Object.keys(Machine.shape);
  if (at('machines', '*', 'networks', '*')) return ['address'];
  if (at('machines', '*', 'image')) return ['name', 'debian'];
  if (at('machines', '*', 'image', 'debian')) return ['suite', 'variant', 'packages'];
  if (p[2] === 'provision' || p[2] === 'start') {
    if (p.length === 4) return p[4] === undefined ? ['copy', 'run', 'timeout (with run)', 'env (with run)'] : [];
    if (p[4] === 'copy') return ['from', 'to', 'mode'];
    if (p[4] === 'run') return ['argv', 'sh', 'timeout', 'env'];
  }
  if (p[2] === 'ready') {
    if (p.length === 4) return ['command', 'tcp', 'file', 'log', 'timeout'];
    if (p[4] === 'tcp') return ['port', 'host'];
    if (p[4] === 'log') return ['file', 'line'];
  }
  return [];
}
