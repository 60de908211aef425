import { expect, it } from 'vitest';
import { registeredScope, scopeOf } from './scopes.js';

it("gives a route its scope from the table, a HEAD its GET's, and fails a route the table does not name", () => {
  expect(registeredScope('POST', '/sandboxes', { hidden: false, ownScope: undefined })).toBe('exec');
  expect(registeredScope(['HEAD', 'GET'], '/sandboxes/:id', { hidden: false, ownScope: undefined })).toBe('read');
  expect(registeredScope('HEAD', '/keys', { hidden: true, ownScope: undefined })).toBe('admin');
  // a hidden GET it does not name needs no key: the dashboard's files, /healthz, /openapi.json
  expect(registeredScope(['GET', 'HEAD'], '/assets/x.js', { hidden: true, ownScope: undefined })).toBeUndefined();
  // anything else it does not name is an error at the server's start, hidden or not
  expect(() => registeredScope('POST', '/new', { hidden: true, ownScope: undefined })).toThrow(
    /no scope in server\/scopes.ts/,
  );
  expect(() => registeredScope('GET', '/new', { hidden: false, ownScope: undefined })).toThrow(/no scope/);
  // a route's own scope beside it is a second place for it
  expect(() => registeredScope('GET', '/sandboxes', { hidden: false, ownScope: 'read' })).toThrow(
    /names its own scope/,
  );
  // the keyed lab's calls read the same table
  expect(scopeOf('DELETE /sandboxes/:id')).toBe('exec');
  expect(scopeOf('GET /sandboxes/:id/files')).toBe('read');
});
