import { createServer, type Socket } from 'node:net';
import type { AddressInfo } from 'node:net';
import { afterEach, expect, it } from 'vitest';
import { Http } from './http.js';

let close: (() => void) | undefined;
afterEach(() => close?.());

/**
 * A server that answers every request on a connection with keep-alive, except that it drops the
 * first connection (no answer) when its second request arrives: what a daemon closing an idle
 * kept connection just as the client reuses it looks like to the client.
 */
async function server(): Promise<{ url: string; connections: () => number; requests: string[] }> {
  const requests: string[] = [];
  let connections = 0;
  const sockets = new Set<Socket>();
  const srv = createServer((s) => {
    const n = ++connections;
    sockets.add(s);
    let seen = 0;
    let buf = '';
    s.on('data', (b) => {
      buf += b.toString();
      for (let end = buf.indexOf('\r\n\r\n'); end >= 0; end = buf.indexOf('\r\n\r\n')) {
        const head = buf.slice(0, end);
        buf = buf.slice(end + 4);
        const len = Number(/content-length: (\d+)/i.exec(head)?.[1] ?? 0);
        const body = buf.slice(0, len);
        buf = buf.slice(len);
        seen++;
        if (n === 1 && seen === 2) return void s.destroy();
        requests.push(`${head.split('\r\n')[0]} ${body}`);
        const out = JSON.stringify({ n, seen });
        s.write(
          `HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: ${out.length}\r\nconnection: keep-alive\r\n\r\n${out}`,
        );
      }
    });
  });
  await new Promise<void>((r) => srv.listen(0, '127.0.0.1', r));
  close = () => {
    for (const s of sockets) s.destroy();
    srv.close();
  };
  return { url: `http://127.0.0.1:${(srv.address() as AddressInfo).port}`, connections: () => connections, requests };
}

it('sends once more, on a new connection, a request whose kept connection the server dropped unanswered', async () => {
  const s = await server();
  const http = new Http(s.url, undefined);
  try {
    expect(await http.json('GET', '/a')).toEqual({ n: 1, seen: 1 });
    // the kept connection is dropped as this is sent: answered on a second one, sent there once
    expect(await http.json('POST', '/b', { json: { x: 1 } })).toEqual({ n: 2, seen: 1 });
    expect(s.connections()).toBe(2);
    expect(s.requests).toEqual(['GET /a HTTP/1.1 ', 'POST /b HTTP/1.1 {"x":1}']);
  } finally {
    http.close();
  }
});
