import { expect, it } from 'vitest';
import { SnaplabError } from '../errors.js';
import { asGone } from './snapshot-access.js';

it("a snapshot the lab finds gone after the check is answered as any miss: the lab's hint (other snapshots' names) is not passed on", () => {
  const lab = new SnaplabError('SNAPSHOT_NOT_FOUND', 'no snapshot named "s"', 'known snapshots: theirs-1, theirs-2');
  let thrown: unknown;
  try {
    asGone('s')(lab);
  } catch (e) {
    thrown = e;
  }
  expect(thrown).toMatchObject({ code: 'SNAPSHOT_NOT_FOUND', hint: 'list them with GET /snapshots' });
  expect(String((thrown as SnaplabError).hint)).not.toContain('theirs');
  // any other error is left as it is
  const other = new SnaplabError('HOST_COMMAND_FAILED', 'x', 'y');
  expect(() => asGone('s')(other)).toThrow(other);
});
