import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { packageRoot } from '../agent/binary.js';
import { SnaplabError } from '../errors.js';

interface Pending {
  resolve(fields: string[]): void;
  reject(e: Error): void;
}

/** An error from the helper, carrying the errno of the failed system call. */
export class HostOpError extends Error {
  constructor(
    readonly errno: number,
    message: string,
  ) {
    super(message);
  }
}

/**
 * Client of native/hostops.c: one resident helper per process making the system calls Node cannot
 * (btrfs ioctls, mount, a detached launch) for a pipe round trip instead of a tool spawn. It does
 * not keep the process alive when idle, and it exits when this process does (stdin EOF).
 */
export class HostOps {
  private static instance: HostOps | null | undefined;
  private readonly pending = new Map<number, Pending>();
  private nextId = 1;
  private buf: Buffer = Buffer.alloc(0);

  private constructor(private readonly child: ChildProcess) {
    child.stdout!.on('data', (b: Buffer) => this.onData(b));
    const fail = (why: string): void => {
      HostOps.instance = undefined;
      for (const p of this.pending.values()) p.reject(new SnaplabError('INTERNAL', `snaplab-hostops ${why}`));
      this.pending.clear();
    };
    child.on('exit', (code, sig) => fail(`exited (${sig ?? code})`));
    child.on('error', (e) => fail(e.message));
    child.stdin!.on('error', () => undefined);
    this.idle();
  }

  /** The shared helper, or null where its binary was not built (callers then spawn the tools). */
  static get(): HostOps | null {
    if (HostOps.instance !== undefined) return HostOps.instance;
    const bin = HostOps.binaryPath();
    if (!existsSync(bin) || process.env.SNAPLAB_NO_HOSTOPS === '1') return (HostOps.instance = null);
    // a session of its own: a terminal's ^C goes to the whole foreground process group, and took the
    // helper with it while the CLI was still removing what an interrupted `create --count` made (it
    // ends with this process all the same: its stdin's EOF)
    const child = spawn(bin, [], { stdio: ['pipe', 'pipe', 'inherit'], detached: true });
    return (HostOps.instance = new HostOps(child));
  }

  /** The shared helper; the namespaces driver cannot launch without it. */
  static require(): HostOps {
    const ops = HostOps.get();
    if (!ops) {
      throw new SnaplabError(
        'INTERNAL',
        `the native helper ${HostOps.binaryPath()} is not built`,
        'build it: make -C native (or npm run build)',
      );
    }
    return ops;
  }

  static binaryPath(): string {
    return join(packageRoot(), 'native', 'build', 'snaplab-hostops');
  }

  /** Send one request; resolves with the reply's fields after "ok". */
  request(op: string, ...args: string[]): Promise<string[]> {
    const id = this.nextId++;
    const payload = Buffer.from([op, ...args].map((a) => `${a}\0`).join(''));
    const head = Buffer.alloc(8);
    head.writeUInt32LE(payload.length, 0);
    head.writeUInt32LE(id, 4);
    return new Promise<string[]>((resolve, reject) => {
      this.pending.set(id, { resolve, reject });
      this.busy();
      this.child.stdin!.write(Buffer.concat([head, payload]));
    });
  }

  private onData(b: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, b]) : b;
    while (this.buf.length >= 8) {
      const len = this.buf.readUInt32LE(0);
      if (this.buf.length < 8 + len) break;
      const id = this.buf.readUInt32LE(4);
      const fields = this.buf
        .subarray(8, 8 + len)
        .toString()
        .split('\0');
      fields.pop();
      this.buf = this.buf.subarray(8 + len);
      const p = this.pending.get(id);
      if (!p) continue;
      this.pending.delete(id);
      if (fields[0] === 'ok') p.resolve(fields.slice(1));
      else p.reject(new HostOpError(Number(fields[1]), fields[2] ?? 'unknown error'));
    }
    if (this.pending.size === 0) this.idle();
  }

  // An idle helper must not keep the event loop (and so the CLI) alive.
  private busy(): void {
    this.child.ref();
    (this.child.stdout as unknown as { ref?(): void }).ref?.();
  }

  private idle(): void {
    this.child.unref();
    (this.child.stdout as unknown as { unref?(): void }).unref?.();
    (this.child.stdin as unknown as { unref?(): void }).unref?.();
  }
}
