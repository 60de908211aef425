// The stand-in "outside" of test/egress.test.ts, run in the test's uplink namespace: an HTTP
// server on each address given, answering with the address it was reached on, and a DNS server
// (A records only, RFC 1035 wire format) answering the names given. Prints "ready" when listening.
//   node egress-outside.mjs HTTP_ADDR[,HTTP_ADDR...] DNS_ADDR name=addr[,name=addr...]
import { createServer } from 'node:http';
import { createServer as createTcpServer } from 'node:net';
import { createSocket } from 'node:dgram';

const [httpAddrs, dnsAddr, names] = process.argv.slice(2);
const records = new Map((names ?? '').split(',').filter(Boolean).map((kv) => kv.split('=')));
let pending = 0;
const ready = () => {
  if (--pending === 0) process.stdout.write('ready\n');
};
for (const addr of httpAddrs.split(',')) {
  pending++;
  createServer((req, res) => res.end(`outside ${addr} ${req.url}\n`)).listen(8080, addr, ready);
  // an echo on 7000: a connection that stays open as long as its client
  pending++;
  createTcpServer((s) => {
    s.on('error', () => {});
    s.pipe(s);
  }).listen(7000, addr, ready);
}

/** The question's name and the offset just past the question. */
function question(msg) {
  const labels = [];
  let o = 12;
  while (msg[o] !== 0) {
    labels.push(msg.subarray(o + 1, o + 1 + msg[o]).toString());
    o += msg[o] + 1;
  }
  return { name: labels.join('.').toLowerCase(), end: o + 5 };
}

const dns = createSocket('udp4');
dns.on('message', (msg, from) => {
  const { name, end } = question(msg);
  const known = records.get(name);
  // A records only: any other type of a known name has no answer (NOERROR)
  const addr = msg.readUInt16BE(end - 4) === 1 ? known : undefined;
  const head = Buffer.alloc(12);
  msg.copy(head, 0, 0, 2); // id
  head.writeUInt16BE(known ? 0x8180 : 0x8183, 2); // a response, recursion available; NXDOMAIN when unknown
  head.writeUInt16BE(1, 4);
  head.writeUInt16BE(addr ? 1 : 0, 6);
  const answer = addr
    ? Buffer.concat([
        Buffer.from([0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4]),
        Buffer.from(addr.split('.').map(Number)),
      ])
    : Buffer.alloc(0);
  dns.send(Buffer.concat([head, msg.subarray(12, end), answer]), from.port, from.address);
});
pending++;
dns.bind(53, dnsAddr, ready);
