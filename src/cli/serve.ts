import { resolve } from 'node:path';
import { InvalidArgumentError, type Command } from 'commander';
import { withLab, type CommonOptions } from './common.js';
import { EXIT_USAGE, printJson, printTable, reportError } from './output.js';

const int = (flag: string) => (v: string): number => {
  const n = Number(v);
  if (!Number.isSafeInteger(n) || n < 0) throw new InvalidArgumentError(`${flag} takes a whole number ≥ 0, not ${JSON.stringify(v)}`);
  return n;
};

export function registerServe(program: Command): void {
  program
    .command('serve')
    .description('run the API daemon in the foreground: a Unix socket (no key needed) and, with --listen, TCP with API keys (docs/api.md)')
    .option('--socket <path>', 'Unix socket (default $SNAPLAB_HOME/daemon.sock, mode 0600)')
    .option('--listen <host:port>', 'also listen on TCP, bearer keys required (e.g. 127.0.0.1:7070)')
    .option('--json-logs', 'one JSON object per log line (stderr)')
    .option('--default-timeout <s>', 'TTL of a sandbox whose create gives none (0: none)', int('--default-timeout'), 300)
    .option('--exec-timeout <ms>', 'deadline of an exec whose request gives none (0: none)', int('--exec-timeout'), 60_000)
    .option('--bench-dir <dir>', 'the dashboard shows the `bench --results` directories in here (default $SNAPLAB_HOME/bench)')
    .action(async (o: { socket?: string; listen?: string; jsonLogs?: boolean; defaultTimeout: number; execTimeout: number; benchDir?: string }) => {
      try {
        const { serve } = await import('../server/serve.js');
        const server = await serve({ socket: o.socket, listen: o.listen, jsonLogs: o.jsonLogs, defaultTimeoutS: o.defaultTimeout, execTimeoutMs: o.execTimeout, benchDir: o.benchDir && resolve(o.benchDir) });
        process.stdout.write(`${JSON.stringify({ socket: server.socket, url: server.url, pid: process.pid })}\n`);
        await new Promise<void>((resolve) => {
          const stop = (): void => resolve();
          process.once('SIGTERM', stop);
          process.once('SIGINT', stop);
        });
        await server.close();
      } catch (e) {
        reportError(e, false);
        process.exitCode = EXIT_USAGE;
      }
    });
}

export function registerKey(program: Command): void {
  const key = program.command('key').description("the daemon's API keys: only a hash is kept, the key is shown once");
  key
    .command('create <name>')
    .description('make a key and print it (once)')
    .option('--scope <scopes>', 'comma-separated: read, exec, admin', 'read,exec')
    .option('--max-sandboxes <n>', 'at most this many sandboxes of this key at once', int('--max-sandboxes'))
    .option('--max-execs <n>', 'at most this many concurrent execs of this key', int('--max-execs'))
    .option('--json', 'print JSON')
    .action((name: string, o: CommonOptions & { scope: string; maxSandboxes?: number; maxExecs?: number }) =>
      withLab(o, async (lab) => {
        const { createKey, parseScopes } = await import('../server/keys.js');
        const { token, key: k } = createKey(lab.context.store, name, { scopes: parseScopes(o.scope), maxSandboxes: o.maxSandboxes, maxExecs: o.maxExecs });
        if (o.json) return printJson({ name: k.name, scopes: k.scopes, maxSandboxes: k.maxSandboxes, maxExecs: k.maxExecs, token });
        process.stdout.write(`${token}\n`);
        process.stderr.write(`key ${k.name} (${k.scopes.join(',')}): shown only now; send it as \`Authorization: Bearer KEY\`\n`);
      }));
  key
    .command('ls')
    .description('list keys (names, scopes, quotas; never the keys)')
    .option('--json', 'print JSON')
    .action((o: CommonOptions) =>
      withLab(o, async (lab) => {
        const keys = lab.context.store.listKeys().map(({ hash: _h, ...k }) => k);
        if (o.json) return printJson(keys);
        printTable(['NAME', 'SCOPES', 'MAX SANDBOXES', 'MAX EXECS', 'CREATED'], keys.map((k) => [k.name, k.scopes.join(','), k.maxSandboxes ?? '-', k.maxExecs ?? '-', new Date(k.createdAt).toISOString()]));
      }));
  key
    .command('rm <name>')
    .description('remove a key: requests with it are refused from now on')
    .option('--json', 'print JSON')
    .action((name: string, o: CommonOptions) =>
      withLab(o, async (lab) => {
        const { removeKey } = await import('../server/keys.js');
        removeKey(lab.context.store, name);
        if (o.json) printJson({ removed: name });
      }));
}
