/**
 * SSH and Ansible reach (`snaplab ssh-config`, `snaplab inventory`): an ssh_config whose
 * ProxyCommand is `snaplab proxy MACHINE 22` (a stdio stream to port 22 inside the machine, made
 * from inside it: no host or machine address is routed), a key of snaplab's own under the home
 * authorized for root in each machine, and an Ansible inventory that uses that config. The
 * files live in HOME/ssh/ and are written again on every call (machines come and go).
 */
import { spawnSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { packageRoot } from '../../agent/binary.js';
import { SnaplabError } from '../../errors.js';
import type { Sandbox } from '../../sdk/sandbox.js';
import { noted } from '../../cleanup.js';

export interface SshHost {
  /** the name ssh and Ansible use: the machine's name (in a scenario, without the scenario) */
  alias: string;
  /** what snaplab calls it: NAME, or SCENARIO/MACHINE */
  machine: string;
  box: Sandbox;
  groups: string[];
}

/** HOME/ssh/id_ed25519, made once (ssh-keygen). */
export function sshKey(home: string): { private: string; public: string } {
  const dir = join(home, 'ssh');
  const key = join(dir, 'id_ed25519');
  if (!existsSync(key)) {
    mkdirSync(dir, { recursive: true, mode: 0o700 });
    const r = spawnSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'snaplab', '-f', key], {
      encoding: 'utf8',
    });
    if (r.error || r.status !== 0)
      throw new SnaplabError(
        'MISSING_TOOL',
        `cannot make snaplab's ssh key: ${r.error?.message ?? r.stderr.trim()}`,
        'install openssh-client (ssh-keygen), or run `snaplab doctor`',
      );
  }
  return { private: key, public: readFileSync(`${key}.pub`, 'utf8').trim() };
}

/**
 * The home's public key, if `inventory` or `ssh-config` made one: `snaplab proxy M 22` has the
 * agent authorize it before each ssh connection (`connect --authorize`), so that access survives
 * every reset, restore and standby swap, whenever the snapshot was taken.
 */
export function homeKey(home: string): string | undefined {
  const pub = join(home, 'ssh', 'id_ed25519.pub');
  return existsSync(pub) ? readFileSync(pub, 'utf8').trim() : undefined;
}

/** Adds the key to root's authorized_keys in the machine (once; the file is the machine's own). */
export async function authorize(box: Sandbox, publicKey: string): Promise<void> {
  const path = '/root/.ssh/authorized_keys';
  // only a file that is not there is empty: anything else (unreadable, too big) must not be overwritten
  const now = (
    await box.getFile(path).catch((e: unknown) => {
      if (/\(ENOENT\)|\(ENOTDIR\)/.test(String((e as Error).message))) return Buffer.alloc(0);
      throw e;
    })
  ).toString('utf8');
  if (now.split('\n').some((l) => l.trim() === publicKey)) return;
  await box.putFile(path, `${now}${now && !now.endsWith('\n') ? '\n' : ''}${publicKey}\n`, 0o600);
  // sshd's StrictModes: ~/.ssh must not be writable by others (putFile makes parents 0755)
  await box.exec(['chmod', '700', '/root/.ssh']).catch(noted('chmod 700 /root/.ssh'));
}

/** The snaplab command ssh runs as ProxyCommand: this package's, with this home. */
function proxyCommand(home: string, machine: string): string {
  const bin = join(packageRoot(), 'native', 'build', 'snaplab');
  const q = (s: string): string => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);
  // ssh expands %-tokens in ProxyCommand before the shell sees it: a literal % is %%
  return `env SNAPLAB_HOME=${q(home)} ${q(bin)} proxy ${q(machine)} 22`.replace(/%/g, '%%');
}

/** An ssh_config argument: quoted when it has a space (ssh_config takes "..."). */
const sshArg = (s: string): string => (/[\s"]/.test(s) ? `"${s.replace(/"/g, '')}"` : s);
/** An argument of ansible_ssh_common_args, which Ansible splits as a shell would. */
const shellArg = (s: string): string => (/^[\w@%+=:,./-]+$/.test(s) ? s : `'${s.replace(/'/g, `'\\''`)}'`);

/**
 * A machine's second name in the ssh config (and its HostName, never dialled: the ProxyCommand
 * carries the connection), which names the machine and the home: `ssh lab.db.<hash>.snaplab`
 * reaches it as `ssh db` does, and Ansible, given it as ansible_host, names its shared
 * connection (ControlPersist) after it, so that `db` of one scenario never reuses a connection
 * to `db` of another. ssh's own %C (ControlPath) includes it as %h.
 */
const hostName = (home: string, machine: string): string =>
  `${machine.replace(/[^\w.-]/g, '.')}.${createHash('sha256').update(home).digest('hex').slice(0, 8)}.snaplab`;

export function sshConfig(home: string, key: string, hosts: SshHost[]): string {
  return hosts
    .map((h) =>
      [
        `Host ${h.alias} ${hostName(home, h.machine)}`,
        `  HostName ${hostName(home, h.machine)}`,
        '  User root',
        `  IdentityFile ${sshArg(key)}`,
        '  IdentitiesOnly yes',
        // a machine's host key is its image's: new with every machine, so it is not remembered
        '  StrictHostKeyChecking no',
        '  UserKnownHostsFile /dev/null',
        '  LogLevel ERROR',
        `  ProxyCommand ${proxyCommand(home, h.machine)}`,
        '',
      ].join('\n'),
    )
    .join('\n');
}

/** Ansible's INI inventory: every host, its groups, and ssh through the config above. */
export function inventoryIni(home: string, configPath: string, hosts: SshHost[]): string {
  const groups = new Map<string, string[]>();
  for (const h of hosts) for (const g of h.groups) groups.set(g, [...(groups.get(g) ?? []), h.alias]);
  return [
    // snaplab_machine: what the snaplab connection plugin (integrations/ansible) runs tasks in
    // ansible_host: Ansible names its shared ssh connection (ControlPersist) after it, so `db` of
    // one scenario never reuses one to `db` of another; the ssh config knows it as the machine too
    ...hosts.map((h) => `${h.alias} snaplab_machine=${h.machine} ansible_host=${hostName(home, h.machine)}`),
    '',
    ...[...groups].flatMap(([g, members]) => [`[${g}]`, ...members, '']),
    '[all:vars]',
    `ansible_ssh_common_args=-F ${shellArg(configPath)}`,
    'ansible_user=root',
    '',
  ].join('\n');
}

/** The same inventory in Ansible's JSON form (`ansible-inventory --list`). */
export function inventoryJson(home: string, configPath: string, hosts: SshHost[]): Record<string, unknown> {
  const out: Record<string, unknown> = {
    _meta: {
      hostvars: Object.fromEntries(
        hosts.map((h) => [h.alias, { snaplab_machine: h.machine, ansible_host: hostName(home, h.machine) }]),
      ),
    },
    all: {
      hosts: hosts.map((h) => h.alias),
      vars: { ansible_ssh_common_args: `-F ${shellArg(configPath)}`, ansible_user: 'root' },
      children: [] as string[],
    },
  };
  for (const h of hosts) {
    for (const g of h.groups) {
      const grp = (out[g] ??= { hosts: [] as string[] }) as { hosts: string[] };
      grp.hosts.push(h.alias);
      const children = (out.all as { children: string[] }).children;
      if (!children.includes(g)) children.push(g);
    }
  }
  return out;
}

/** Writes HOME/ssh/TARGET.config (and .ini) and returns their paths and the config's text. */
export async function writeSshFiles(
  home: string,
  target: string,
  hosts: SshHost[],
): Promise<{ config: string; inventory: string; key: string; text: string }> {
  const key = sshKey(home);
  for (const h of hosts) await authorize(h.box, key.public);
  const base = join(home, 'ssh', target.replace(/\//g, '.'));
  const config = `${base}.config`;
  const inventory = `${base}.ini`;
  const text = sshConfig(home, key.private, hosts);
  await writeFile(config, text, { mode: 0o600 });
  await writeFile(inventory, inventoryIni(home, config, hosts), { mode: 0o600 });
  return { config, inventory, key: key.private, text };
}
