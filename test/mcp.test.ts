/** The MCP server (docs/mcp.md) driven by @modelcontextprotocol/sdk's own client: over stdio, and over a daemon's /mcp. */
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import type { CallToolResult } from '@modelcontextprotocol/sdk/types.js';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SNAPLAB } from './cli-command.js';
import { cli, removeHome, startDaemon, until, type TestDaemon } from './daemon-helpers.js';

const TOOLS = [
  'create_sandbox',
  'destroy_sandbox',
  'list_files',
  'list_sandboxes',
  'read_file',
  'restore_snapshot',
  'run_code',
  'run_command',
  'snapshot_sandbox',
  'write_file',
];

async function call(c: Client, name: string, args: Record<string, unknown>): Promise<CallToolResult> {
  return (await c.callTool({ name, arguments: args })) as CallToolResult;
}

function textOf(r: CallToolResult): string {
  return r.content.map((x) => (x.type === 'text' ? x.text : '')).join('\n');
}

/** A bad argument is an MCP error: an isError result or a JSON-RPC error, and the server answers after it. */
async function expectMcpError(c: Client, name: string, args: Record<string, unknown>): Promise<string> {
  try {
    const r = await call(c, name, args);
    expect(r.isError).toBe(true);
    return textOf(r);
  } catch (e) {
    expect((e as { code?: number }).code).toBeTypeOf('number');
    return String(e);
  }
}

/** A sandbox's files as resources: its / listed, a file read, a directory's entries. */
async function resources(c: Client, name: string): Promise<void> {
  const listed = (await c.listResources()).resources.map((r) => r.uri);
  expect(listed).toContain(`snaplab://sandbox/${name}/files/`);
  const file = await c.readResource({ uri: `snaplab://sandbox/${name}/files/tmp/note.txt` });
  expect(file.contents[0]).toMatchObject({ mimeType: 'text/plain', text: 'from mcp\n' });
  const dir = await c.readResource({ uri: `snaplab://sandbox/${name}/files/tmp` });
  expect(JSON.parse(String((dir.contents[0] as { text?: string }).text))).toContainEqual({
    name: 'note.txt',
    type: 'file',
    size: 9,
  });
  await expect(c.readResource({ uri: `snaplab://sandbox/${name}/files/nope` })).rejects.toThrow(/NOT_FOUND|no such/i);
}

/** create, run, files, list, bad arguments, destroy: the same over either transport. */
async function exercise(c: Client, ttl: Record<string, unknown>): Promise<void> {
  const names = (await c.listTools()).tools.map((t) => t.name).sort();
  expect(names).toEqual(TOOLS);
  const made = await call(c, 'create_sandbox', ttl);
  expect(made.isError).toBeFalsy();
  const id = (JSON.parse(textOf(made)) as { id: string }).id;
  const run = await call(c, 'run_command', { sandbox: id, command: 'echo hello; echo oops >&2; exit 3' });
  expect(run.structuredContent).toEqual({ exitCode: 3, stdout: 'hello\n', stderr: 'oops\n' });
  const long = await call(c, 'run_command', { sandbox: id, command: 'seq 1 1000', max_output: 10 });
  expect(textOf(long)).toContain('[snaplab: output truncated');
  expect(
    (await call(c, 'write_file', { sandbox: id, path: '/tmp/note.txt', content: 'from mcp\n' })).isError,
  ).toBeFalsy();
  expect(textOf(await call(c, 'read_file', { sandbox: id, path: '/tmp/note.txt' }))).toBe('from mcp\n');
  expect(textOf(await call(c, 'list_files', { sandbox: id, path: '/tmp' }))).toContain('note.txt');
  expect(textOf(await call(c, 'list_sandboxes', {}))).toContain(id);
  await resources(c, (JSON.parse(textOf(made)) as { name: string }).name);
  // bad arguments: a wrong type, a missing one, an unknown sandbox, a missing file
  await expectMcpError(c, 'run_command', { sandbox: id, command: 5 });
  await expectMcpError(c, 'read_file', { sandbox: id });
  expect(await expectMcpError(c, 'run_command', { sandbox: 'no-such-box', command: 'true' })).toContain('NOT_FOUND');
  expect(await expectMcpError(c, 'read_file', { sandbox: id, path: '/nope' })).toContain('NOT_FOUND');
  // run_code in an image without python (test/code-interpreter.test.ts runs it where there is one)
  const noPython = await expectMcpError(c, 'run_code', { sandbox: id, code: '1 + 1' });
  expect(noPython).toContain('no python3 in this image');
  expect(noPython).toContain('code-interpreter-v1');
  expect((await call(c, 'destroy_sandbox', { sandbox: id })).isError).toBeFalsy();
  expect(textOf(await call(c, 'list_sandboxes', {}))).not.toContain(id);
}

function boxes(home: string): unknown[] {
  const r = cli(home, ['ls', '--json']);
  expect(r.code).toBe(0);
  return JSON.parse(r.out) as unknown[];
}

describe('snaplab mcp on stdio (embedded lab)', () => {
  let home: string;
  beforeAll(() => {
    home = mkdtempSync(join(tmpdir(), 'snaplab-test-mcp-'));
  });
  afterAll(() => removeHome(home));

  const connect = async (): Promise<Client> => {
    const c = new Client({ name: 'snaplab-test', version: '0' });
    await c.connect(
      new StdioClientTransport({
        command: SNAPLAB,
        args: ['mcp'],
        env: { ...process.env, SNAPLAB_HOME: home } as Record<string, string>,
        stderr: 'pipe',
      }),
    );
    return c;
  };

  it('tools: list, create, run, write and read, list, bad arguments as MCP errors, destroy', async () => {
    const c = await connect();
    try {
      await exercise(c, {});
    } finally {
      await c.close();
    }
  }, 120_000);

  it('the sandboxes a session made are gone when its client disconnects', async () => {
    const c = await connect();
    const made = await call(c, 'create_sandbox', { name: 'mcp-left' });
    expect(made.isError).toBeFalsy();
    expect(boxes(home)).toHaveLength(1);
    await c.close();
    await until('the session end to remove its sandbox', () => boxes(home).length === 0, 30_000);
  }, 120_000);
});

describe("a daemon's /mcp (streamable HTTP, a key)", () => {
  let home: string;
  let key: string;
  let d: TestDaemon;
  beforeAll(async () => {
    home = mkdtempSync(join(tmpdir(), 'snaplab-test-mcp-http-'));
    key = cli(home, ['key', 'create', 'agent', '--scope', 'read,exec']).out.trim();
    d = await startDaemon(home);
  }, 120_000);
  afterAll(async () => {
    await d?.stop();
    removeHome(home);
  });

  const connect = async (token: string): Promise<Client> => {
    const c = new Client({ name: 'snaplab-test', version: '0' });
    await c.connect(
      new StreamableHTTPClientTransport(new URL(`${d.url}/mcp`), {
        requestInit: { headers: { Authorization: `Bearer ${token}` } },
      }),
    );
    return c;
  };

  it('tools: list, create, run, write and read, list, bad arguments as MCP errors, destroy', async () => {
    const c = await connect(key);
    try {
      await exercise(c, { ttl_seconds: 60 });
    } finally {
      await c.close();
    }
    // the tools act through the key's lab in the daemon's process: the key's only requests are to /mcp
    const mine = d
      .log()
      .split('\n')
      .filter((l) => l.includes(' key=agent'));
    expect(mine.length).toBeGreaterThan(0);
    expect(mine.filter((l) => !/ (POST|GET|DELETE) \/mcp /.test(l))).toEqual([]);
  }, 120_000);

  it("a command whose request its client left is killed, as the REST API's exec is", async () => {
    const c = await connect(key);
    const made = JSON.parse(textOf(await call(c, 'create_sandbox', { ttl_seconds: 120 }))) as { name: string };
    await c.close();
    try {
      // a tools/call of its own (stateless: no session), left before its answer
      const left = new AbortController();
      const asked = fetch(`${d.url}/mcp`, {
        method: 'POST',
        headers: {
          Authorization: `Bearer ${key}`,
          'content-type': 'application/json',
          accept: 'application/json, text/event-stream',
        },
        body: JSON.stringify({
          jsonrpc: '2.0',
          id: 1,
          method: 'tools/call',
          params: { name: 'run_command', arguments: { sandbox: made.name, command: 'sleep 600' } },
        }),
        signal: left.signal,
      }).catch((e: unknown) => e);
      const sleeping = (): boolean =>
        cli(home, ['exec', made.name, '--', 'sh', '-c', 'ps -o args | grep -c "^sleep 600"']).out.trim() === '1';
      await until('the command runs', sleeping, 10_000);
      left.abort();
      await asked;
      await until('the command is killed', () => !sleeping(), 10_000);
    } finally {
      cli(home, ['rm', made.name]);
    }
  }, 60_000);

  it('without a key nothing is served; stateless, so GET (a session stream) is 405', async () => {
    await expect(connect('not-a-key')).rejects.toThrow(/401|UNAUTHORIZED/);
    const get = await fetch(`${d.url}/mcp`, { headers: { Authorization: `Bearer ${key}` } });
    expect(get.status).toBe(405);
  });

  it('snaplab mcp with SNAPLAB_HOST acts through the daemon: its sandboxes carry the default TTL', async () => {
    const c = new Client({ name: 'snaplab-test', version: '0' });
    const env = { ...process.env, SNAPLAB_HOME: home, SNAPLAB_HOST: d.url, SNAPLAB_TOKEN: key };
    await c.connect(
      new StdioClientTransport({
        command: SNAPLAB,
        args: ['mcp', '--ttl', '45'],
        env: env as Record<string, string>,
        stderr: 'pipe',
      }),
    );
    try {
      const made = JSON.parse(textOf(await call(c, 'create_sandbox', {}))) as { name: string; timeoutS: number };
      expect(made.timeoutS).toBe(45);
      expect((await call(c, 'destroy_sandbox', { sandbox: made.name })).isError).toBeFalsy();
    } finally {
      await c.close();
    }
  }, 60_000);

  it('a client that disconnects leaves no sandbox after its TTL', async () => {
    const c = await connect(key);
    const made = await call(c, 'create_sandbox', { ttl_seconds: 2 });
    expect(JSON.parse(textOf(made)).timeoutS).toBe(2);
    await c.close();
    expect(boxes(home)).toHaveLength(1);
    await until('the TTL to remove the sandbox', () => boxes(home).length === 0, 30_000);
  }, 60_000);
});
