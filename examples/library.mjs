// The library in one screen: create a sandbox, run commands, snapshot, restore.
// Run it from a checkout after `bash scripts/setup.sh`, as root: node examples/library.mjs
// (In TypeScript, `await using box = await lab.create()` destroys the sandbox at scope end;
// plain JavaScript on Node 20 has no `using` yet, hence the try/finally blocks.)
import { Lab } from 'snaplab';

const lab = await Lab.open(); // $SNAPLAB_HOME or /var/lib/snaplab
try {
  const box = await lab.create({ image: 'busybox', limits: { memoryBytes: 256 * 2 ** 20, pids: 512 } });
  try {
    console.log(`created ${box.name} in ${box.lastTrace.totalMs.toFixed(1)} ms`);

    const r = await box.exec(['sh', '-c', 'echo hello > /root/greeting; cat /root/greeting']);
    console.log(`exit ${r.exitCode}: ${r.stdout.toString().trim()}`);

    // stream output as it comes
    await box.exec(['sh', '-c', 'for i in 1 2 3; do echo tick $i; sleep 0.1; done'], {
      onStdout: (chunk) => process.stdout.write(chunk),
    });

    const snap = await box.snapshot(`example-${Date.now()}`);
    await box.exec(['sh', '-c', 'echo changed > /root/greeting']);

    const copy = await lab.restore(snap.name);
    try {
      const seen = (await copy.exec(['cat', '/root/greeting'])).stdout.toString().trim();
      console.log(`restored ${snap.name}: /root/greeting reads "${seen}"`);
    } finally {
      await copy.destroy();
    }
    await lab.removeSnapshot(snap.name);
  } finally {
    await box.destroy();
  }
} finally {
  lab.close();
}
