import { readFileSync } from 'node:fs';
import type { Availability } from '../probe-types.js';

/** The host's settings that decide who may make a user namespace, and what bounds each machine. */
export interface UsernsPolicy {
  /** user.max_user_namespaces: 0 refuses every user namespace, root's too */
  maxUserNamespaces?: number;
  /** Debian and older Ubuntu kernels: kernel.unprivileged_userns_clone (0: CAP_SYS_ADMIN needed) */
  unprivilegedClone?: number;
  /** Ubuntu 23.10 and later: kernel.apparmor_restrict_unprivileged_userns (1: restricted) */
  apparmorRestrict?: number;
  /** fs.inotify.max_user_instances: each machine's total, charged to its base uid */
  inotifyInstances?: number;
}

const SYSCTLS: Record<keyof UsernsPolicy, string> = {
  maxUserNamespaces: '/proc/sys/user/max_user_namespaces',
  unprivilegedClone: '/proc/sys/kernel/unprivileged_userns_clone',
  apparmorRestrict: '/proc/sys/kernel/apparmor_restrict_unprivileged_userns',
  inotifyInstances: '/proc/sys/fs/inotify/max_user_instances',
};

/** This host's settings; a sysctl this kernel does not have is left out. */
export function readUsernsPolicy(): UsernsPolicy {
  const p: UsernsPolicy = {};
  for (const [k, path] of Object.entries(SYSCTLS) as [keyof UsernsPolicy, string][]) {
    try {
      p[k] = Number(readFileSync(path, 'utf8').trim());
    } catch {
      // absent on this kernel (or not readable): it restricts nothing
    }
  }
  return p;
}

/**
 * What these settings mean for snaplab. Its launcher makes each machine's user namespace as the
 * machine's base uid holding CAP_SYS_ADMIN (native/userns.c become_owner), which both restrictions
 * allow: they apply to unprivileged creators. What they still restrict is nested namespaces made
 * inside a system machine (rootless podman, systemd's PrivateUsers=).
 */
export function usernsPolicyVerdict(p: UsernsPolicy): Availability {
  if (p.maxUserNamespaces === 0)
    return {
      ok: false,
      reason: 'user.max_user_namespaces is 0: no user namespace can be made, not even by root',
      fix: 'sysctl -w user.max_user_namespaces=65536 (or create with --no-userns: root inside is then host root)',
    };
  const limits: string[] = [];
  if (p.unprivilegedClone === 0) limits.push('kernel.unprivileged_userns_clone=0');
  if (p.apparmorRestrict === 1) limits.push('kernel.apparmor_restrict_unprivileged_userns=1');
  const bound = `each machine's user namespace is owned by its base uid, its kernel objects counted there against the host's per-user limits (user.max_user_namespaces=${p.maxUserNamespaces ?? '?'}, fs.inotify.max_user_instances=${p.inotifyInstances ?? '?'})`;
  if (limits.length === 0) return { ok: true, reason: `unprivileged user namespaces allowed; ${bound}` };
  const nested =
    p.unprivilegedClone === 0
      ? 'nested user namespaces inside system machines are refused (rootless podman, systemd PrivateUsers=)'
      : 'inside system machines only root may make nested user namespaces';
  return {
    ok: true,
    reason: `unprivileged user namespaces are restricted (${limits.join(', ')}): snaplab's launcher keeps CAP_SYS_ADMIN as it makes each machine's, so machines start; ${nested}; ${bound}`,
    ...(p.unprivilegedClone === 0
      ? { fix: 'only if machines need nested user namespaces: sysctl -w kernel.unprivileged_userns_clone=1' }
      : {}),
  };
}
