import type { Command } from 'commander';
import { DEFAULT_DRIVER, DEFAULT_IMAGE } from '../defaults.js';
import { DRIVER_NAMES } from '../drivers/registry.js';
import { withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';

export function registerPrepare(program: Command): void {
  program
    .command('prepare')
    .description(
      'fetch and build ahead of time what machines need, so that nothing is downloaded at run time (the image; for --driver qemu the guest kernel and initramfs)',
    )
    .option('--driver <name>', DRIVER_NAMES.join(' or '), DEFAULT_DRIVER)
    .option('--image <name>', 'image to make ready', DEFAULT_IMAGE)
    .option('--json', 'print JSON')
    .action((o: CommonOptions & { driver: string; image: string }) =>
      withLab(o, async (lab) => {
        const r = await lab.prepare({ driver: o.driver, image: o.image }, (s) => process.stderr.write(`… ${s}\n`));
        if (o.json) return printJson(r);
        process.stdout.write(
          `ready: image ${r.image}${r.vm ? `; guest kernel ${r.vm.version}, initramfs ${r.vm.initramfs}` : ''}\n`,
        );
      }),
    );
}
