/**
 * The soak's short version (#17, item 5; scripts/soak.mjs is the long one, docs/security.md):
 * 64 clients of a real daemon for 60 s of fresh executions with random commands, the daemon
 * SIGKILLed and started again every ~15 s; every execution right (or cut by a kill, inside its
 * window), the pool's counters adding up, nothing of the soak's home left on the host.
 */
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';

const SECONDS = Number(process.env.SNAPLAB_SOAK_SECONDS ?? 60);

describe('soak', () => {
  it(`64 clients, ${SECONDS} s, the daemon killed at random: every result right, counters adding up, nothing left`, async () => {
    // spawned, not spawnSync: the worker must keep answering vitest for the minute it runs
    const child = spawn(process.execPath, [join(import.meta.dirname, '..', 'scripts', 'soak.mjs'), '--clients', '64', '--duration', String(SECONDS), '--kill-every', '15', '--pool-size', '4', '--json'], { stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (b: Buffer) => (stdout += b.toString()));
    child.stderr.on('data', (b: Buffer) => (stderr += b.toString()));
    const bound = setTimeout(() => child.kill('SIGKILL'), (SECONDS + 240) * 1000); // a hung soak fails, with what it printed
    const status = await new Promise<number | null>((resolve) => child.once('exit', (c) => resolve(c)));
    clearTimeout(bound);
    const r = { status, stdout, stderr };
    expect(r.status, `${r.stderr}\n${r.stdout}`).not.toBeNull();
    const report = JSON.parse(r.stdout) as {
      ok: boolean; executions: number; right: number; wrong: number; kills: number; leftOnHost: string[];
      counterChecks: { what: string; ok: boolean }[]; byKind: Record<string, { right: number }>; wrongExamples: unknown[];
    };
    const why = JSON.stringify(report, null, 1);
    expect(report.wrongExamples, why).toEqual([]);
    expect(report.leftOnHost, why).toEqual([]);
    for (const c of report.counterChecks) expect(c.ok, c.what).toBe(true);
    expect(report.kills, why).toBeGreaterThanOrEqual(SECONDS >= 60 ? 2 : 1);
    // it did run them all: each kind answered right at least once
    for (const [kind, v] of Object.entries(report.byKind)) expect(v.right, kind).toBeGreaterThan(0);
    expect(report.ok, why).toBe(true);
    expect(r.status).toBe(0);
  }, (SECONDS + 300) * 1000);
});
