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
