/**
 * The parsed form of a scenario file (docs/scenario-file.md): every default applied, every
 * address resolved, every path absolute. The orchestrator consumes this and nothing else.
 */
export interface ScenarioSpec {
  name?: string;
  /** 0: no standby copy (resets raise the machines again); absent or 1: a standby (scenario/standby.ts) */
  standby?: 0 | 1;
  /** In file order. */
  networks: NetworkSpec[];
  /** In file order. */
  machines: MachineFileSpec[];
}

export interface NetworkSpec {
  name: string;
  /** CIDR as written, e.g. 10.10.1.0/24. */
  subnet: string;
  prefix: number;
  /** its machines' egress (docs/egress.md) with these lists; absent: none */
  uplink?: { allow: string[]; deny: string[] };
}

export interface MachineFileSpec {
  name: string;
  /** Default DEFAULT_IMAGE (src/defaults.ts); with `build`, the name it is built under ('' until `up` builds it, when the file names none). */
  image: string;
  /** how the image is made, when the file says (`up` builds it, cached by its inputs) */
  build?: ImageBuildSpec;
  /** Default: the machine's name. */
  hostname: string;
  limits: { memoryBytes?: number; pids?: number; cpus?: number; diskBytes?: number };
  env: Record<string, string>;
  /** Every address resolved (fixed in the file, or deterministic: see assignAddresses). */
  networks: { network: string; address: string; prefix: number }[];
  /** Run once at `up`, in order; their effect is in the filesystem and so in every snapshot. */
  provision: Step[];
  /**
   * Run at `up` after provision and after every reset of a namespace machine: its snapshot keeps
   * files, not processes (a VM's keeps its memory: its services are running after a reset, and
   * its start steps are not run again). Each must return (services run in the background).
   */
  start: Step[];
  ready: Check[];
  /** 'systemd': a system machine (the image's systemd as PID 1); absent: the agent is PID 1 */
  init?: 'systemd';
  /** a driver's name (drivers/registry.ts); 'qemu': a VM on the scenario's networks (a tap in its network namespace); absent: `up --driver`'s, else DEFAULT_DRIVER */
  driver?: string;
  /** forwarded from 127.0.0.1 while `snaplab up --ports` (or `port-forward SCENARIO`) runs */
  ports?: { local: number; remote: number }[];
  /** Ansible groups in `snaplab inventory` (each network the machine is on is one too) */
  groups?: string[];
}

export type Step =
  | { copy: { from: string; to: string; mode: number } }
  | { run: { argv: string[]; timeoutMs: number; env: Record<string, string> } };

export type Check =
  | { kind: 'command'; argv: string[]; timeoutMs: number }
  | { kind: 'tcp'; port: number; host?: string; timeoutMs: number }
  | { kind: 'file'; path: string; timeoutMs: number }
  | { kind: 'log'; file: string; line: string; timeoutMs: number }
  /** a system machine's unit is active (systemctl is-active) */
  | { kind: 'unit'; unit: string; timeoutMs: number }
  /** a system machine's whole system is up (systemctl is-system-running: running) */
  | { kind: 'systemd'; state: 'running'; timeoutMs: number };

export interface LoadedScenario {
  spec: ScenarioSpec;
  path: string;
  dir: string;
  text: string;
  /** sha256 hex of the file's bytes. */
  hash: string;
}

/** Deterministic addresses start at this host number of each subnet. */
export const FIRST_AUTO_HOST = 10;

/** Names of scenarios, machines and networks: short enough for interface and host names. */
export const SCENARIO_NAME = /^[a-z0-9][a-z0-9-]{0,30}$/;
export const NAME_RULE = 'use 1-31 lowercase letters, digits or "-", starting with a letter or digit';

/** Ansible's own group names: a scenario's groups may not take them (`snaplab inventory`). */
export const RESERVED_GROUPS: readonly string[] = ['all', 'ungrouped', '_meta'];

/** A machine's image as the scenario file says it is built: Debian's archive, through mmdebstrap. */
export interface ImageBuildSpec {
  suite: string;
  variant: string;
  packages: string[];
}
