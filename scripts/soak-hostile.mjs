#!/usr/bin/env node
/**
 * The soak's hostile clients (issue 30), in a process of their own so that their event loop is
 * not the honest clients': against the daemon's TCP port, with no key or a wrong one, until
 * SIGTERM (then one JSON line of counts on stdout):
 *
 * - flooding: FLOOD connections from 127.0.0.2–4, each a request line and one header never
 *   finished; a dropped one is opened again 2 s later (the daemon refuses, displaces and times
 *   them out);
 * - slow: SLOW connections sending a request's headers one byte a second (slowloris: the headers
 *   timeout ends them);
 * - disconnecting: requests cut at random points (mid-headers, mid-body, after a WebSocket
 *   upgrade's request, after the request), with a wrong key, as fast as one at a time allows.
 *
 *   node scripts/soak-hostile.mjs PORT [--flood 600] [--slow 50]
 *
 * The daemon may be killed and started again on the same port meanwhile: every client retries.
 */
import { connect } from 'node:net';
import { parseArgs } from 'node:util';

const { values: o, positionals } = parseArgs({
  allowPositionals: true,
  options: { flood: { type: 'string', default: '600' }, slow: { type: 'string', default: '50' } },
});
const port = Number(positionals[0]);
const counts = { flood: 0, slow: 0, cut: 0, refusedOrDropped: 0 };
let stopping = false;
const sockets = new Set();

/** A connection from `from` that `feed` writes to; `again` runs (after `ms`) once it closes. */
function open(from, feed, again, ms) {
  if (stopping) return;
  const s = connect({ host: '127.0.0.1', port, localAddress: from });
  sockets.add(s);
  s.on('connect', () => feed(s));
  s.on('data', () => {}); // a 408 or 401: read and dropped
  s.on('error', () => {});
  s.on('close', () => {
    sockets.delete(s);
    counts.refusedOrDropped++;
    // (not unref'd: while the daemon is down no socket holds this process, and it must wait)
    if (!stopping) setTimeout(again, ms);
  });
}

const HALF = 'GET /sandboxes HTTP/1.1\r\nHost: snaplab\r\n';
function flooder(from) {
  counts.flood++;
  open(
    from,
    (s) => s.write(HALF),
    () => flooder(from),
    2000,
  );
}

const SLOW =
  'GET /sandboxes HTTP/1.1\r\nHost: snaplab\r\nX-Pad: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n';
function slowloris() {
  counts.slow++;
  open(
    '127.0.0.5',
    (s) => {
      let i = 0;
      const t = setInterval(() => (i < SLOW.length && !s.destroyed ? s.write(SLOW[i++]) : clearInterval(t)), 1000);
      s.once('close', () => clearInterval(t));
    },
    slowloris,
    1000,
  );
}

const CUTS = [
  'GET /sandboxes HTTP/1.1\r\nHost: sn',
  'POST /sandboxes HTTP/1.1\r\nHost: snaplab\r\nAuthorization: Bearer snaplab_wrong\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"image":',
  'GET /rpc HTTP/1.1\r\nHost: snaplab\r\nAuthorization: Bearer snaplab_wrong\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n',
  'GET /events HTTP/1.1\r\nHost: snaplab\r\nAuthorization: Bearer snaplab_wrong\r\n\r\n',
];
function disconnecter() {
  counts.cut++;
  open(
    '127.0.0.6',
    (s) => {
      s.write(CUTS[counts.cut % CUTS.length]);
      setTimeout(() => s.destroy(), counts.cut % 3 === 0 ? 0 : 20);
    },
    disconnecter,
    5,
  );
}

for (const from of ['127.0.0.2', '127.0.0.3', '127.0.0.4']) for (let i = 0; i < Number(o.flood) / 3; i++) flooder(from);
for (let i = 0; i < Number(o.slow); i++) slowloris();
for (let i = 0; i < 4; i++) disconnecter();

process.once('SIGTERM', () => {
  stopping = true;
  for (const s of sockets) s.destroy();
  process.stdout.write(`${JSON.stringify(counts)}\n`);
  process.exit(0);
});
