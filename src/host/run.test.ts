import { describe, expect, it } from 'vitest';
import { run, spawnError } from './run.js';

describe('run', () => {
  it('a program that is not installed is MISSING_TOOL with its Debian package, from tools.json', async () => {
    // nft's name on a PATH that has no nft: what a host without nftables meets
    const env = { ...process.env, PATH: '/nonexistent' };
    await expect(run('nft', ['list', 'tables'], { env })).rejects.toMatchObject({
      code: 'MISSING_TOOL',
      message: expect.stringMatching(/^nft is not installed \(egress: /),
      hint: expect.stringMatching(/^apt-get install nftables /),
    });
    const enoent = Object.assign(new Error('spawn x ENOENT'), { code: 'ENOENT' });
    expect(spawnError('not-in-the-list', enoent)).toMatchObject({
      code: 'MISSING_TOOL',
      hint: 'install the package that provides not-in-the-list',
    });
  });

  it('a working directory that is not there is not a missing program', async () => {
    await expect(run('true', [], { cwd: '/nonexistent/dir' })).rejects.toMatchObject({ code: 'HOST_COMMAND_FAILED' });
  });

  it('a failed command carries what it said', async () => {
    await expect(run('sh', ['-c', 'echo nope >&2; exit 3'])).rejects.toMatchObject({
      code: 'HOST_COMMAND_FAILED',
      message: 'sh -c echo nope >&2; exit 3 exited 3: nope',
    });
  });
});
