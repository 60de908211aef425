/**
 * The MCP server (docs/mcp.md): tools over a KeyedLabApi, the same for `snaplab mcp` on stdio (the
 * embedded lab, or a daemon with SNAPLAB_HOST) and for a daemon's /mcp (the caller's key). It
 * stands on the Lab API only.
 */
import { McpServer, ResourceTemplate } from '@modelcontextprotocol/sdk/server/mcp.js';
import type { CallToolResult, ReadResourceResult } from '@modelcontextprotocol/sdk/types.js';
import * as z from 'zod';
import type { KeyedLabApi, SandboxApi } from '../sdk/api.js';
import { VERSION } from '../version.js';
import { runCode, type Execution } from '../interpreter/run-code.js';
import { Interpreters } from '../interpreter/server.js';

export interface McpOptions {
  /** the TTL of a sandbox made without one (seconds); every sandbox made here carries one */
  defaultTtlS: number;
  /** false: the lab cannot keep a clock (the embedded lab): no TTL is given, the caller removes them */
  keepsTime: boolean;
  /** told of each sandbox made (stdio on the embedded lab removes them when the session ends) */
  onCreated?: (box: SandboxApi) => void;
}

/** Past this many characters of each of stdout and stderr, output is cut with a note. */
export const MAX_OUTPUT = 64 * 1024;

type Result = CallToolResult;

function text(value: unknown): Result {
  return { content: [{ type: 'text', text: typeof value === 'string' ? value : JSON.stringify(value, null, 2) }] };
}

/** A tool's body: an error becomes an isError result with its code and hint (never a crash). */
function guarded<A>(fn: (args: A) => Promise<Result>): (args: A) => Promise<Result> {
  return async (args) => {
    try {
      return await fn(args);
    } catch (e) {
      const err = e as { code?: string; message?: string; hint?: string };
      const line = `${err.code ?? 'ERROR'}: ${err.message ?? String(e)}${err.hint ? ` (hint: ${err.hint})` : ''}`;
      return { isError: true, content: [{ type: 'text', text: line }] };
    }
  };
}

function view(box: SandboxApi): Record<string, unknown> {
  return {
    id: box.id,
    name: box.name,
    state: box.state,
    image: box.image,
    expiresAt: box.expiresAt === null ? null : new Date(box.expiresAt).toISOString(),
    timeoutS: box.timeoutS,
  };
}

export function cut(s: string, max: number): string {
  return s.length <= max ? s : `${s.slice(0, max)}\n[snaplab: output truncated: ${s.length - max} more characters]`;
}

const sandbox = z.string().min(1).describe('the sandbox id or name');

function lifecycleTools(server: McpServer, lab: KeyedLabApi, o: McpOptions, interpreters: Interpreters): void {
  server.registerTool(
    'create_sandbox',
    {
      description: `Create an isolated Linux sandbox. It is removed after ttl_seconds (default ${o.defaultTtlS}).`,
      inputSchema: {
        image: z.string().min(1).optional().describe('image name (default busybox)'),
        name: z.string().min(1).optional(),
        memory_mb: z.number().int().positive().optional(),
        cpus: z.number().positive().optional(),
        pids: z.number().int().positive().optional(),
        ttl_seconds: z.number().int().positive().max(86400).optional(),
      },
    },
    guarded(async (a) => {
      const limits = {
        ...(a.memory_mb ? { memoryBytes: a.memory_mb * 1024 * 1024 } : {}),
        ...(a.cpus ? { cpus: a.cpus } : {}),
        ...(a.pids ? { pids: a.pids } : {}),
      };
      const box = await lab.create({
        image: a.image,
        name: a.name,
        limits,
        ...(o.keepsTime ? { timeoutS: a.ttl_seconds ?? o.defaultTtlS, onTimeout: 'kill' as const } : {}),
      });
      o.onCreated?.(box);
      return text(view(box));
    }),
  );
  server.registerTool(
    'list_sandboxes',
    { description: 'The sandboxes this lab shows', inputSchema: {} },
    guarded(async () => {
      const boxes = await lab.list();
      interpreters.retain(boxes.map((b) => b.id)); // the sandboxes ended out of sight (their TTL, others)
      return text(boxes.map(view));
    }),
  );
  server.registerTool(
    'destroy_sandbox',
    { description: 'Destroy a sandbox', inputSchema: { sandbox } },
    guarded(async (a) => {
      const box = await lab.get(a.sandbox);
      await box.destroy();
      interpreters.forget(box.id);
      return text(`destroyed ${a.sandbox}`);
    }),
  );
}

function runTool(server: McpServer, lab: KeyedLabApi): void {
  server.registerTool(
    'run_command',
    {
      description: `Run a command in a sandbox; returns its exit code, stdout and stderr (each cut past ${MAX_OUTPUT} characters, with a note)`,
      inputSchema: {
        sandbox,
        command: z.string().min(1).describe('run by /bin/sh -c'),
        cwd: z.string().optional(),
        timeout_seconds: z.number().positive().max(3600).optional(),
        max_output: z.number().int().positive().max(MAX_OUTPUT).optional(),
      },
    },
    guarded(async (a) => {
      const box = await lab.get(a.sandbox);
      const r = await box.exec(['/bin/sh', '-c', a.command], {
        ...(a.cwd ? { cwd: a.cwd } : {}),
        ...(a.timeout_seconds ? { timeoutMs: Math.ceil(a.timeout_seconds * 1000) } : {}),
      });
      const max = a.max_output ?? MAX_OUTPUT;
      return {
        content: [
          { type: 'text', text: `exit code ${r.exitCode}` },
          { type: 'text', text: `stdout:\n${cut(r.stdout, max)}` },
          { type: 'text', text: `stderr:\n${cut(r.stderr, max)}` },
        ],
        structuredContent: { exitCode: r.exitCode, stdout: cut(r.stdout, max), stderr: cut(r.stderr, max) },
      };
    }),
  );
}

/** An execution as MCP content: its output and results as text, its plots as images. */
function executionContent(r: Execution, max: number): Result {
  const texts = [
    ...(r.stdout ? [`stdout:\n${cut(r.stdout, max)}`] : []),
    ...(r.stderr ? [`stderr:\n${cut(r.stderr, max)}`] : []),
    ...r.results.filter((x) => typeof x.text === 'string').map((x) => cut(x.text!, max)),
    ...(r.error ? [`${r.error.name}: ${r.error.value}\n${cut(r.error.traceback, max)}`] : []),
    ...(r.crashed ? ['the kernel died while it ran: the next run_code starts a new one'] : []),
  ];
  const images = r.results.filter((x) => typeof x.png === 'string');
  return {
    content: [
      ...texts.map((t) => ({ type: 'text' as const, text: t })),
      ...images.map((x) => ({ type: 'image' as const, data: x.png!, mimeType: 'image/png' })),
      ...(texts.length + images.length ? [] : [{ type: 'text' as const, text: '(no output)' }]),
    ],
    ...(r.error ? { isError: true } : {}),
  };
}

function codeTool(server: McpServer, lab: KeyedLabApi, interpreters: Interpreters): void {
  server.registerTool(
    'run_code',
    {
      description:
        "Run Python in a sandbox's stateful interpreter (Jupyter kernel: variables are kept between calls); returns stdout, stderr, the value of the last expression, an error with its traceback, and plots as PNG images. The sandbox's image needs python3 with ipykernel (the code-interpreter-v1 image).",
      inputSchema: {
        sandbox,
        code: z.string().min(1),
        timeout_seconds: z.number().positive().max(3600).optional(),
      },
    },
    guarded(async (a) => {
      const box = await lab.get(a.sandbox);
      const r = await runCode(
        box,
        interpreters,
        a.code,
        a.timeout_seconds ? { timeoutMs: Math.ceil(a.timeout_seconds * 1000) } : {},
      );
      return executionContent(r, MAX_OUTPUT);
    }),
  );
}

function fileTools(server: McpServer, lab: KeyedLabApi): void {
  const path = z.string().min(1).describe('an absolute path inside the sandbox');
  server.registerTool(
    'write_file',
    { description: 'Write a UTF-8 text file in a sandbox', inputSchema: { sandbox, path, content: z.string() } },
    guarded(async (a) => {
      await (await lab.get(a.sandbox)).files.write(a.path, a.content);
      return text(`wrote ${Buffer.byteLength(a.content)} bytes to ${a.path}`);
    }),
  );
  server.registerTool(
    'read_file',
    {
      description: `Read a file of a sandbox as UTF-8 (cut past ${MAX_OUTPUT} characters)`,
      inputSchema: { sandbox, path },
    },
    guarded(async (a) => text(cut((await (await lab.get(a.sandbox)).files.read(a.path)).toString('utf8'), MAX_OUTPUT))),
  );
  server.registerTool(
    'list_files',
    { description: "A directory's entries in a sandbox", inputSchema: { sandbox, path } },
    guarded(async (a) => {
      const entries = await (await lab.get(a.sandbox)).files.list(a.path);
      return text(entries.map((e) => ({ name: e.name, type: e.type, size: e.size, mode: e.mode })));
    }),
  );
}

function snapshotTools(server: McpServer, lab: KeyedLabApi, o: McpOptions): void {
  server.registerTool(
    'snapshot_sandbox',
    {
      description: "Take a named snapshot of a sandbox's filesystem",
      inputSchema: { sandbox, snapshot: z.string().min(1) },
    },
    guarded(async (a) => text((await (await lab.get(a.sandbox)).snapshot(a.snapshot)).toJSON())),
  );
  server.registerTool(
    'restore_snapshot',
    {
      description: `A new sandbox from a snapshot (removed after ttl_seconds, default ${o.defaultTtlS})`,
      inputSchema: { snapshot: z.string().min(1), ttl_seconds: z.number().int().positive().max(86400).optional() },
    },
    guarded(async (a) => {
      const box = await lab.restore(a.snapshot, {
        ...(o.keepsTime ? { timeoutS: a.ttl_seconds ?? o.defaultTtlS, onTimeout: 'kill' as const } : {}),
      });
      o.onCreated?.(box);
      return text(view(box));
    }),
  );
}

/** A file's text (cut past MAX_OUTPUT), a binary one's bytes as base64, a directory's entries as JSON. */
async function readResource(
  lab: KeyedLabApi,
  uri: URL,
  sandboxName: string,
  path: string,
): Promise<ReadResourceResult> {
  const box = await lab.get(sandboxName);
  const info = await box.files.stat(path);
  if (info.type === 'dir') {
    const entries = (await box.files.list(path)).map((e) => ({ name: e.name, type: e.type, size: e.size }));
    return { contents: [{ uri: uri.href, mimeType: 'application/json', text: JSON.stringify(entries) }] };
  }
  const data = await box.files.read(path);
  const asText = data.toString('utf8');
  return Buffer.from(asText, 'utf8').equals(data)
    ? { contents: [{ uri: uri.href, mimeType: 'text/plain', text: cut(asText, MAX_OUTPUT) }] }
    : { contents: [{ uri: uri.href, mimeType: 'application/octet-stream', blob: data.toString('base64') }] };
}

/** snaplab://sandbox/NAME/files/PATH: a sandbox's files (each sandbox's / is listed). */
function fileResources(server: McpServer, lab: KeyedLabApi): void {
  const template = new ResourceTemplate('snaplab://sandbox/{sandbox}/files{+path}', {
    list: async () => ({
      resources: (await lab.list()).map((b) => ({
        uri: `snaplab://sandbox/${b.name}/files/`,
        name: `${b.name}:/`,
        mimeType: 'application/json',
      })),
    }),
  });
  server.registerResource(
    'sandbox-files',
    template,
    { description: "A sandbox's file (text, or base64 bytes) or directory (its entries as JSON)" },
    async (uri, vars) => readResource(lab, uri, String(vars.sandbox), decodeURIComponent(String(vars.path))),
  );
}

/** An MCP server whose tools act through `lab`. */
export function mcpServer(lab: KeyedLabApi, o: McpOptions): McpServer {
  const server = new McpServer({ name: 'snaplab', version: VERSION });
  // the interpreter servers this session started, by sandbox: a destroyed or ended one is forgotten
  const interpreters = new Interpreters();
  lifecycleTools(server, lab, o, interpreters);
  runTool(server, lab);
  codeTool(server, lab, interpreters);
  fileTools(server, lab);
  snapshotTools(server, lab, o);
  fileResources(server, lab);
  return server;
}
