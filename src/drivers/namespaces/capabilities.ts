/**
 * Capabilities a sandbox's processes keep: Docker's default set without CAP_MKNOD.
 * Docker can grant MKNOD because its devices cgroup forbids opening the nodes made; snaplab does
 * not manage a devices cgroup, so a block device node made inside could reach the host's disks.
 * Everything else (SYS_ADMIN, SYS_MODULE, SYS_TIME, NET_ADMIN, SYS_PTRACE, ...) is dropped from the
 * bounding set too, so no exec can regain it.
 */
export const SANDBOX_CAPABILITIES = [
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_FSETID',
  'CAP_FOWNER',
  'CAP_NET_RAW',
  'CAP_SETGID',
  'CAP_SETUID',
  'CAP_SETFCAP',
  'CAP_SETPCAP',
  'CAP_NET_BIND_SERVICE',
  'CAP_SYS_CHROOT',
  'CAP_KILL',
  'CAP_AUDIT_WRITE',
] as const;

/**
 * The bounding set of a system machine (its init and every service and command): what
 * systemd-nspawn gives a container by default. More than a sandbox's (SYS_ADMIN for systemd's own
 * mounts, SYS_RESOURCE, SYS_PTRACE, ...), all of it over the machine's own user namespace and
 * namespaces only; not SYS_RAWIO, SYS_MODULE, SYS_TIME, MKNOD, NET_ADMIN over the host. Units
 * that need more (sys-kernel-debug.mount) are skipped by their conditions.
 * SYS_PTRACE stays although it lets the machine's root take the agent's descriptors
 * (pidfd_getfd passes non-dumpable for its holders), the host's listening socket among them:
 * without it systemd cannot write the maps of units with PrivateUsers= (Debian's redis-server
 * failed, status 217/USER). The way out is an agent outside the machine's user namespace
 * (docs/architecture.md, System machines: open).
 */
export const SYSTEM_CAPABILITIES = [
  'CAP_AUDIT_CONTROL',
  'CAP_AUDIT_WRITE',
  'CAP_CHOWN',
  'CAP_DAC_OVERRIDE',
  'CAP_DAC_READ_SEARCH',
  'CAP_FOWNER',
  'CAP_FSETID',
  'CAP_IPC_OWNER',
  'CAP_KILL',
  'CAP_LEASE',
  'CAP_LINUX_IMMUTABLE',
  'CAP_NET_BIND_SERVICE',
  'CAP_NET_BROADCAST',
  'CAP_NET_RAW',
  'CAP_SETFCAP',
  'CAP_SETGID',
  'CAP_SETPCAP',
  'CAP_SETUID',
  'CAP_SYS_ADMIN',
  'CAP_SYS_BOOT',
  'CAP_SYS_CHROOT',
  'CAP_SYS_NICE',
  'CAP_SYS_PTRACE',
  'CAP_SYS_RESOURCE',
  'CAP_SYS_TTY_CONFIG',
] as const;
