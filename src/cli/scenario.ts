import { type Command, Option } from 'commander';
import { DEFAULT_DRIVER } from '../defaults.js';
import { DRIVER_NAMES } from '../drivers/registry.js';
import { SnaplabError } from '../errors.js';
import { parseSeconds } from '../lab/sizes.js';
import type { TraceSummary } from '../timing/trace.js';
import type { ScenarioStatus } from '../views.js';
import { addTraceOption, showTrace, withLab, type CommonOptions } from './common.js';
import { ms, printJson, table } from './output.js';

/** Per machine: the time of each of its phases (raise, provision, start, ready) from the up/reset trace. */
export function machinePhaseTable(t: TraceSummary, machines: string[]): string {
  const rows = machines.map((m) => {
    const get = (p: string): string => {
      const ph = t.phases.find((x) => x.name === `${p} ${m}`);
      return ph ? ms(ph.endMs - ph.startMs) : '-';
    };
    return [m, get('raise'), get('provision'), get('start'), get('ready')];
  });
  return table(['MACHINE', 'RAISE', 'PROVISION', 'START', 'READY'], rows);
}

function progressPrinter(json: boolean): (machine: string, status: string) => void {
  const t0 = Date.now();
  return (machine, status) => {
    if (!json) process.stderr.write(`  ${((Date.now() - t0) / 1000).toFixed(2)}s  ${machine.padEnd(12)} ${status}\n`);
  };
}

export function registerScenario(program: Command): void {
  registerUp(program);
  registerStatus(program);
  registerDown(program);
  registerReset(program);
  registerStandby(program);
  registerNet(program);
}

function registerUp(program: Command): void {
  const up = program
    .command('up <file>')
    .description('raise a scenario: networks, machines in parallel, provisioning, start steps, readiness')
    .option('--name <name>', "name of the scenario (default: the file's `name`)")
    .option(
      '--driver <name>',
      `the driver of machines whose file names none: ${DRIVER_NAMES.join(', ')} (qemu: VMs on the scenario networks)`,
      DEFAULT_DRIVER,
    )
    .option('--keep-on-failure', 'leave what was raised when a step or check fails, to debug it')
    .option(
      '--ports',
      "then stay in the foreground holding the machines' `ports:` on 127.0.0.1 until Ctrl-C (the scenario stays up)",
    )
    .option('--json', 'print the status as JSON');
  addTraceOption(up);
  up.action(
    (file: string, o: CommonOptions & { name?: string; keepOnFailure?: boolean; ports?: boolean; driver: string }) =>
      withLab(o, async (lab) => {
        const s = await lab.up(file, {
          name: o.name,
          driver: o.driver,
          keepOnFailure: o.keepOnFailure,
          onProgress: progressPrinter(!!o.json),
        });
        const st = await s.status();
        if (o.json) printJson({ ...st, operation: s.lastTrace?.id, upMs: s.lastTrace?.totalMs });
        else
          process.stdout.write(
            `scenario ${s.name} is up in ${ms(s.lastTrace?.totalMs ?? 0)}\n\n${machinePhaseTable(
              s.lastTrace!,
              st.machines.map((m) => m.machine),
            )}\n`,
          );
        showTrace(o, s.lastTrace);
        const declared = s.spec.machines.some((m) => m.ports?.length);
        if (o.ports) {
          const { holdForwards } = await import('./ports.js');
          return holdForwards(lab, s.name, [], !!o.json);
        }
        if (declared && !o.json)
          process.stdout.write(
            `\nports are declared: hold them with \`snaplab port-forward ${s.name}\` (or \`up --ports\`)\n`,
          );
      }),
  );
}

/** What `status` says of a scenario's standby. */
function standbyLine(st: ScenarioStatus): string {
  const s = st.standby;
  if (!s) return st.standbyWanted ? 'none yet' : 'off';
  const took = s.raiseMs === null ? '' : `, raised in ${ms(s.raiseMs)}`;
  return `${s.state} (of ${s.snapshot}${took}${s.reason ? `: ${s.reason}` : ''})`;
}

function registerStatus(program: Command): void {
  program
    .command('status [scenario]')
    .description('scenarios, their machines, states and addresses')
    .option('--json', 'print JSON')
    .action((name: string | undefined, o: CommonOptions) =>
      withLab(o, async (lab) => {
        const list = name ? [lab.scenario(name)] : lab.scenarios();
        const all = await Promise.all(list.map((s) => s.status()));
        if (o.json) return printJson(name ? all[0] : all);
        if (!all.length) return void process.stdout.write('no scenario is up\n');
        for (const st of all) {
          process.stdout.write(
            `${st.name}: ${st.state}${st.reason ? ` (${st.reason})` : ''}; snapshots: ${st.snapshots.join(', ') || 'none'}; standby: ${standbyLine(st)}\n`,
          );
          process.stdout.write(
            `${table(
              ['MACHINE', 'STATE', 'ADDRESSES'],
              st.machines.map((m) => [
                m.machine,
                m.state,
                m.addresses.map((a) => `${a.address} (${a.network})`).join(', '),
              ]),
            )}\n\n`,
          );
        }
      }),
    );
}

function registerDown(program: Command): void {
  const down = program
    .command('down <scenario>')
    .description('remove a scenario: machines, snapshots, bridges, veths, namespaces')
    .option('--json', 'print JSON');
  addTraceOption(down);
  down.action((name: string, o: CommonOptions) =>
    withLab(o, async (lab) => {
      const t = await lab.scenario(name).down();
      if (o.json) printJson({ removed: name, operation: t.id });
      else process.stdout.write(`scenario ${name} is down (${ms(t.totalMs)})\n`);
      showTrace(o, t);
    }),
  );
}

function registerReset(program: Command): void {
  const reset = program
    .command('reset <scenario>')
    .description(
      'every machine back to a snapshot (default: the latest), usable, addresses intact, readiness re-checked',
    )
    .option('--to <snapshot>', 'the scenario snapshot to go back to')
    .option(
      '--standby <0|1>',
      "0: raise the machines again, keep no standby (default: the scenario's setting)",
      standbyFlag,
    )
    .option('--json', 'print JSON');
  addTraceOption(reset);
  reset.action((name: string, o: CommonOptions & { to?: string; standby?: 0 | 1 }) =>
    withLab(o, async (lab) => {
      const s = lab.scenario(name);
      const r = await s.reset(o.to, o.standby === undefined ? {} : { standby: o.standby });
      if (o.json)
        return printJson({
          scenario: name,
          snapshot: r.snapshot,
          resetMs: r.trace.totalMs,
          standby: r.standby,
          operation: r.trace.id,
        });
      const how = r.standby === 'swapped' ? 'its standby swapped in' : `raised again (${r.standby.slice(6)})`;
      process.stdout.write(`scenario ${name} reset to ${r.snapshot} in ${ms(r.trace.totalMs)}: ${how}\n`);
      showTrace(o, r.trace);
    }),
  );
}

/** `--standby 0|1`. */
export function standbyFlag(v: string): 0 | 1 {
  if (v === '0' || v === '1') return Number(v) as 0 | 1;
  throw new SnaplabError('BAD_INPUT', `--standby takes 0 or 1, not ${JSON.stringify(v)}`, 'e.g. --standby 0');
}

function registerStandby(program: Command): void {
  const cmd = program
    .command('standby <scenario>')
    .description(
      "raise the scenario's standby now (a copy from its latest snapshot that the next reset swaps in), or --off: keep none",
    )
    .option('--off', 'remove the standby and keep none (snapshots and resets raise none until `snaplab standby NAME`)')
    .addOption(new Option('--worker <id>', 'raise the standby a snapshot or reset queued (internal)').hideHelp())
    .option('--json', 'print JSON');
  addTraceOption(cmd);
  cmd.action((name: string, o: CommonOptions & { off?: boolean; worker?: string }) =>
    withLab(o, async (lab) => {
      const s = lab.scenario(name);
      if (o.off) {
        await s.removeStandby();
        if (o.json) return printJson({ scenario: name, standby: null });
        process.stdout.write(`scenario ${name}: no standby\n`);
        return;
      }
      const t = await s.raiseStandby(o.worker === undefined ? {} : { worker: o.worker });
      if (!t) return;
      if (o.json) return printJson({ scenario: name, standby: 'ready', raiseMs: t.totalMs, operation: t.id });
      process.stdout.write(`scenario ${name}: standby ready in ${ms(t.totalMs)}\n`);
      showTrace(o, t);
    }),
  );
}

function registerNet(program: Command): void {
  const net = program.command('net').description('network faults between the machines of a scenario');
  net
    .command('block <scenario> <a> <b>')
    .description('drop traffic between machines a and b')
    .action((s: string, a: string, b: string) => withLab({}, async (lab) => lab.scenario(s).block(a, b)));
  net
    .command('unblock <scenario> <a> <b>')
    .description('let traffic between a and b through again')
    .action((s: string, a: string, b: string) => withLab({}, async (lab) => lab.scenario(s).unblock(a, b)));
  net
    .command('partition <scenario> <groups...>')
    .description('split machines into groups that cannot reach each other, e.g. `net partition lab a,b c,d`')
    .action((s: string, groups: string[]) =>
      withLab({}, async (lab) => {
        if (groups.length < 2)
          throw new SnaplabError(
            'BAD_INPUT',
            'a partition needs at least two groups',
            'e.g. snaplab net partition lab client,proxy server,store',
          );
        await lab.scenario(s).partition(...groups.map((g) => g.split(',').filter(Boolean)));
      }),
    );
  net
    .command('heal <scenario>')
    .description('undo every block and partition')
    .action((s: string) => withLab({}, async (lab) => lab.scenario(s).heal()));
  net
    .command('impair <scenario> <machine>')
    .description("add delay and loss on a machine's interfaces (tc netem; see `snaplab doctor`)")
    .option('--delay <seconds>', 'added latency, e.g. 0.1')
    .option('--jitter <seconds>', 'latency variation')
    .option('--loss <percent>', 'packet loss, e.g. 5')
    .option('--clear', 'remove the impairment')
    .action((s: string, m: string, o: { delay?: string; jitter?: string; loss?: string; clear?: boolean }) =>
      withLab({}, async (lab) => {
        if (o.clear) return lab.scenario(s).impair(m, null);
        const lossPct = o.loss === undefined ? undefined : Number(o.loss);
        if (lossPct !== undefined && !(lossPct >= 0 && lossPct <= 100))
          throw new SnaplabError('BAD_INPUT', `invalid loss ${o.loss}`, 'give a percentage between 0 and 100');
        if (o.delay === undefined && o.loss === undefined)
          throw new SnaplabError('BAD_INPUT', 'nothing to impair', 'give --delay, --loss, or --clear');
        await lab.scenario(s).impair(m, {
          delayMs: o.delay === undefined ? undefined : parseSeconds(o.delay, 'delay'),
          jitterMs: o.jitter === undefined ? undefined : parseSeconds(o.jitter, 'jitter'),
          lossPct,
        });
      }),
    );
}
