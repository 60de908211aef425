import type { Command } from 'commander';
import { registerCreate, registerRestore } from './create.js';
import { registerDoctor } from './doctor.js';
import { registerExec, registerExecError, registerExecLost, registerShell } from './exec.js';
import { registerGc } from './gc.js';
import { registerImage } from './image.js';
import { registerLifecycle } from './lifecycle.js';
import { registerSnapshot } from './snapshot.js';
import { registerTrace } from './trace.js';
import { registerBench } from './bench.js';
import { registerDemo } from './demo.js';
import { registerDf } from './df.js';
import { registerPool } from './pool.js';
import { registerRun } from './run.js';
import { registerScenario } from './scenario.js';
import { registerPrepare } from './prepare.js';
import { registerLogs } from './logs.js';
import { registerCp } from './cp.js';
import { registerPorts } from './ports.js';
import { registerSsh } from './ssh.js';
import { registerServe } from './serve.js';
import { registerKey } from './keys.js';
import { registerCluster } from './cluster.js';
import { registerUi } from './ui.js';
import { registerEgress } from './egress.js';
import { registerMcp } from './mcp.js';

/**
 * Where a command runs: `lab` ones are written over the Lab API, so they run on the embedded lab
 * or, with SNAPLAB_HOST, through a daemon; `local` ones need the embedded lab (refused through a
 * daemon); `host` ones are the daemon's host's own (serve, key, ui), whatever SNAPLAB_HOST says.
 */
export type Reach = 'lab' | 'local' | 'host';

/**
 * Every command, in help order, with the names it registers and its reach. Only the invoked one
 * is set up (commander's definitions are a measurable part of a start-up that scripts pay on
 * every call); help, an unknown command or none registers them all. commands.test.ts keeps the
 * names true.
 */
export const COMMANDS: [string[], (p: Command) => void, Reach][] = [
  [['doctor'], registerDoctor, 'local'],
  [['prepare'], registerPrepare, 'local'],
  [['image'], registerImage, 'local'],
  [['create'], registerCreate, 'lab'],
  [['exec'], registerExec, 'lab'],
  [['shell'], registerShell, 'lab'],
  [['cp'], registerCp, 'local'],
  [['port-forward', 'proxy'], registerPorts, 'local'],
  [['ssh-config', 'inventory'], registerSsh, 'local'],
  [['_exec-lost'], registerExecLost, 'local'],
  [['_exec-error'], registerExecError, 'local'],
  [['snapshot'], registerSnapshot, 'lab'],
  [['restore'], registerRestore, 'lab'],
  [['egress'], registerEgress, 'lab'],
  [['ls', 'rm', 'pause', 'resume', 'stop', 'start'], registerLifecycle, 'lab'],
  [['logs'], registerLogs, 'local'],
  [['gc'], registerGc, 'local'],
  [['df'], registerDf, 'local'],
  [['trace'], registerTrace, 'local'],
  [['up', 'status', 'down', 'reset', 'standby', 'net'], registerScenario, 'local'],
  [['pool'], registerPool, 'local'],
  [['run'], registerRun, 'local'],
  [['serve'], registerServe, 'host'],
  [['key'], registerKey, 'host'],
  [['cluster'], registerCluster, 'local'],
  [['ui'], registerUi, 'host'],
  [['mcp'], registerMcp, 'lab'],
  [['bench'], registerBench, 'local'],
  [['demo'], registerDemo, 'local'],
];
