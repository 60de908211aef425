import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { chooseAccel } from './accel.js';

const home = mkdtempSync(join(tmpdir(), 'snaplab-accel-'));
afterEach(() => {
  delete process.env.SNAPLAB_QEMU_ACCEL;
});

describe('chooseAccel', () => {
  it('SNAPLAB_QEMU_ACCEL decides without a test boot, and a bad value is an error with a hint', async () => {
    let probed = 0;
    const probe = async (): Promise<boolean> => {
      probed++;
      return true;
    };
    process.env.SNAPLAB_QEMU_ACCEL = 'tcg';
    expect(await chooseAccel(home, probe)).toBe('tcg');
    process.env.SNAPLAB_QEMU_ACCEL = 'kvm';
    expect(await chooseAccel(home, probe)).toBe('kvm');
    expect(probed).toBe(0);
    expect(existsSync(join(home, 'qemu', 'accel.json'))).toBe(false); // an override is not remembered
    process.env.SNAPLAB_QEMU_ACCEL = 'hvf';
    await expect(chooseAccel(home, probe)).rejects.toMatchObject({
      code: 'BAD_INPUT',
      hint: expect.stringMatching(/kvm or tcg/),
    });
  });

  it('remembers what a test boot decided', async () => {
    const h = join(home, 'probe');
    expect(await chooseAccel(h, async () => false)).toBe('tcg');
    expect(existsSync(join(h, 'qemu', 'accel.json'))).toBe(true);
    expect(await chooseAccel(h, async () => true)).toBe('tcg'); // from accel.json, not probed again
    rmSync(home, { recursive: true, force: true });
  });
});
