import { describe, expect, it } from 'vitest';
import { isSnaplabError } from '../errors.js';
import {
  decodeExec,
  decodeExit,
  decodeHello,
  encodeExec,
  encodeFrame,
  encodeHello,
  encodeIdentity,
  FrameDecoder,
  HEADER_SIZE,
  MAX_PAYLOAD,
  MsgType,
  type Frame,
} from './protocol.js';

function sampleFrames(): Buffer[] {
  return [
    encodeFrame(MsgType.PING, 1),
    encodeFrame(MsgType.STDOUT, 7, Buffer.from('hello world')),
    encodeFrame(MsgType.DATA, 0xffffffff, Buffer.alloc(70_000, 0xab)),
    encodeFrame(
      MsgType.EXEC,
      3,
      encodeExec({ argv: ['a', 'b c'], env: ['X=1'], cwd: '/tmp', timeoutMs: 5, stdin: true }),
    ),
  ];
}

function summary(fs: Frame[]): string[] {
  return fs.map((f) => `${f.type}/${f.id}/${f.payload.length}/${f.payload.subarray(0, 16).toString('hex')}`);
}

describe('FrameDecoder', () => {
  const frames = sampleFrames();
  const wire = Buffer.concat(frames);
  const expected = summary(frames.map((b) => new FrameDecoder().push(b)[0]!));

  it('decodes coalesced frames from one chunk', () => {
    const d = new FrameDecoder();
    expect(summary(d.push(wire))).toEqual(expected);
    expect(d.pending).toBe(0);
  });

  it('decodes input split at every byte', () => {
    const d = new FrameDecoder();
    const out: Frame[] = [];
    for (let i = 0; i < wire.length; i++) out.push(...d.push(wire.subarray(i, i + 1)));
    expect(summary(out)).toEqual(expected);
  });

  it('decodes input split at random points, frames straddling chunks', () => {
    let seed = 42;
    const rnd = (n: number): number => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) % n) + 1;
    for (let round = 0; round < 50; round++) {
      const d = new FrameDecoder();
      const out: Frame[] = [];
      for (let i = 0; i < wire.length; ) {
        const n = rnd(round % 2 ? 20 : 30_000);
        out.push(...d.push(wire.subarray(i, i + n)));
        i += n;
      }
      expect(summary(out)).toEqual(expected);
      expect(d.pending).toBe(0);
    }
  });

  it('refuses a header announcing more than 64 MiB', () => {
    const h = Buffer.alloc(HEADER_SIZE);
    h.writeUInt32LE(MAX_PAYLOAD + 1, 0);
    h.writeUInt16LE(MsgType.DATA, 4);
    expect(() => new FrameDecoder().push(h)).toThrow(/over the/);
    try {
      new FrameDecoder().push(h);
    } catch (e) {
      expect(isSnaplabError(e, 'AGENT_PROTOCOL')).toBe(true);
    }
  });

  it('encodeFrame refuses an oversized payload before anything is sent', () => {
    expect(() => encodeFrame(MsgType.FILE_PUT, 1, Buffer.alloc(MAX_PAYLOAD + 1))).toThrow(/frame limit/);
  });
});

describe('payloads', () => {
  it('EXEC round-trips', () => {
    const req = {
      argv: ['sh', '-c', 'echo ünïcode'],
      env: ['A=1', 'B='],
      cwd: '/x y',
      timeoutMs: 1500,
      stdin: true,
      waitOutput: true,
    };
    expect(decodeExec(encodeExec(req))).toEqual(req);
    expect(decodeExec(encodeExec({ argv: ['true'], env: [] }))).toEqual({
      argv: ['true'],
      env: [],
      cwd: undefined,
      timeoutMs: 0,
      stdin: false,
      waitOutput: false,
    });
  });

  it('HELLO round-trips and EXIT decodes little-endian fields', () => {
    const h = { major: 1, minor: 2, pid: 1234, agentVersion: '0.1.0' };
    expect(decodeHello(encodeHello(h))).toEqual(h);
    const x = Buffer.alloc(48);
    x.writeInt32LE(-1, 0);
    x.writeInt32LE(9, 4);
    x.writeUInt32LE(1, 8);
    x.writeBigUInt64LE(1500n, 16);
    x.writeBigUInt64LE(2n ** 40n, 40);
    expect(decodeExit(x)).toMatchObject({ code: -1, signal: 9, flags: 1, userUs: 1500, wallUs: 2 ** 40 });
    expect(() => decodeExit(Buffer.alloc(10))).toThrow(/too short/);
  });

  it("IDENTITY: flags, the name's length and bytes, the machine id, the entropy; bad values refused before sending", () => {
    const id = '0123456789abcdef0123456789abcdef';
    const b = encodeIdentity({ hostname: 'web-1', machineId: id, entropy: Buffer.from([9, 8, 7]), system: true });
    expect(b.toString('hex')).toBe(
      Buffer.concat([Buffer.from([1, 5]), Buffer.from('web-1'), Buffer.from(id), Buffer.from([9, 8, 7])]).toString(
        'hex',
      ),
    );
    expect(encodeIdentity({ hostname: 'a', machineId: id, entropy: Buffer.alloc(0), system: false })[0]).toBe(0);
    expect(() => encodeIdentity({ hostname: 'a b', machineId: id, entropy: Buffer.alloc(0), system: false })).toThrow(
      /invalid host name/,
    );
    expect(() =>
      encodeIdentity({ hostname: 'x'.repeat(65), machineId: id, entropy: Buffer.alloc(0), system: false }),
    ).toThrow(/invalid host name/);
    expect(() =>
      encodeIdentity({ hostname: 'a', machineId: id.toUpperCase(), entropy: Buffer.alloc(0), system: false }),
    ).toThrow(/machine id/);
    expect(() => encodeIdentity({ hostname: 'a', machineId: id, entropy: Buffer.alloc(4097), system: false })).toThrow(
      /at most 4096/,
    );
  });
});
