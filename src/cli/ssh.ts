import type { Command } from 'commander';
import type { SshHost } from '../lab/io/ssh.js';
import type { Lab } from '../sdk/lab.js';
import { isScenario, withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';
import { RESERVED_GROUPS } from '../scenario/spec.js';

/** A scenario's machines (groups: its networks and `groups:`), or one machine. */
async function hostsOf(lab: Lab, target: string): Promise<SshHost[]> {
  if (isScenario(lab, target)) {
    const sc = lab.scenario(target);
    return Promise.all(
      sc.spec.machines.map(async (m) => ({
        alias: m.name,
        machine: `${target}/${m.name}`,
        box: await sc.machine(m.name),
        // a network named like one of Ansible's own groups is not made a group
        groups: [
          ...new Set([...m.networks.map((n) => n.network.replace(/[^A-Za-z0-9_]/g, '_')), ...(m.groups ?? [])]),
        ].filter((g) => !RESERVED_GROUPS.includes(g)),
      })),
    );
  }
  const box = await lab.get(target);
  return [{ alias: target.replace('/', '-'), machine: target, box, groups: [] }];
}

async function withSshFiles(
  lab: Lab,
  target: string,
  fn: (files: { config: string; inventory: string; text: string }, hosts: SshHost[]) => Promise<void>,
): Promise<void> {
  const { writeSshFiles } = await import('../lab/io/ssh.js');
  const hosts = await hostsOf(lab, target);
  try {
    await fn(await writeSshFiles(lab.home, target, hosts), hosts);
  } finally {
    for (const h of hosts) h.box.close();
  }
}

export function registerSsh(program: Command): void {
  program
    .command('ssh-config <target>')
    .description(
      "an ssh_config for a machine or every machine of a scenario (ProxyCommand: snaplab proxy MACHINE 22); authorizes snaplab's key for root",
    )
    .option('--json', "the config file's path and hosts as JSON; errors as JSON")
    .addHelpText(
      'after',
      '\nThe machine needs an sshd (e.g. an image built with --packages openssh-server).\n  snaplab ssh-config lab > lab.ssh && ssh -F lab.ssh web\n  pytest --hosts=ssh://web --ssh-config=$(snaplab ssh-config lab --path) test_web.py',
    )
    .option('--path', 'print the path of the config file snaplab keeps (HOME/ssh/TARGET.config) instead of its text')
    .action((target: string, o: CommonOptions & { path?: boolean }) =>
      withLab(o, (lab) =>
        withSshFiles(lab, target, async (files, hosts) => {
          if (o.json)
            printJson({ config: files.config, hosts: hosts.map((h) => ({ host: h.alias, machine: h.machine })) });
          else if (o.path) process.stdout.write(`${files.config}\n`);
          else process.stdout.write(files.text);
        }),
      ),
    );

  program
    .command('inventory <target>')
    .description(
      "an Ansible inventory of a scenario (groups: its networks and machines' groups:) or a machine; prints its path",
    )
    .option('--json', "print the inventory itself in Ansible's JSON form instead")
    .addHelpText(
      'after',
      '\n  ansible all -i $(snaplab inventory lab) -m ping\n  ansible-playbook -i $(snaplab inventory lab) site.yml\nWithout an sshd in the machines, use the snaplab connection plugin (integrations/ansible).',
    )
    .action((target: string, o: CommonOptions) =>
      withLab(o, (lab) =>
        withSshFiles(lab, target, async (files, hosts) => {
          if (o.json) printJson((await import('../lab/io/ssh.js')).inventoryJson(lab.home, files.config, hosts));
          else process.stdout.write(`${files.inventory}\n`);
        }),
      ),
    );
}
