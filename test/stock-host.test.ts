import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import type { Lab } from '../src/sdk/lab.js';
import { disposeLab, testLab } from './helpers.js';
import { raiseStockHost, report, type GuestRun, type StockHost } from './stock-host/guest.js';
import { STOCK_SUITE } from './stock-host/trees.js';

// snaplab on a stock Debian 12 host (systemd as PID 1, cgroup v2 only, /dev nosuid), which this
// machine is not: one booted as a VM of snaplab's own qemu driver (emulated here: slow), with this
// checkout installed in it (test/stock-host/). One VM for every case. Measured here: ~230 s with
// no cache (two mmdebstrap builds), ~225 s with the trees cached in /var/tmp/snaplab-test-cache;
// the boot is ~42 s of it (2 GiB of guest RAM: 4 GiB cost ~20 s more of kernel start under TCG).
let lab: Lab | undefined;
let host: StockHost | undefined;
const abort = new AbortController();
const t0 = performance.now();
const log = (line: string): void =>
  console.log(`[stock-host +${((performance.now() - t0) / 1000).toFixed(1)} s] ${line}`);

beforeAll(async () => {
  lab = await testLab();
  host = await raiseStockHost(lab, { signal: abort.signal, log });
}, 420_000);

afterAll(async () => {
  abort.abort(); // a boot still running when beforeAll timed out
  if (host) console.log(report(host));
  if (lab) await disposeLab(lab);
}, 180_000);

const need = (): StockHost => {
  if (!host) throw new Error('the stock host did not come up (see beforeAll)');
  return host;
};
/**
 * Shell functions for the E2B cases' envd calls, as the SDK makes them: `start CMD` (a Connect
 * server-streaming Start; its envelopes out in base64) and `health` (the status of GET /health), of
 * the sandbox $ID with the token $TOKEN on the front at $U; and `network_left`. (Written without
 * `${`: a template literal.)
 */
const CONNECT_CALLS = `# a Connect server-streaming call: one envelope (flags 0, length, JSON) in, envelopes out
start() {
  J='{"process":{"cmd":"/bin/sh","args":["-c","'"$1"'"]}}'
  L=$(printf %s "$J" | wc -c)
  printf "\\\\000\\\\000\\\\000\\\\$(printf %03o $((L / 256)))\\\\$(printf %03o $((L % 256)))" > /tmp/e2b-start.bin
  printf %s "$J" >> /tmp/e2b-start.bin
  curl -s -X POST -H "E2b-Sandbox-Id: $ID" -H 'E2b-Sandbox-Port: 49983' -H "X-Access-Token: $TOKEN" \\
    -H 'content-type: application/connect+json' --data-binary @/tmp/e2b-start.bin $U/process.Process/Start | base64 -w0
}
# what of egress is on the host: snaplab's network namespaces, its nftables tables, forwarding
# (nft's own failure is the script's, not "no table")
network_left() {
  NS=$(ip netns list)
  TABLES=$(nft list tables)
  echo "$(echo "$NS" | grep -c snaplab || true) $(echo "$TABLES" | grep -c snaplab || true) $(cat /proc/sys/net/ipv4/ip_forward)"
}
health() {
  curl -s -o /dev/null -w '%{http_code}' -H "E2b-Sandbox-Id: $ID" -H 'E2b-Sandbox-Port: 49983' -H "X-Access-Token: $TOKEN" $U/health
}`;

/**
 * The E2B case's exchanges, in the guest, as the SDK makes them (docs/e2b.md): a key, the daemon
 * from a transient unit with the front, then curl. Prints NAME=VALUE lines; bodies in base64.
 * (Its shell is written without `${`: a template literal.)
 */
const E2B_SCRIPT = `set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
U=http://127.0.0.1:3000
KEY=$(snaplab key create e2b-stock --e2b)
# E2B's default is internet access: egress, which needs nftables; it is hidden for the first
# create, as on a host without it, and put back after (here, or by the case's onTestFailed)
NFT=$(command -v nft)
echo "NFT=$NFT"
trap 'if [ -e "$NFT.away" ]; then mv -f "$NFT.away" "$NFT"; fi; systemctl stop snaplab-e2b' EXIT
systemd-run --unit snaplab-e2b --quiet /usr/local/bin/snaplab serve --e2b-listen 127.0.0.1:3000
for i in $(seq 1 600); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "X-API-Key: $KEY" $U/v2/sandboxes)" = 200 ] && break
  sleep 0.2
done
${CONNECT_CALLS}
mv "$NFT" "$NFT.away"
R=$(curl -s --max-time 60 -X POST -H "X-API-Key: $KEY" -H 'content-type: application/json' -d '{"templateID":"busybox","timeout":600}' \\
  -w '\\n%{http_code}' $U/sandboxes)
mv "$NFT.away" "$NFT"
echo "EGRESS=$(printf %s "$R" | head -n 1 | base64 -w0)"
echo "EGRESS_STATUS=$(printf %s "$R" | tail -n 1)"
# what the refused create left: network namespaces, nftables tables, the host's forwarding
echo "REFUSED_LEFT=$(network_left)"
R=$(curl -s -X POST -H "X-API-Key: $KEY" -H 'content-type: application/json' \\
  -d '{"templateID":"busybox","timeout":600,"allow_internet_access":false}' -w '\\n%{http_code}' $U/sandboxes)
echo "CREATE=$(printf %s "$R" | head -n 1 | base64 -w0)"
echo "CREATE_STATUS=$(printf %s "$R" | tail -n 1)"
ID=$(printf %s "$R" | grep -o '"sandboxID":"[^"]*"' | cut -d'"' -f4)
TOKEN=$(printf %s "$R" | grep -o '"envdAccessToken":"[^"]*"' | cut -d'"' -f4)
echo "RUN=$(start 'echo stock-$((6*7)); sleep 600 >/dev/null 2>&1 & echo $! > /tmp/sleeper; head -c 33554432 /dev/zero > /tmp/cached')"
echo "METRICS=$(curl -s -H "X-API-Key: $KEY" $U/sandboxes/$ID/metrics | base64 -w0)"
echo "PAUSE=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "X-API-Key: $KEY" $U/sandboxes/$ID/pause)"
echo "FROZEN=$(grep frozen $SCOPE/snaplab/$ID/cgroup.events || echo "no cgroup $ID among: $(ls $SCOPE/snaplab)")"
echo "HEALTH_PAUSED=$(health)"
echo "CONNECT=$(curl -s -o /dev/null -w '%{http_code}' -X POST -H "X-API-Key: $KEY" -H 'content-type: application/json' \\
  -d '{"timeout":600}' $U/sandboxes/$ID/connect)"
echo "AFTER=$(start 'kill -0 $(cat /tmp/sleeper) && echo alive; echo $(wc -c < /tmp/cached)')"
echo "KILL=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "X-API-Key: $KEY" $U/sandboxes/$ID)"
echo "HEALTH_KILLED=$(health)"
echo "LEFT=$(ls -d $SCOPE/snaplab/*/ 2>/dev/null | wc -l)"`;

/**
 * E2B's default create (internet access: egress) through the host's own network. The guest has no
 * interface out, so its "outside" is a namespace made here, a web server on a documentation address
 * reached by a route through a veth; a service of the host's on every address must stay out of a
 * machine's reach. Then a kill and gc: nothing left, forwarding off again.
 */
const EGRESS_SCRIPT = `set -eu
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
U=http://127.0.0.1:3000
KEY=$(snaplab key create e2b-egress --e2b)
# a TCP service that says who it is and whom it sees, and closes
cat > /tmp/slt-web.js <<'JS'
const [addr, port, name] = process.argv.slice(2);
require('net').createServer((c) => c.end(name + ' ' + c.remoteAddress + '\\n')).listen(Number(port), addr);
JS
# (each step on its own: a trap's failing command ends it under set -e)
cleanup() {
  systemctl stop snaplab-e2b slt-web slt-host 2>/dev/null || true
  ip netns del slt-out 2>/dev/null || true
}
trap cleanup EXIT
ip netns add slt-out
ip link add slt-o0 type veth peer name slt-o1 netns slt-out
ip addr add 198.51.100.1/30 dev slt-o0
ip link set slt-o0 up
ip -n slt-out link set lo up
ip -n slt-out addr add 198.51.100.2/30 dev slt-o1
ip -n slt-out link set slt-o1 up
ip -n slt-out addr add 203.0.113.10/32 dev lo
ip route add 203.0.113.0/24 via 198.51.100.2
systemd-run --unit slt-web --quiet ip netns exec slt-out /usr/local/bin/node /tmp/slt-web.js 203.0.113.10 8080 outside
systemd-run --unit slt-host --quiet /usr/local/bin/node /tmp/slt-web.js 0.0.0.0 8081 host
systemd-run --unit snaplab-e2b --quiet /usr/local/bin/snaplab serve --e2b-listen 127.0.0.1:3000
for i in $(seq 1 600); do
  busybox nc -w 2 203.0.113.10 8080 </dev/null | grep -q outside && busybox nc -w 2 198.51.100.1 8081 </dev/null | grep -q host &&
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H "X-API-Key: $KEY" $U/v2/sandboxes)" = 200 ] && break
  sleep 0.2
done
echo "FROM_HOST=$(busybox nc -w 2 203.0.113.10 8080 </dev/null)"
echo "HOST_SELF=$(busybox nc -w 2 198.51.100.1 8081 </dev/null)"
echo "FORWARD_BEFORE=$(cat /proc/sys/net/ipv4/ip_forward)"
${CONNECT_CALLS}
R=$(curl -s -X POST -H "X-API-Key: $KEY" -H 'content-type: application/json' -d '{"templateID":"busybox","timeout":600}' \\
  -w '\\n%{http_code}' $U/sandboxes)
echo "CREATE_STATUS=$(printf %s "$R" | tail -n 1)"
echo "CREATE=$(printf %s "$R" | head -n 1 | base64 -w0)"
ID=$(printf %s "$R" | grep -o '"sandboxID":"[^"]*"' | cut -d'"' -f4)
TOKEN=$(printf %s "$R" | grep -o '"envdAccessToken":"[^"]*"' | cut -d'"' -f4)
# (busybox's nc: its static wget resolves through NSS, which a machine without glibc's libraries crashes)
echo "OUT=$(start 'nc -w 5 203.0.113.10 8080 </dev/null')"
echo "HOST=$(start 'nc -w 3 198.51.100.1 8081 </dev/null 2>&1; echo rc=$?')"
# the host's end of the router's link (sle<tag>): the host's too (refused as the router's links are)
SLE=$(ip -4 -o addr show | awk '/ sle/ { split($4, a, "/"); print a[1] }')
echo "SLE=$SLE"
echo "UPLINK=$(start 'nc -w 3 '"$SLE"' 8081 </dev/null 2>&1; echo rc=$?')"
echo "FORWARD_DURING=$(cat /proc/sys/net/ipv4/ip_forward)"
# gc beside a live machine with egress: it sweeps the router's flows out of the host's table
# (ct-sweep, netlink on this kernel), and the machine still gets out after
OP=$(snaplab gc --json | grep -o '"operation": *"[^"]*"' | cut -d'"' -f4)
echo "GC_DURING=$(snaplab trace "$OP" --json | base64 -w0)"
echo "OUT_AFTER_GC=$(start 'nc -w 5 203.0.113.10 8080 </dev/null')"
echo "KILL=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE -H "X-API-Key: $KEY" $U/sandboxes/$ID)"
snaplab gc >/dev/null
echo "LEFT=$(network_left)"`;

/** A Start's answer (base64 of its envelopes): its stdout, and its end event. */
function connectEvents(b64: string): { stdout: string; end?: { exitCode?: number; exited?: boolean } } {
  const raw = Buffer.from(b64, 'base64');
  let stdout = '';
  let end: { exitCode?: number; exited?: boolean } | undefined;
  for (let at = 0; at + 5 <= raw.length; ) {
    const len = raw.readUInt32BE(at + 1);
    const m = JSON.parse(raw.subarray(at + 5, at + 5 + len).toString()) as {
      event?: { data?: { stdout?: string }; end?: { exitCode?: number; exited?: boolean } };
    };
    if (m.event?.data?.stdout) stdout += Buffer.from(m.event.data.stdout, 'base64').toString();
    if (m.event?.end) end = m.event.end;
    at += 5 + len;
  }
  return { stdout, end };
}

const shown = (r: GuestRun): string =>
  `${r.argv.join(' ')} exited ${r.code} after ${r.ms} ms\nstdout: ${r.stdout}\nstderr: ${r.stderr}`;

describe(`the guest is a stock Debian host (${STOCK_SUITE})`, () => {
  it('runs the suite asked for', async () => {
    expect((await need().sh('. /etc/os-release && echo "$VERSION_CODENAME"')).stdout.trim()).toBe(STOCK_SUITE);
  });

  it('runs systemd as PID 1', () => {
    expect(need().facts.pid1Exe).toMatch(/\/systemd$/);
  });

  it('has cgroup v2 only: /sys/fs/cgroup is cgroup2, no v1 hierarchy mounted', () => {
    const f = need().facts;
    expect(f.sameMountNsAsPid1).toBe(true);
    expect(f.cgroupFs).toBe('cgroup2fs');
    expect(f.cgroupV1Mounts).toEqual([]);
  });

  it('mounts /dev nosuid', () => {
    expect(need().facts.devOptions.split(',')).toContain('nosuid');
  });

  // the harness's own checks: room for snaplab's home, and the guest kernel's modules installed
  it('has at least 1 GiB free on its root disk, and every module snaplab loads (not loaded yet)', () => {
    expect(need().facts.rootAvailBytes).toBeGreaterThanOrEqual(2 ** 30);
    expect(need().facts.unresolvedModules).toEqual([]);
  });
});

describe('snaplab on the stock host', () => {
  const SCOPE = '/sys/fs/cgroup/snaplab.slice/snaplab.scope';
  const sh = async (script: string): Promise<string> => {
    const r = await need().sh(script);
    expect(r.exitCode, `${script}: ${r.stderr}`).toBe(0);
    return r.stdout.trim();
  };
  const ok = async (args: string[], opts?: Parameters<StockHost['snaplab']>[1]): Promise<GuestRun> => {
    const r = await need().snaplab(args, opts);
    expect(r.code, shown(r)).toBe(0);
    return r;
  };

  it("doctor says every backend starts a sandbox in a user namespace, and cgroups go in systemd's snaplab.scope", async () => {
    const r = await ok(['doctor', '--json']);
    const d = JSON.parse(r.stdout) as { ok: boolean; checks: { name: string; ok: boolean; reason: string }[] };
    expect(d.ok).toBe(true);
    const check = (name: string): { ok: boolean; reason: string } | undefined => d.checks.find((c) => c.name === name);
    for (const k of ['btrfs', 'dir', 'overlay'])
      expect(check(`userns: ${k}`), JSON.stringify(check(`userns: ${k}`))).toMatchObject({ ok: true });
    expect(check('cgroup v2')?.reason).toMatch(/snaplab\.scope \(delegated\)/);
  }, 180_000);

  // the demo and the storage cases run at once (it.concurrent): each is a few snaplab commands,
  // each a Node start of seconds on one of the guest's two emulated CPUs, and none reads what the
  // others make (own names; nothing counts the sandboxes under snaplab.scope, as the cases below do)
  it.concurrent('runs the demo', async () => {
    const r = await ok(['demo'], { timeoutMs: 150_000 });
    expect(r.stdout).toMatch(/restored .* reads "before"/);
  }, 180_000);

  // every backend in a user namespace; without one, overlay alone: its mount is then made on the
  // host (the other backends' paths differ only inside, and the dev host's tests cover them)
  for (const storage of ['btrfs', 'dir', 'overlay']) {
    for (const userns of storage === 'overlay' ? [true, false] : [true]) {
      it.concurrent(`create --storage ${storage}${userns ? '' : ' --no-userns'}, exec, rm`, async () => {
        const h = need();
        const name = `s-${storage}-${userns ? 'userns' : 'root'}`;
        const create = await h.snaplab([
          'create',
          '--image',
          'busybox',
          '--storage',
          storage,
          '--name',
          name,
          ...(userns ? [] : ['--no-userns']),
        ]);
        let exec: GuestRun | undefined;
        if (create.code === 0) exec = await h.snaplab(['exec', name, '--', 'cat', '/proc/self/uid_map']);
        // a failed create leaves nothing to rm (rm says so, exit 2); a made one must go
        const rm = await h.snaplab(['rm', name]);
        expect(create.code, shown(create)).toBe(0);
        expect(exec!.code, shown(exec!)).toBe(0);
        expect(exec!.stdout.trim().split(/\s+/)[1] === '0', shown(exec!)).toBe(!userns); // uid 0 inside is host root only without one
        expect(rm.code, shown(rm)).toBe(0);
      }, 180_000);
    }
  }

  it('holds limits in its delegated scope across a daemon-reload; a hog is OOM-killed; pause, resume, snapshot and restore work', async () => {
    onTestFailed(async () => {
      // when an expectation failed before its own rm (rm of a name that is not there is exit 2)
      for (const n of ['lim', 'lim2', 'nb', 'nb2']) await need().snaplab(['rm', n]);
      await need().snaplab(['snapshot', 'rm', 'base']);
    });
    const made = await ok([
      'create',
      '--image',
      'busybox',
      '--name',
      'lim',
      '--memory',
      '64M',
      '--pids',
      '64',
      '--cpus',
      '0.5',
      '--trace',
    ]);
    expect(made.stdout + made.stderr).toMatch(/total \d+ ms/);
    console.log(`create --trace in the stock host:\n${made.stdout}${made.stderr}`); // beside the same on this host: docs/benchmarks.md
    const dir = await sh(`d=$(ls -d ${SCOPE}/snaplab/*/) && echo "$d"`);
    const limits = `cat ${dir}memory.max ${dir}pids.max ${dir}cpu.max`;
    expect(await sh(limits)).toBe('67108864\n64\n50000 100000');
    expect((await sh('systemctl show snaplab.scope -p Delegate -p Slice -p ActiveState')).split('\n').sort()).toEqual([
      'ActiveState=active',
      'Delegate=yes',
      'Slice=snaplab.slice',
    ]);
    await sh('systemctl daemon-reload');
    expect(await sh(limits)).toBe('67108864\n64\n50000 100000');
    expect(await sh(`cat ${SCOPE}/cgroup.subtree_control`)).toMatch(/memory/);
    // a neighbour and the scope live on after an OOM kill below it (systemd stops a session scope on one: systemd#25376)
    await ok(['create', '--image', 'busybox', '--name', 'nb']);
    const keeper = await sh(`cat ${SCOPE}/keeper/cgroup.procs`);
    // (dd's one 100 MiB buffer: a pipe into tail took over 90 s to reach the limit at half a core under TCG)
    const hog = await need().snaplab(['exec', 'lim', '--', 'dd', 'if=/dev/zero', 'of=/dev/null', 'bs=100M', 'count=1']);
    expect(hog.code, shown(hog)).toBe(137);
    expect(hog.stderr).toMatch(/OOM killer/); // the C fast path's exec found the count in the scope
    await new Promise((r) => setTimeout(r, 2000)); // systemd's reaction, if any, is asynchronous
    expect(await sh('systemctl show snaplab.scope -p ActiveState --value')).toBe('active');
    expect(await sh(`cat ${SCOPE}/keeper/cgroup.procs`)).toBe(keeper);
    expect((await ok(['exec', 'nb', '--', 'echo', 'alive'])).stdout).toBe('alive\n');
    // a scope that lost its keeper gets a new one at the next create
    await sh(`kill -9 ${keeper}`);
    await ok(['create', '--image', 'busybox', '--name', 'nb2']);
    expect(await sh(`cat ${SCOPE}/keeper/cgroup.procs`)).toMatch(/^\d+$/);
    await ok(['rm', 'nb', 'nb2']);
    await ok(['pause', 'lim']);
    expect(await sh(`cat ${dir}cgroup.freeze`)).toBe('1');
    expect(
      (JSON.parse((await ok(['ls', '--json'])).stdout) as { name: string; state: string }[]).find(
        (b) => b.name === 'lim',
      )?.state,
    ).toBe('paused');
    await ok(['resume', 'lim']);
    await ok(['snapshot', 'lim', '--name', 'base']);
    await ok(['exec', 'lim', '--', 'sh', '-c', 'echo changed > /etc/mark']);
    await ok(['restore', 'base', '--name', 'lim2']);
    const back = await need().snaplab(['exec', 'lim2', '--', 'cat', '/etc/mark']);
    expect(back.code).not.toBe(0); // the snapshot was taken before the mark
    await ok(['rm', 'lim', 'lim2']);
    await ok(['snapshot', 'rm', 'base']);
  }, 300_000);

  it('serves a pool', async () => {
    onTestFailed(async () => {
      await need().snaplab(['pool', 'rm', 'jobs']);
    });
    await ok(['pool', 'create', 'jobs', '--image', 'busybox', '--size', '2'], { timeoutMs: 120_000 });
    const r = await ok(['run', '--pool', 'jobs', '--', 'echo', 'pooled']);
    expect(r.stdout).toBe('pooled\n');
    await ok(['pool', 'rm', 'jobs']);
  }, 300_000);

  it("boots a system machine whose systemd has controllers for its units: a unit's MemoryMax= holds", async () => {
    onTestFailed(async () => {
      // when an expectation failed before its own rm: the image would keep the pool mounted past gc
      await need().snaplab(['rm', 'sys1']);
      await need().snaplab(['image', 'rm', 'sysd']);
    });
    await ok(['image', 'import', '/opt/stock/sysd', '--name', 'sysd'], { timeoutMs: 180_000 });
    await ok(['create', '--image', 'sysd', '--init', 'systemd', '--name', 'sys1', '--memory', '512M'], {
      timeoutMs: 180_000,
    });
    const inside = async (script: string): Promise<GuestRun> =>
      need().snaplab(['exec', 'sys1', '--', 'sh', '-c', script]);
    expect((await inside('cat /sys/fs/cgroup/cgroup.controllers')).stdout).toMatch(/memory/);
    expect((await inside('cat /sys/fs/cgroup/cgroup.subtree_control')).stdout).toMatch(/memory/);
    // the host side: PID 1 in payload, the monitor and the agent in supervisor beside it
    expect(await sh(`ls ${SCOPE}/snaplab/*/`)).toMatch(/payload[\s\S]*supervisor/);
    expect(await sh(`ls ${SCOPE}/snaplab/*/payload/`)).toMatch(/init\.scope/);
    // an exec'd command is in the machine's cgroup namespace (the agent's leaf), so its systemd can move it
    expect((await inside('cat /proc/self/cgroup')).stdout.trim()).toBe('0::/snaplab-agent');
    const scoped = await inside('systemd-run --scope --quiet cat /proc/self/cgroup');
    expect(scoped.stdout, shown(scoped)).toMatch(/^0::\/.*\.scope$/m);
    const hog = await inside(
      'systemd-run --wait --unit hog -p MemoryMax=32M -p MemorySwapMax=0 sh -c "head -c 200000000 /dev/zero | tail"; systemctl show hog.service -p Result --value',
    );
    expect(hog.stdout.trim().split('\n').pop(), shown(hog)).toBe('oom-kill');
    await ok(['rm', 'sys1']);
    await ok(['image', 'rm', 'sysd']);
  }, 420_000);

  it('raises a two-machine scenario whose machines reach each other', async () => {
    await sh(`cat > /root/duo.yaml <<'EOF'
name: duo
networks:
  net: { subnet: 10.88.1.0/24 }
machines:
  a: { image: busybox, networks: { net: {} } }
  b: { image: busybox, networks: { net: {} } }
EOF`);
    onTestFailed(async () => {
      await need().snaplab(['down', 'duo'], { timeoutMs: 120_000 });
    });
    await ok(['up', '/root/duo.yaml', '--name', 'duo'], { timeoutMs: 180_000 });
    const ping = await need().snaplab(['exec', 'duo/a', '--', 'ping', '-c', '1', '-W', '5', 'b']);
    expect(ping.code, shown(ping)).toBe(0);
    await ok(['down', 'duo'], { timeoutMs: 120_000 });
  }, 420_000);

  it("runs the daemon from the shipped unit under the host's systemd; its sandboxes are in snaplab.scope, not its unit", async () => {
    onTestFailed(async () => {
      await need().sh('systemctl stop snaplab'); // when an expectation failed before its own stop
    });
    await sh(
      'cp /opt/snaplab/deploy/systemd/snaplab.service /etc/systemd/system/ && systemctl daemon-reload && systemctl start snaplab && for i in $(seq 1 600); do [ -S /var/lib/snaplab/daemon.sock ] && break; sleep 0.1; done; systemctl is-active snaplab',
    );
    const viaDaemon = { env: { SNAPLAB_HOST: 'unix:/var/lib/snaplab/daemon.sock' } };
    await ok(['create', '--image', 'busybox', '--name', 'viad'], viaDaemon);
    expect((await ok(['exec', 'viad', '--', 'echo', 'served'], viaDaemon)).stdout).toBe('served\n');
    expect(await sh(`ls -d ${SCOPE}/snaplab/*/ | wc -l`)).toBe('1');
    expect(await sh('ls -d /sys/fs/cgroup/system.slice/snaplab.service/*/ 2>/dev/null | wc -l')).toBe('0');
    await ok(['rm', 'viad'], viaDaemon);
    await sh('systemctl stop snaplab && ! systemctl is-active snaplab');
  }, 300_000);

  // E2B's wire protocol with curl (the guest has no Node SDK): what reads cgroup v2 files of its own
  // (getMetrics: memory.current, memory.stat's file, cpu.stat) and pause's freeze, under systemd
  it('serves the E2B front from a systemd unit: create, a command over Connect, getMetrics on cgroup v2, pause, connect, kill', async () => {
    onTestFailed(async () => {
      // (nft put back first: a script killed at its timeout runs no trap)
      await need().sh(
        '[ -e /usr/sbin/nft.away ] && mv -f /usr/sbin/nft.away /usr/sbin/nft; systemctl stop snaplab-e2b; snaplab rm --all',
      );
    });
    const out = await sh(E2B_SCRIPT.replaceAll('$SCOPE', SCOPE));
    const got = Object.fromEntries(
      out.split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)] as const),
    );
    // without nftables a create with internet access says what to install (it was a 500 of
    // "spawn nft ENOENT"), and leaves nothing behind
    expect(got.NFT).toMatch(/\/nft$/);
    const egress = JSON.parse(Buffer.from(got.EGRESS!, 'base64').toString()) as { message: string };
    expect(got.EGRESS_STATUS, egress.message).toBe('503');
    expect(egress.message).toMatch(/nft is not installed .*hint: apt-get install nftables/);
    expect(got.REFUSED_LEFT!.split(' ')).toEqual(['0', '0', '0']);
    const created = JSON.parse(Buffer.from(got.CREATE!, 'base64').toString()) as Record<string, unknown>;
    expect(got.CREATE_STATUS, JSON.stringify(created)).toBe('201');
    expect(created).toMatchObject({ templateID: 'busybox', envdAccessToken: expect.any(String) });
    const first = connectEvents(got.RUN!);
    expect(first.stdout, got.RUN).toBe('stock-42\n');
    expect(first.end).toMatchObject({ exited: true });
    expect(first.end?.exitCode ?? 0).toBe(0);
    const [sample] = JSON.parse(Buffer.from(got.METRICS!, 'base64').toString()) as Record<string, number>[];
    // its 32 MiB file is page cache of its own cgroup (memory.stat `file` on v2), within what it uses
    expect(sample!.memCache).toBeGreaterThan(24 << 20);
    expect(sample!.memUsed).toBeGreaterThanOrEqual(sample!.memCache!);
    expect(sample!.memTotal).toBeGreaterThan(sample!.memUsed!);
    expect(sample!.cpuCount).toBeGreaterThanOrEqual(1);
    expect(sample!.diskUsed).toBeGreaterThan(24 << 20);
    expect(got.PAUSE).toBe('204');
    expect(got.FROZEN).toBe('frozen 1'); // cgroup.events of its own cgroup under snaplab.scope
    expect(got.HEALTH_PAUSED).toBe('502');
    expect(got.CONNECT).toBe('201'); // resumed
    // the same processes and files after the resume: the sleep started before the pause
    const after = connectEvents(got.AFTER!);
    expect(after.stdout, got.AFTER).toBe('alive\n33554432\n');
    expect(got.KILL).toBe('204');
    expect(got.HEALTH_KILLED).toBe('502');
    expect(got.LEFT).toBe('0');
  }, 300_000);

  // the host's own network under systemd and a stock kernel: the nftables tables, forwarding and NAT
  // that egress makes there (the suite's egress cases play the host in a namespace of their own)
  it("gives E2B's default create internet access through the host's network, and nothing of the host's; gc undoes it", async () => {
    onTestFailed(async () => {
      await need().sh(
        'systemctl stop snaplab-e2b slt-web slt-host; ip netns del slt-out; snaplab rm --all; snaplab gc',
      );
    });
    const out = await sh(EGRESS_SCRIPT);
    const got = Object.fromEntries(
      out.split('\n').map((l) => [l.slice(0, l.indexOf('=')), l.slice(l.indexOf('=') + 1)] as const),
    );
    expect(got.FROM_HOST).toBe('outside 198.51.100.1'); // the stand-in outside answers the host
    expect(got.HOST_SELF).toBe('host 198.51.100.1'); // and the host's own service answers there
    expect(got.FORWARD_BEFORE).toBe('0'); // Debian's default
    expect(got.CREATE_STATUS, Buffer.from(got.CREATE ?? '', 'base64').toString()).toBe('201');
    // out through the host's NAT: the outside sees the host's own address
    const reached = connectEvents(got.OUT!);
    expect(reached.stdout, got.OUT).toBe('outside 198.51.100.1\n');
    expect(reached.end?.exitCode ?? 0).toBe(0);
    // the host's addresses: refused, not answered
    const host = connectEvents(got.HOST!).stdout;
    expect(host, host).not.toMatch(/^host /m);
    expect(host).toMatch(/rc=1$/m);
    expect(got.SLE).toMatch(/^100\.127\./);
    const uplink = connectEvents(got.UPLINK!).stdout;
    expect(uplink, uplink).not.toMatch(/^host /m);
    expect(uplink).toMatch(/rc=1$/m);
    expect(got.FORWARD_DURING).toBe('1');
    // gc's trace: its egress pass ran, and nothing in it failed (the sweep's failure would be there)
    const gc = JSON.parse(Buffer.from(got.GC_DURING!, 'base64').toString()) as {
      status: string;
      phases: { name: string; failed?: string }[];
    };
    expect(gc.status).toBe('ok');
    expect(gc.phases.map((p) => p.name)).toContain('egress');
    expect(gc.phases.filter((p) => p.failed)).toEqual([]);
    expect(connectEvents(got.OUT_AFTER_GC!).stdout, got.OUT_AFTER_GC).toBe('outside 198.51.100.1\n');
    expect(got.KILL).toBe('204');
    // no namespace, no nftables table of snaplab's; forwarding off again, as it was
    expect(got.LEFT!.split(' ')).toEqual(['0', '0', '0']);
  }, 300_000);

  it("gc leaves nothing: no cgroup, scope, mount, loop device or process of snaplab's", async () => {
    // as a user ends: every machine and image removed, then gc
    await ok(['rm', '--all']);
    await ok(['image', 'rm', '--force', 'busybox']);
    await ok(['gc']);
    expect(
      await sh(
        `[ -e ${SCOPE} ] && echo scope; grep /var/lib/snaplab /proc/self/mountinfo; losetup -a | grep /var/lib/snaplab; ps -eo pid,cgroup | grep snaplab.s; true`,
      ),
    ).toBe('');
    expect((await need().sh('systemctl is-active snaplab.scope')).stdout.trim()).not.toBe('active');
  }, 180_000);
});
