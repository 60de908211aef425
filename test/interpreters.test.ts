/**
 * The fronts' record of the interpreter servers they started (src/interpreter/server.ts): a
 * sandbox destroyed or ended out of sight is forgotten, so a long MCP session does not keep
 * every sandbox it ever ran code in. Real machines; busybox's httpd listens on the server's port,
 * so a start's probe finds a server "running" without building the interpreter image.
 */
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, expect, it } from 'vitest';
import { Interpreters } from '../src/interpreter/server.js';
import { Lab } from '../src/sdk/lab.js';
import type { LabApi, SandboxApi } from '../src/sdk/api.js';
import { cli, removeHome } from './daemon-helpers.js';

let home: string;
let lab: LabApi;

beforeAll(async () => {
  home = mkdtempSync(join(tmpdir(), 'snaplab-test-interpreters-'));
  for (const name of ['ia', 'ib']) expect(cli(home, ['create', '--name', name]).code).toBe(0);
  lab = await Lab.open({ home });
}, 120_000);

afterAll(() => {
  lab?.close();
  if (home) removeHome(home);
});

/** A machine whose probe of port 49999 succeeds: something listens there (busybox's httpd, in the background). */
async function answering(name: string): Promise<SandboxApi> {
  const box = await lab.get(name);
  expect((await box.exec(['httpd', '-p', '127.0.0.1:49999', '-h', '/tmp'])).exitCode).toBe(0);
  return box;
}

it('a destroyed sandbox is forgotten (forget), and so is one ended out of sight (retain)', async () => {
  const interpreters = new Interpreters();
  const a = await answering('ia');
  const b = await answering('ib');
  await interpreters.ensure(a);
  await interpreters.ensure(b);
  await interpreters.ensure(a); // once per sandbox
  expect(interpreters.size).toBe(2);
  // ended out of the front's sight: the next list does not have it
  await a.destroy();
  interpreters.retain((await lab.list()).map((x) => x.id));
  expect(interpreters.size).toBe(1);
  interpreters.forget(b.id);
  expect(interpreters.size).toBe(0);
  // a start that fails (nothing listens, and busybox has no python3 to start the server) is not kept
  expect((await b.exec(['killall', 'httpd'])).exitCode).toBe(0);
  await expect(interpreters.ensure(b)).rejects.toMatchObject({ code: 'AGENT_ERROR' });
  expect(interpreters.size).toBe(0);
});
