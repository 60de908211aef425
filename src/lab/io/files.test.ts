import { describe, expect, it } from 'vitest';
import { fileError } from './files.js';

describe('fileError', () => {
  it("names a full disk DISK_FULL, but not a watch's ENOSPC (inotify's limit on watches)", () => {
    const line = (errno: string): string => `snaplab: file: ${errno}: /x: message\n`;
    expect(fileError(line('ENOSPC'), 1, 'write /x')).toMatchObject({
      code: 'DISK_FULL',
      message: 'write /x: message (ENOSPC)',
    });
    expect(fileError(line('EDQUOT'), 1, 'move /x')).toMatchObject({ code: 'DISK_FULL' });
    expect(fileError(line('ENOSPC'), 1, 'watch /x')).toMatchObject({ code: 'FILE_ERROR' });
    expect(fileError(line('ENOENT'), 1, 'read /x')).toMatchObject({ code: 'FILE_NOT_FOUND' });
    expect(fileError(line('EPERM'), 1, 'write /x')).toMatchObject({ code: 'FILE_ERROR' });
  });
});
