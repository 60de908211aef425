import { InvalidArgumentError, type Command } from 'commander';
import { join } from 'node:path';
import { envHome } from '../lab/home.js';
import { EXIT_USAGE, printJson, reportError } from './output.js';

/** `snaplab ui`: the dashboard of the daemon on this host's Unix socket, through a forward with a token. */
export function registerUi(program: Command): void {
  program
    .command('ui')
    .description(
      "open the daemon's dashboard: forwards a port on 127.0.0.1 to its Unix socket and prints the URL (with a token made now); runs until interrupted",
    )
    .option(
      '--socket <path>',
      "the daemon's socket (default: SNAPLAB_HOST when it is unix:PATH, else $SNAPLAB_HOME/daemon.sock)",
    )
    .option('--port <n>', 'the local port (default: any free one)', (v: string) => {
      const n = Number(v);
      if (!Number.isInteger(n) || n < 0 || n > 65535)
        throw new InvalidArgumentError(`--port takes 0–65535, not ${JSON.stringify(v)}`);
      return n;
    })
    .option('--json', 'print {url, port, socket} as JSON')
    .action(async (o: { socket?: string; port?: number; json?: boolean }) => {
      try {
        const host = process.env.SNAPLAB_HOST;
        if (!o.socket && host && !host.startsWith('unix:')) {
          // a daemon on TCP serves its dashboard itself, with keys: nothing to forward
          const url = `${host.replace(/\/+$/, '')}/`;
          if (o.json) printJson({ url, port: null, socket: null });
          else process.stdout.write(`${url}\n(the daemon serves it; sign in with an API key)\n`);
          return;
        }
        const socket =
          o.socket ?? (host?.startsWith('unix:') ? host.slice('unix:'.length) : join(envHome(), 'daemon.sock'));
        const { Http } = await import('../client/http.js');
        const http = new Http(`unix:${socket}`, undefined);
        await http.json('GET', '/healthz').finally(() => http.close()); // DAEMON_UNREACHABLE, with a hint, when none answers
        const { startUiProxy } = await import('../client/ui-proxy.js');
        const proxy = await startUiProxy(socket, { port: o.port });
        if (o.json) printJson({ url: proxy.url, port: proxy.port, socket });
        else process.stdout.write(`${proxy.url}\n`);
        process.stderr.write(
          `forwarding 127.0.0.1:${proxy.port} to ${socket}; the token in the URL is the key (Ctrl-C stops)\n`,
        );
        await new Promise<void>((resolve) => {
          process.once('SIGTERM', resolve);
          process.once('SIGINT', resolve);
        });
        await proxy.close();
      } catch (e) {
        reportError(e, !!o.json);
        process.exitCode = EXIT_USAGE;
      }
    });
}
