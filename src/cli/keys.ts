import type { Command } from 'commander';
import type { Ceilings, Scope } from '../store/records.js';
import { formatBytes, parseCpus, parsePositiveInt, parseSize } from '../lab/sizes.js';
import { withLab, type CommonOptions } from './common.js';
import { withCluster } from './cluster.js';
import { printJson, printTable } from './output.js';
import { int } from './serve.js';

interface KeyView {
  name: string;
  scopes: Scope[];
  maxSandboxes: number | null;
  maxExecs: number | null;
  ceilings: Partial<Ceilings>;
  createdAt: number;
}

/** `--max-memory 2G` … or `none`: a ceiling lifted (null); not given: the default (lab/ceilings.ts). */
const CEILING_FLAGS: [flag: string, attr: string, key: keyof Ceilings, what: string, parse: (t: string) => number][] = [
  ['--max-memory <size>', 'maxMemory', 'memoryBytes', 'memory per sandbox', (t) => parseSize(t, 'memory ceiling')],
  ['--max-pids <n>', 'maxPids', 'pids', 'pids per sandbox', (t) => parsePositiveInt(t, 'pids ceiling')],
  ['--max-cpus <n>', 'maxCpus', 'cpus', 'CPUs per sandbox', parseCpus],
  ['--max-disk <size>', 'maxDisk', 'diskBytes', 'disk per sandbox', (t) => parseSize(t, 'disk ceiling')],
  ['--max-total-memory <size>', 'maxTotalMemory', 'totalMemoryBytes', 'memory of all its sandboxes', parseSize],
  ['--max-total-disk <size>', 'maxTotalDisk', 'totalDiskBytes', 'disk of all its sandboxes', parseSize],
  [
    '--max-snapshots <n>',
    'maxSnapshots',
    'snapshots',
    'snapshots of its sandboxes',
    (t) => parsePositiveInt(t, 'snapshots'),
  ],
];

function ceilingOptions(c: Command): Command {
  // `none` is kept as the word (commander turns a parser's null into '') and read by ceilingsOf
  for (const [flag, , , what, parse] of CEILING_FLAGS)
    c.option(flag, `ceiling of ${what} (none: no ceiling; default: docs/api.md)`, (t: string) =>
      t === 'none' ? t : parse(t),
    );
  return c.option('--no-egress', 'its sandboxes may not have egress (outbound network; docs/egress.md)');
}

function ceilingsOf(opts: object): Partial<Ceilings> {
  const o = opts as Record<string, unknown>;
  return {
    ...Object.fromEntries(
      CEILING_FLAGS.filter(([, a]) => o[a] !== undefined).map(([, a, key]) => [key, o[a] === 'none' ? null : o[a]]),
    ),
    // only a refusal is kept: a key made without the flag has the default (allowed)
    ...(o.egress === false ? { egress: false } : {}),
  };
}

/** The ceilings a key was made with, as flags say them ('-': the defaults for all). */
function showCeilings(c: Partial<Ceilings> | undefined): string {
  const given = CEILING_FLAGS.filter(([, , key]) => c?.[key] !== undefined).map(([flag, , key]) => {
    const v = c?.[key];
    const name = flag.slice(6, flag.indexOf(' '));
    return `${name}=${v === null ? 'none' : /memory|disk/.test(name) ? formatBytes(v as number) : v}`;
  });
  if (c?.egress === false) given.push('no-egress');
  return given.length ? given.join(',') : '-';
}

const cluster = (c: Command): Command =>
  c.option('--cluster <etcd://host:port,…>', "the cluster's keys, kept in its etcd (gateways read them)");

/** `snaplab key …`: the local daemon's keys, or with --cluster the cluster's (kept in etcd, read by every gateway). */
export function registerKey(program: Command): void {
  const key = program
    .command('key')
    .description("the daemon's API keys (--cluster: the cluster's): only a hash is kept, the key is shown once");
  registerKeyCreate(key);
  registerKeyLs(key);
  registerKeyRm(key);
}

function registerKeyCreate(key: Command): void {
  const create = cluster(
    key
      .command('create <name>')
      .description('make a key and print it (once)')
      .option('--scope <scopes>', 'comma-separated: read, exec, admin', 'read,exec')
      .option('--max-sandboxes <n>', 'at most this many sandboxes of this key at once', int('--max-sandboxes'))
      .option(
        '--max-execs <n>',
        'at most this many concurrent execs of this key (per node in a cluster)',
        int('--max-execs'),
      )
      .option('--e2b', "a key shaped as E2B's (e2b_<hex>) for the E2B-compatible front (docs/e2b.md)")
      .option('--json', 'print JSON'),
  );
  ceilingOptions(create).action(
    async (
      name: string,
      o: CommonOptions & { scope: string; maxSandboxes?: number; maxExecs?: number; cluster?: string; e2b?: boolean },
    ) => {
      const { parseScopes } = await import('../lab/keys.js');
      const show = (token: string, k: KeyView): void => {
        if (o.json) {
          const { createdAt: _c, hash: _h, ...shown } = k as KeyView & { hash?: string };
          printJson({ ...shown, token });
          return;
        }
        process.stdout.write(`${token}\n`);
        process.stderr.write(
          o.e2b
            ? `key ${k.name} (${k.scopes.join(',')}): shown only now; give it to E2B's SDK as E2B_API_KEY (docs/e2b.md)\n`
            : `key ${k.name} (${k.scopes.join(',')}): shown only now; send it as \`Authorization: Bearer KEY\`\n`,
        );
      };
      const opts = {
        scopes: parseScopes(o.scope),
        maxSandboxes: o.maxSandboxes,
        maxExecs: o.maxExecs,
        ceilings: ceilingsOf(o),
        e2b: o.e2b,
      };
      if (o.cluster) {
        return withCluster(o.cluster, o.json, async (store) => {
          const { createKeyEntry } = await import('../cluster/keys.js');
          const { token, key: k } = await createKeyEntry(store, name, opts);
          show(token, k);
        });
      }
      return withLab(o, async (lab) => {
        const { token, key: k } = lab.keys.create(name, opts);
        show(token, k);
      });
    },
  );
}

function registerKeyLs(key: Command): void {
  cluster(
    key.command('ls').description('list keys (names, scopes, quotas; never the keys)').option('--json', 'print JSON'),
  ).action(async (o: CommonOptions & { cluster?: string }) => {
    const show = (keys: KeyView[]): void => {
      if (o.json) {
        printJson(keys);
        return;
      }
      printTable(
        ['NAME', 'SCOPES', 'MAX SANDBOXES', 'MAX EXECS', 'CEILINGS', 'CREATED'],
        keys.map((k) => [
          k.name,
          k.scopes.join(','),
          k.maxSandboxes ?? '-',
          k.maxExecs ?? '-',
          showCeilings(k.ceilings),
          new Date(k.createdAt).toISOString(),
        ]),
      );
    };
    if (o.cluster)
      return withCluster(o.cluster, o.json, async (store) => show((await store.keys()).map(({ hash: _h, ...k }) => k)));
    return withLab(o, async (lab) => show(lab.keys.list()));
  });
}

function registerKeyRm(key: Command): void {
  cluster(
    key
      .command('rm <name>')
      .description('remove a key: requests with it are refused from now on')
      .option('--json', 'print JSON'),
  ).action(async (name: string, o: CommonOptions & { cluster?: string }) => {
    if (o.cluster) {
      return withCluster(o.cluster, o.json, async (store) => {
        const { SnaplabError } = await import('../errors.js');
        if (!(await store.deleteKey(name)))
          throw new SnaplabError(
            'KEY_NOT_FOUND',
            `no key named ${name} in the cluster`,
            'see `snaplab key ls --cluster …`',
          );
        if (o.json) printJson({ removed: name });
      });
    }
    return withLab(o, async (lab) => {
      lab.keys.remove(name);
      if (o.json) printJson({ removed: name });
    });
  });
}
