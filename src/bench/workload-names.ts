/** The workloads' names alone: what the command line needs to declare and check its options. */
export type Workload = 'fresh-exec' | 'exec' | 'raise' | 'snapshot' | 'restore' | 'scenario-up' | 'scenario-reset';
export const WORKLOADS: readonly Workload[] = [
  'fresh-exec',
  'exec',
  'raise',
  'snapshot',
  'restore',
  'scenario-up',
  'scenario-reset',
];
export const SCENARIO_WORKLOADS: readonly Workload[] = ['scenario-up', 'scenario-reset'];
