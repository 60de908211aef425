import type { Command } from 'commander';
import { SnaplabError } from '../errors.js';
import { formatBytes } from '../lab/sizes.js';
import { interruptible, withLab, type CommonOptions } from './common.js';
import { printJson } from './output.js';
import { templateRecipe, TEMPLATES } from '../image/templates.js';

interface BuildCli extends CommonOptions {
  suite: string;
  packages?: string;
  variant: string;
  name?: string;
  mirror?: string;
  rebuild?: boolean;
}

/** ^C during a build: mmdebstrap runs in a process group of its own, killed 15 s after if it has not stopped */
const BUILD_STOP = {
  still: 'still stopping the build (undoing its mounts)',
  left: 'its mounts and files may be left: `snaplab gc` removes them',
  error: new SnaplabError('ABORTED', 'the build was interrupted', 'nothing of it was kept; run it again'),
};

/** A built-in template is built as it is defined: the options that would change it are refused. */
function checkTemplateOptions(name: string, o: BuildCli): void {
  if (
    o.packages !== undefined ||
    o.name !== undefined ||
    o.mirror !== undefined ||
    o.suite !== 'bookworm' ||
    o.variant !== 'minbase'
  )
    throw new SnaplabError(
      'BAD_INPUT',
      `${name} is a built-in template: it takes no --packages, --name, --mirror, --suite or --variant`,
      `\`snaplab image build ${name}\` builds it as defined; for another image: \`snaplab image build debian --packages … --name NAME\``,
    );
}

export function registerImageBuild(image: Command): void {
  image
    .command('build <distribution>')
    .description(
      `build an image from a distribution's archive: \`debian\` (mmdebstrap, from the host's apt sources), or a built-in template (${TEMPLATES.map((t) => t.name).join(', ')}: built on first use otherwise); cached by its inputs`,
    )
    .option('--suite <suite>', 'Debian suite or codename', 'bookworm')
    .option('--packages <list>', 'extra packages, comma-separated (e.g. nginx,openssh-server,python3)')
    .option(
      '--variant <variant>',
      "mmdebstrap's package set: minbase (required + apt), important, standard, …",
      'minbase',
    )
    .option('--name <name>', 'image name (default debian-SUITE[-VARIANT][-HASH])')
    .option('--mirror <url>', "one mirror instead of the host's apt sources")
    .option('--rebuild', 'build again even if an image of the same inputs exists')
    .option('--json', 'print JSON')
    .action((distribution: string, o: BuildCli) =>
      withLab(o, async (lab) => {
        const recipe = templateRecipe(distribution);
        if (distribution !== 'debian' && !recipe)
          throw new SnaplabError(
            'BAD_INPUT',
            `cannot build ${JSON.stringify(distribution)} images`,
            `snaplab image build debian --suite bookworm, or a built-in template: ${TEMPLATES.map((t) => t.name).join(', ')}`,
          );
        if (recipe) checkTemplateOptions(distribution, o);
        const started = performance.now();
        const packages = (o.packages ?? '')
          .split(',')
          .map((p) => p.trim())
          .filter(Boolean);
        const onProgress = o.json ? undefined : (s: string): void => void process.stderr.write(`… ${s}\n`);
        const r = await interruptible(BUILD_STOP, (signal) =>
          recipe
            ? lab.buildTemplate(recipe.name, { rebuild: o.rebuild, onProgress, signal })
            : lab.buildImage(
                { suite: o.suite, variant: o.variant, packages, mirror: o.mirror },
                { name: o.name, rebuild: o.rebuild, onProgress, signal },
              ),
        );
        const seconds = (performance.now() - started) / 1000;
        if (o.json) return printJson({ ...r.image, cached: r.cached, seconds, log: r.log });
        process.stdout.write(
          `${r.cached ? 'cached' : 'built'} ${r.image.name} (${formatBytes(r.image.sizeBytes)}) in ${seconds.toFixed(1)} s${r.log ? `; log: ${r.log}` : ''}\n`,
        );
      }),
    );
}
