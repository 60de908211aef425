/**
 * `snaplab egress SANDBOX`: a machine's outbound network (docs/egress.md): shown with its
 * counters, or its lists replaced. The create-time flags (`--egress`, `--allow-out`,
 * `--deny-out`) are here too, shared by create and restore.
 */
import type { Command } from 'commander';
import type { EgressRequest, EgressUsage } from '../sdk/api.js';
import { withApi, type CommonOptions } from './common.js';
import { printJson } from './output.js';

/** Entries given as repeated flags, each possibly a comma-separated list ('' clears). */
const collectList = (v: string, prev: string[] | undefined): string[] => [
  ...(prev ?? []),
  ...v
    .split(',')
    .map((x) => x.trim())
    .filter(Boolean),
];

export interface EgressFlags {
  egress?: boolean;
  allowOut?: string[];
  denyOut?: string[];
}

export function addEgressFlags(cmd: Command): Command {
  return cmd
    .option('--egress', "outbound network through snaplab's router (default: loopback only; docs/egress.md)")
    .option(
      '--allow-out <addr>',
      'with egress: reach only these IPv4 addresses or prefixes (repeatable, or a,b)',
      collectList,
    )
    .option('--deny-out <addr>', 'with egress: never reach these (repeatable; deny wins over allow)', collectList);
}

/** What the flags ask: undefined (no egress), true, or lists (either list implies --egress). */
export function egressFrom(o: EgressFlags): boolean | EgressRequest | undefined {
  if (o.allowOut === undefined && o.denyOut === undefined) return o.egress ? true : undefined;
  return { allow: o.allowOut ?? [], deny: o.denyOut ?? [] };
}

function printUsage(name: string, u: EgressUsage): void {
  const list = (xs: string[], none: string): string => (xs.length ? xs.join(', ') : none);
  process.stdout.write(
    [
      `${name}: egress from ${u.address}`,
      `  allow: ${list(u.allow, 'anything not denied (the host, private and link-local networks are, unless allowed)')}`,
      `  deny:  ${list(u.deny, 'nothing more')}`,
      `  out:   ${u.bytesOut} bytes, ${u.connections} connections let through, ${u.denied} refused`,
      '',
    ].join('\n'),
  );
}

export function registerEgress(program: Command): void {
  program
    .command('egress <sandbox>')
    .description("show a sandbox's outbound network and its counters, or replace its allow or deny list")
    .option('--allow <addr>', "reach only these (repeatable, or a,b; '' clears: anything not denied)", collectList)
    .option('--deny <addr>', "never reach these (repeatable, or a,b; '' clears)", collectList)
    .option('--json', 'print it as JSON')
    .action((sandbox: string, o: CommonOptions & { allow?: string[]; deny?: string[] }) =>
      withApi(o, async (lab) => {
        const box = await lab.get(sandbox);
        try {
          if (o.allow !== undefined || o.deny !== undefined) {
            const now = box.egress;
            await box.setEgress({ allow: o.allow ?? now?.allow ?? [], deny: o.deny ?? now?.deny ?? [] });
          }
          const u = await box.egressUsage();
          if (o.json) printJson(u);
          else printUsage(box.name, u);
        } finally {
          box.close();
        }
      }),
    );
}
