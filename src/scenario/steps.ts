import { readFile } from 'node:fs/promises';
import type { AgentClient } from '../agent/client.js';
import { SnaplabError } from '../errors.js';
import { tcpAccepts } from '../host/net/tcp-check.js';
import type { LabContext } from '../lab/context.js';
import { execIn } from '../lab/io/sandbox-ops.js';
import type { SandboxRecord } from '../store/records.js';
import type { Check, MachineFileSpec, ScenarioSpec, Step } from './spec.js';
import { isVm } from './names.js';
import { MACHINE_AGENT_PATH } from '../drivers/driver.js';

export interface Machine {
  spec: MachineFileSpec;
  record: SandboxRecord;
  agent: AgentClient;
  /** path of the machine's network namespace */
  netns: string;
}

const POLL_MS = 50;

/** /etc/hosts for a machine: every machine's addresses on the networks it shares with this one. */
export function hostsFile(scn: ScenarioSpec, m: MachineFileSpec): string {
  const mine = new Set(m.networks.map((n) => n.network));
  const lines = ['127.0.0.1\tlocalhost', '::1\tlocalhost'];
  for (const other of scn.machines) {
    for (const n of other.networks) {
      if (mine.has(n.network))
        lines.push(`${n.address}\t${other.hostname}${other.hostname === other.name ? '' : ` ${other.name}`}`);
    }
  }
  return `${lines.join('\n')}\n`;
}

export function stepText(s: Step): string {
  return 'copy' in s ? `copy ${s.copy.from} → ${s.copy.to}` : `run ${s.run.argv.join(' ')}`;
}

/** Run provisioning or start steps in order; the first that fails stops with its output. */
export async function runSteps(ctx: LabContext, m: Machine, steps: Step[], what: string): Promise<void> {
  for (const step of steps) {
    if ('copy' in step) {
      const data = await readFile(step.copy.from);
      await m.agent.putFile(step.copy.to, data, step.copy.mode);
      continue;
    }
    const r = await execIn(ctx, m.record, m.agent, step.run.argv, {
      env: { ...m.spec.env, ...step.run.env },
      timeoutMs: step.run.timeoutMs,
    });
    if (r.exitCode !== 0) {
      const out = `${r.stdout.toString()}${r.stderr.toString()}`.trim().split('\n').slice(-10).join('\n');
      throw new SnaplabError(
        'SCENARIO_FAILED',
        `machine ${m.spec.name}: ${what} step \`${stepText(step)}\` ${r.timedOut ? 'timed out' : `exited ${r.exitCode}`}${out ? `:\n${out}` : ''}`,
        `fix the step in the scenario file, or debug with \`snaplab up --keep-on-failure\` and \`snaplab exec SCENARIO/${m.spec.name} -- sh\``,
      );
    }
  }
}

export function checkText(c: Check): string {
  switch (c.kind) {
    case 'command':
      return `command ${c.argv.join(' ')}`;
    case 'tcp':
      return `tcp ${c.host ?? '127.0.0.1'}:${c.port}`;
    case 'file':
      return `file ${c.path}`;
    case 'log':
      return `log ${c.file} has ${JSON.stringify(c.line)}`;
    case 'unit':
      return `unit ${c.unit} active`;
    case 'systemd':
      return `systemd ${c.state}`;
  }
}

async function fileText(agent: AgentClient, path: string): Promise<{ exists: boolean; text: string; error?: string }> {
  try {
    return { exists: true, text: (await agent.getFile(path)).toString() };
  } catch (e) {
    const msg = (e as Error).message;
    return { exists: /EISDIR/.test(msg), text: '', error: msg };
  }
}

function lineMatches(text: string, want: string): boolean {
  const re = /^\/(.*)\/([a-z]*)$/.exec(want);
  return re ? new RegExp(re[1]!, re[2]).test(text) : text.includes(want);
}

/** One attempt at a check: passed, or what it saw. */
async function attempt(
  ctx: LabContext,
  m: Machine,
  c: Check,
  remainingMs: number,
): Promise<{ ok: boolean; last: string }> {
  switch (c.kind) {
    case 'command': {
      const r = await execIn(ctx, m.record, m.agent, c.argv, {
        env: m.spec.env,
        timeoutMs: Math.max(100, remainingMs),
      });
      return {
        ok: r.exitCode === 0,
        last: `exit ${r.exitCode}: ${`${r.stdout.toString()}${r.stderr.toString()}`.trim().slice(-500)}`,
      };
    }
    case 'tcp': {
      const host = c.host ?? '127.0.0.1';
      const ms = Math.min(1000, Math.max(50, remainingMs));
      if (isVm(m.spec)) {
        // a VM's network is its guest's own: its agent tries (the host's namespace holds no address)
        const r = await execIn(
          ctx,
          m.record,
          m.agent,
          [MACHINE_AGENT_PATH, 'connect', '--check', host, String(c.port)],
          { timeoutMs: Math.max(100, ms) },
        );
        return {
          ok: r.exitCode === 0,
          last:
            r.stderr
              .toString()
              .trim()
              .replace(/^snaplab: /, '') || `exit ${r.exitCode}`,
        };
      }
      const r = await tcpAccepts(m.netns, host, c.port, ms);
      return { ok: r.ok, last: r.error ?? 'connected' };
    }
    case 'file': {
      const f = await fileText(m.agent, c.path);
      return { ok: f.exists, last: f.error ?? 'exists' };
    }
    case 'log': {
      const f = await fileText(m.agent, c.file);
      return {
        ok: f.exists && lineMatches(f.text, c.line),
        last: f.error ?? `no matching line yet (${f.text.length} bytes)`,
      };
    }
    case 'unit':
    case 'systemd': {
      const argv = c.kind === 'unit' ? ['systemctl', 'is-active', c.unit] : ['systemctl', 'is-system-running'];
      const r = await execIn(ctx, m.record, m.agent, argv, { timeoutMs: Math.max(100, remainingMs) });
      const said = `${r.stdout.toString()}${r.stderr.toString()}`.trim().split('\n').pop() ?? '';
      return { ok: said === (c.kind === 'unit' ? 'active' : c.state), last: `systemctl said ${JSON.stringify(said)}` };
    }
  }
}

/** Poll every check of the machine until it passes or its timeout runs out. */
export async function waitReady(ctx: LabContext, m: Machine): Promise<void> {
  for (const c of m.spec.ready) {
    const end = Date.now() + c.timeoutMs;
    let last = '';
    for (;;) {
      const r = await attempt(ctx, m, c, end - Date.now());
      if (r.ok) break;
      last = r.last;
      if (Date.now() >= end) {
        throw new SnaplabError(
          'SCENARIO_FAILED',
          `machine ${m.spec.name}: readiness check \`${checkText(c)}\` did not pass within ${c.timeoutMs} ms; last: ${last}`,
          `check the machine's start steps, or debug with \`snaplab up --keep-on-failure\` and \`snaplab exec SCENARIO/${m.spec.name} -- sh\``,
        );
      }
      await new Promise((r2) => setTimeout(r2, POLL_MS));
    }
  }
}
