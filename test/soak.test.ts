/**
 * The soak's short version (#17, item 5; scripts/soak.mjs is the long one, docs/security.md):
 * 64 clients of a real daemon for 20 s of fresh executions with random commands, the daemon
 * SIGKILLed and started again every ~10 s, hostile clients flooding and slowing its TCP port
 * while a quarter of the clients work over it; every execution right (or cut by a kill, inside its
 * window), the pool's counters adding up, nothing of the soak's home left on the host, and no
 * snaplab cgroup new on the host (nothing else runs during a test file).
 */
import { spawn, spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { SNAPLAB } from './cli-command.js';

// 20 s with a kill every ~10: two kills, as 30 s with one every ~15 had (the suite is at its budget)
const SECONDS = Number(process.env.SNAPLAB_SOAK_SECONDS ?? 20);

describe('soak', () => {
  it(
    `64 clients, ${SECONDS} s, the daemon killed at random: every result right, counters adding up, nothing left`,
    async () => {
      const home = mkdtempSync(join(tmpdir(), 'snaplab-test-soak-'));
      // spawned, not spawnSync: the worker must keep answering vitest for the minute it runs; a
      // process group of its own, so that a soak that hangs goes with its daemon
      const child = spawn(
        process.execPath,
        [
          join(import.meta.dirname, '..', 'scripts', 'soak.mjs'),
          '--clients',
          '64',
          '--duration',
          String(SECONDS),
          '--kill-every',
          '10',
          '--pool-size',
          '4',
          '--home',
          home,
          '--host-wide',
          // and hostile clients on its TCP port (issue 30): a flood, slowloris, cut requests
          '--hostile',
          '--flood',
          '300',
          '--slow',
          '20',
          '--json',
        ],
        { stdio: ['ignore', 'pipe', 'pipe'], detached: true },
      );
      let stdout = '';
      let stderr = '';
      child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
      child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
      const bound = setTimeout(() => process.kill(-child.pid!, 'SIGKILL'), (SECONDS + 240) * 1000); // a hung soak fails, with what it printed
      const status = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
      clearTimeout(bound);
      try {
        expect(status, `${stderr}\n${stdout}`).not.toBeNull();
        const report = JSON.parse(stdout) as {
          ok: boolean;
          executions: number;
          right: number;
          wrong: number;
          kills: number;
          leftOnHost: string[];
          counterChecks: { what: string; ok: boolean }[];
          gcCheck: { what: string; ok: boolean };
          byKind: Record<string, { right: number }>;
          wrongExamples: unknown[];
        };
        const why = JSON.stringify(report, null, 1);
        expect(report.wrongExamples, why).toEqual([]);
        expect(report.leftOnHost, why).toEqual([]);
        for (const c of [...report.counterChecks, report.gcCheck]) expect(c.ok, c.what).toBe(true);
        expect(report.kills, why).toBeGreaterThanOrEqual(1);
        // it did run them all: each kind answered right at least once
        for (const [kind, v] of Object.entries(report.byKind)) expect(v.right, kind).toBeGreaterThan(0);
        expect(report.ok, why).toBe(true);
        expect(status).toBe(0);
      } finally {
        // whatever the soak left (it was killed, or failed): removed, so later files start clean
        try {
          process.kill(-child.pid!, 'SIGKILL');
        } catch {
          /* the group is gone */
        }
        const env = { ...process.env, SNAPLAB_HOME: home };
        for (const args of [['pool', 'rm', 'soak'], ['rm', '--all'], ['image', 'rm', '--force', 'busybox'], ['gc']])
          spawnSync(SNAPLAB, args, { env, timeout: 120_000 });
        rmSync(home, { recursive: true, force: true });
      }
    },
    (SECONDS + 400) * 1000,
  );
});
