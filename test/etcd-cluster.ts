/** A real 3-member etcd cluster (Debian's etcd-server) on 127.0.0.1 ports, for the cluster tests. */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export interface EtcdMember {
  name: string;
  client: string;
  proc: ChildProcess;
  /** SIGKILL, and wait for it to exit */
  kill(): Promise<void>;
}

export interface EtcdCluster {
  members: EtcdMember[];
  /** etcd://127.0.0.1:A,127.0.0.1:B,127.0.0.1:C */
  url: string;
  stop(): Promise<void>;
}

/** A port nobody listens on now (the kernel's pick). */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once('error', reject);
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

async function healthy(client: string, ms: number): Promise<void> {
  const end = Date.now() + ms;
  for (;;) {
    const ok = await fetch(`http://${client}/health`).then(
      async (r) => ((await r.json()) as { health?: string }).health === 'true',
      () => false,
    );
    if (ok) return;
    if (Date.now() > end) throw new Error(`etcd member ${client} not healthy after ${ms} ms`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function startEtcd(size = 3): Promise<EtcdCluster> {
  const dir = mkdtempSync(join(tmpdir(), 'snaplab-test-etcd-'));
  const ports = await Promise.all(Array.from({ length: size * 2 }, freePort));
  const names = Array.from({ length: size }, (_, i) => `m${i}`);
  const initial = names.map((n, i) => `${n}=http://127.0.0.1:${ports[i * 2 + 1]}`).join(',');
  const members: EtcdMember[] = names.map((name, i) => {
    const client = `127.0.0.1:${ports[i * 2]}`;
    const peer = `http://127.0.0.1:${ports[i * 2 + 1]}`;
    const proc = spawn(
      'etcd',
      [
        '--name',
        name,
        '--data-dir',
        join(dir, name),
        '--listen-client-urls',
        `http://${client}`,
        '--advertise-client-urls',
        `http://${client}`,
        '--listen-peer-urls',
        peer,
        '--initial-advertise-peer-urls',
        peer,
        '--initial-cluster',
        initial,
        '--initial-cluster-state',
        'new',
        '--initial-cluster-token',
        `snaplab-test-${process.pid}`,
        // a test cluster: quick elections, nothing written to the log but errors
        '--heartbeat-interval',
        '50',
        '--election-timeout',
        '500',
        '--log-level',
        'error',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let err = '';
    proc.stderr!.on('data', (b: Buffer) => (err = (err + b.toString()).slice(-4000)));
    const exited = new Promise<void>((r) => proc.once('exit', () => r()));
    proc.once('exit', (code, sig) => {
      if (code && !sig) process.stderr.write(`etcd ${name} exited ${code}: ${err}\n`);
    });
    return {
      name,
      client,
      proc,
      async kill() {
        proc.kill('SIGKILL');
        await exited;
      },
    };
  });
  try {
    await Promise.all(members.map((m) => healthy(m.client, 30_000)));
  } catch (e) {
    for (const m of members) await m.kill();
    rmSync(dir, { recursive: true, force: true });
    throw e;
  }
  return {
    members,
    url: `etcd://${members.map((m) => m.client).join(',')}`,
    async stop() {
      for (const m of members) await m.kill();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
