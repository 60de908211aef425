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

/**
 * Every command, in help order, with the names it registers. Only the invoked one is set up
 * (commander's definitions are a measurable part of a start-up that scripts pay on every call);
 * help, an unknown command or none registers them all. commands.test.ts keeps the names true.
 */
export const COMMANDS: [string[], (p: Command) => void][] = [
  [['doctor'], registerDoctor],
  [['prepare'], registerPrepare],
  [['image'], registerImage],
  [['create'], registerCreate],
  [['exec'], registerExec],
  [['shell'], registerShell],
  [['cp'], registerCp],
  [['port-forward', 'proxy'], registerPorts],
  [['ssh-config', 'inventory'], registerSsh],
  [['_exec-lost'], registerExecLost],
  [['_exec-error'], registerExecError],
  [['snapshot'], registerSnapshot],
  [['restore'], registerRestore],
  [['ls', 'rm', 'stop', 'pause', 'resume'], registerLifecycle],
  [['logs'], registerLogs],
  [['gc'], registerGc],
  [['df'], registerDf],
  [['trace'], registerTrace],
  [['up', 'status', 'down', 'reset', 'net'], registerScenario],
  [['pool'], registerPool],
  [['run'], registerRun],
  [['serve'], registerServe],
  [['key'], registerKey],
  [['cluster'], registerCluster],
  [['ui'], registerUi],
  [['bench'], registerBench],
  [['demo'], registerDemo],
];
