import { describe, expect, it } from 'vitest';
import { idOf, nameOf, parseRef, snapshotNameOf } from './snapshot-names.js';

describe("E2B's snapshot names and snaplab's", () => {
  it('reads [namespace/]alias[:tag], and nothing else', () => {
    expect(parseRef('my-snap')).toEqual({ alias: 'my-snap', tag: 'default' });
    expect(parseRef('team/my_snap:v1.2')).toEqual({ alias: 'my_snap', tag: 'v1.2' });
    for (const bad of ['', 'a:b:c', 'a.b', 'a b', 'a:', ':v1']) expect(parseRef(bad)).toBeUndefined();
  });

  it('maps both ways: the alias for the default tag, alias.tag for another', () => {
    for (const id of ['my-snap:default', 'my-snap:v2', 'x:1.2.3']) expect(idOf(nameOf(parseRef(id)!))).toBe(id);
    expect(nameOf({ alias: 'a', tag: 'default' })).toBe('a');
    expect(nameOf({ alias: 'a', tag: 'v1.2' })).toBe('a.v1.2');
    // a name made with snaplab's own API: its id, and back
    expect(idOf('nightly')).toBe('nightly:default');
    expect(nameOf(parseRef(idOf('a.b.c'))!)).toBe('a.b.c');
  });

  it('takes a template with a tag for a snapshot, a bare one for an image or pool first', () => {
    expect(snapshotNameOf('my-snap:v2')).toBe('my-snap.v2');
    expect(snapshotNameOf('base')).toBeUndefined();
  });
});
