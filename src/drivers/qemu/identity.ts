import { randomBytes } from 'node:crypto';
import type { AgentClient } from '../../agent/client.js';
import { SnaplabError, isSnaplabError } from '../../errors.js';
import type { Trace } from '../../timing/trace.js';
import { nameMachineSh } from './guest-init.js';

/** the environment of the fallback command below (as lab/io/exec.ts gives every command) */
const ENV = ['PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', 'HOME=/root', 'TERM=xterm'];

/**
 * A restored VM's identity of its own: a name, a machine id, and the guest's random pool reseeded
 * (every restore of a snapshot would otherwise draw the same numbers), so that several restores of
 * one snapshot can run side by side. The restored machine's first answer.
 */
export async function giveIdentity(
  agent: AgentClient,
  hostname: string,
  init: 'systemd' | undefined,
  trace: Trace,
): Promise<void> {
  await trace
    .phase('identity', async () => {
      const identity = {
        hostname,
        machineId: randomBytes(16).toString('hex'),
        entropy: randomBytes(512),
        system: init === 'systemd',
      };
      // set by the agent itself (1.3): a restored guest's first fork and exec cost hundreds of
      // milliseconds under emulation; a snapshot's older agent does it with a command
      if (agent.minor >= 3) return agent.setIdentity(identity);
      // a system machine's name is in its /etc too (systemd reads it; sudo resolves it)
      const script = `${nameMachineSh()}\nhostname "$1" && echo "$2" > /etc/machine-id && { [ "$3" != systemd ] || name_machine "$1"; } && cat > /dev/urandom`;
      const h = agent.exec({
        argv: ['sh', '-c', script, 'sh', identity.hostname, identity.machineId, init ?? 'agent'],
        env: ENV,
        stdin: true,
      });
      h.write(identity.entropy);
      h.end();
      const r = await h.result;
      if (r.exitCode !== 0)
        throw new SnaplabError(
          'LAUNCH_FAILED',
          `cannot give the restored machine its identity: ${r.stderr.toString().trim()}`,
        );
    })
    .catch((e: unknown) => {
      if (isSnaplabError(e, 'AGENT_ERROR') || isSnaplabError(e, 'TIMEOUT'))
        throw new SnaplabError(
          'LAUNCH_FAILED',
          `cannot give the restored machine its identity: ${(e as Error).message}`,
          'see `snaplab trace` of the operation; the machine is removed',
          { cause: e },
        );
      throw e;
    });
}
