import { Lab } from '../dist/sdk/index.js';
const home = process.argv[2];
const n = Number(process.argv[3] ?? 1000);
const lab = await Lab.open({ home });
const t0 = performance.now();
let made = 0;
const worker = async () => { while (made < n) { made++; const b = await lab.create(); b.close(); } };
await Promise.all([worker(), worker(), worker(), worker()]);
console.log(`created ${n} in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
for (let i = 0; i < 3; i++) { const t = performance.now(); const r = await lab.gc(); console.log('gc', (performance.now() - t).toFixed(0), 'ms', JSON.stringify(r).slice(0, 200)); }
await lab.close();
