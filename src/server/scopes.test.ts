import { expect, it } from 'vitest';
import { publicOrFail, registeredScope, scopeOf } from './scopes.js';

it("gives a route its scope from the table, a HEAD its GET's, and refuses a scope written beside a route", () => {
  expect(registeredScope('POST', '/sandboxes', undefined)).toBe('exec');
  expect(registeredScope(['HEAD', 'GET'], '/sandboxes/:id', undefined)).toBe('read');
  expect(registeredScope('HEAD', '/keys', undefined)).toBe('admin');
  expect(registeredScope('GET', '/rpc', undefined)).toBe('exec');
  // one the table does not name: to be marked public, else the start fails (publicOrFail)
  expect(registeredScope(['GET', 'HEAD'], '/assets/x.js', undefined)).toBeUndefined();
  // a route's own scope beside it is a second place for it
  expect(() => registeredScope('GET', '/sandboxes', 'read')).toThrow(/names its own scope/);
  // the keyed lab's calls read the same table
  expect(scopeOf('DELETE /sandboxes/:id')).toBe('exec');
  expect(scopeOf('GET /sandboxes/:id/files')).toBe('read');
});

it('lets a route the table does not name go without a key only where it is marked public, and never a WebSocket or a parameter', () => {
  expect(() => publicOrFail({ method: 'GET', url: '/healthz', config: { public: true } })).not.toThrow();
  expect(() => publicOrFail({ method: ['GET', 'HEAD'], url: '/assets/x.js', config: { public: true } })).not.toThrow();
  // not marked: hidden or not, a GET or not, it fails the start
  expect(() => publicOrFail({ method: 'GET', url: '/new' })).toThrow(/no scope in server\/scopes.ts/);
  expect(() => publicOrFail({ method: 'POST', url: '/new', config: {} })).toThrow(/no scope/);
  expect(() => publicOrFail({ method: 'GET', url: '/ws', websocket: true, config: { public: true } })).toThrow(
    /never is/,
  );
  expect(() => publicOrFail({ method: 'GET', url: '/x/:id', config: { public: true } })).toThrow(/never is/);
});
