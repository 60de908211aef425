import { createHash, randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { gzipSync } from 'node:zlib';
import { run } from '../host/run.js';
import { hostArch } from '../image/oci.js';
import type { Lab } from '../sdk/lab.js';
import type { Progress } from './progress.js';
import { pad } from './report-text.js';
import { latencySummary, type LatencySummary } from './stats.js';
import { noted } from '../cleanup.js';

export interface ImageBenchSummary {
  workload: 'image-import';
  startedAt: string;
  finishedAt: string;
  settings: { rounds: number; layers: number; uncompressedBytes: number; compressedBytes: number; files: number };
  cases: { name: string; baseline: boolean; ms: LatencySummary & { samples: number } }[];
  /** p50 of snaplab's import over tar's */
  ratio: number;
}

const now = (): number => Number(process.hrtime.bigint()) / 1e6;

/** Half random bytes, half repeated text: compresses about as well as binaries and libraries do. */
function content(size: number): Buffer {
  const half = Math.floor(size / 2);
  return Buffer.concat([randomBytes(half), Buffer.alloc(size - half, 'snaplab image bench ')]);
}

/**
 * Three layers, ~100 MB unpacked: many small files (a library tree), a few large ones, and a
 * layer that removes and replaces some of the first's. Written as trees and tarred by GNU tar,
 * gzip'd by zlib, laid out as an OCI image.
 */
async function makeImage(
  dir: string,
): Promise<{ layout: string; blobs: string[]; files: number; uncompressed: number; compressed: number }> {
  const trees = [join(dir, 'tree1'), join(dir, 'tree2'), join(dir, 'tree3')];
  let files = 0;
  for (let d = 0; d < 40; d++) {
    mkdirSync(join(trees[0]!, 'usr/lib', `pkg${d}`), { recursive: true });
    for (let f = 0; f < 50; f++, files++)
      writeFileSync(join(trees[0]!, 'usr/lib', `pkg${d}`, `f${f}.so`), content(16 << 10));
  }
  mkdirSync(join(trees[1]!, 'opt/big'), { recursive: true });
  for (let f = 0; f < 36; f++, files++) writeFileSync(join(trees[1]!, 'opt/big', `blob${f}`), content(1 << 20));
  mkdirSync(join(trees[2]!, 'usr/lib/pkg0'), { recursive: true });
  for (let f = 0; f < 10; f++, files++) writeFileSync(join(trees[2]!, 'usr/lib/pkg0', `.wh.f${f}.so`), '');
  mkdirSync(join(trees[2]!, 'srv/data'), { recursive: true });
  for (let f = 0; f < 30; f++, files++) writeFileSync(join(trees[2]!, 'srv/data', `d${f}`), content(1 << 20));
  const layout = join(dir, 'layout');
  mkdirSync(join(layout, 'blobs/sha256'), { recursive: true });
  const sha = (b: Buffer): string => createHash('sha256').update(b).digest('hex');
  const layers: { digest: string; size: number; diffId: string }[] = [];
  const blobs: string[] = [];
  let uncompressed = 0;
  for (const [i, t] of trees.entries()) {
    const plain = join(dir, `layer${i}.tar`);
    await run('tar', ['--numeric-owner', '-cf', plain, '-C', t, '.']);
    const raw = readFileSync(plain);
    uncompressed += raw.length;
    const gz = gzipSync(raw, { level: 6 });
    writeFileSync(join(layout, 'blobs/sha256', sha(gz)), gz);
    blobs.push(join(layout, 'blobs/sha256', sha(gz)));
    layers.push({ digest: `sha256:${sha(gz)}`, size: gz.length, diffId: `sha256:${sha(raw)}` });
    rmSync(plain);
    rmSync(t, { recursive: true, force: true });
  }
  const put = (o: unknown): { digest: string; size: number } => {
    const b = Buffer.from(JSON.stringify(o));
    writeFileSync(join(layout, 'blobs/sha256', sha(b)), b);
    return { digest: `sha256:${sha(b)}`, size: b.length };
  };
  const config = put({
    architecture: hostArch(),
    os: 'linux',
    config: {},
    rootfs: { type: 'layers', diff_ids: layers.map((l) => l.diffId) },
  });
  const manifest = put({
    schemaVersion: 2,
    mediaType: 'application/vnd.oci.image.manifest.v1+json',
    config: { mediaType: 'application/vnd.oci.image.config.v1+json', ...config },
    layers: layers.map((l) => ({
      mediaType: 'application/vnd.oci.image.layer.v1.tar+gzip',
      digest: l.digest,
      size: l.size,
    })),
  });
  writeFileSync(join(layout, 'oci-layout'), JSON.stringify({ imageLayoutVersion: '1.0.0' }));
  writeFileSync(
    join(layout, 'index.json'),
    JSON.stringify({
      schemaVersion: 2,
      manifests: [{ mediaType: 'application/vnd.oci.image.manifest.v1+json', ...manifest }],
    }),
  );
  return { layout, blobs, files, uncompressed, compressed: layers.reduce((a, l) => a + l.size, 0) };
}

/**
 * `snaplab bench --workload image-import`: import of a ~100 MB, three-layer OCI image (digests
 * checked, whiteouts applied, every path resolved in the root) beside GNU `tar -xzf` of the same
 * layers into a directory on the same filesystem, alternating within each round.
 */
export async function imageBench(lab: Lab, rounds: number, progress: Progress): Promise<ImageBenchSummary> {
  const startedAt = new Date().toISOString();
  mkdirSync(join(lab.home, 'images'), { recursive: true });
  // a .tmp-PID- name: gc removes it if this process dies before it does
  const dir = mkdtempSync(join(lab.home, 'images', `.tmp-${process.pid}-bench-`));
  const tag = `bench-import-${process.pid}`;
  try {
    progress.note('writing a ~100 MB three-layer OCI image');
    const img = await makeImage(dir);
    const ours: number[] = [];
    const tars: number[] = [];
    for (let r = 1; r <= rounds; r++) {
      const target = join(dir, `tar-${r}`);
      mkdirSync(target);
      let t0 = now();
      for (const b of img.blobs) await run('tar', ['--numeric-owner', '-xzf', b, '-C', target]);
      tars.push(now() - t0);
      rmSync(target, { recursive: true, force: true });
      t0 = now();
      await lab.importImage(img.layout, `${tag}-${r}`);
      ours.push(now() - t0);
      await lab.removeImage(`${tag}-${r}`);
      progress.note(
        `round ${r}/${rounds}: import ${ours.at(-1)!.toFixed(0)} ms, tar -xzf ${tars.at(-1)!.toFixed(0)} ms`,
      );
    }
    const a = latencySummary(ours);
    const b = latencySummary(tars);
    return {
      workload: 'image-import',
      startedAt,
      finishedAt: new Date().toISOString(),
      settings: {
        rounds,
        layers: img.blobs.length,
        uncompressedBytes: img.uncompressed,
        compressedBytes: img.compressed,
        files: img.files,
      },
      cases: [
        {
          name: 'snaplab image import (OCI layout, 3 gzip layers)',
          baseline: false,
          ms: { ...a, samples: ours.length },
        },
        { name: 'tar -xzf of the same layers', baseline: true, ms: { ...b, samples: tars.length } },
      ],
      ratio: Math.round((a.p50 / b.p50) * 100) / 100,
    };
  } finally {
    for (const i of await lab.images())
      if (i.name.startsWith(`${tag}-`)) await lab.removeImage(i.name).catch(noted(`remove image ${i.name}`));
    rmSync(dir, { recursive: true, force: true });
    progress.done();
  }
}

export function renderImageSummary(s: ImageBenchSummary): string {
  const mb = (n: number): string => `${(n / 2 ** 20).toFixed(1)} MiB`;
  const rows = s.cases.map((c) => [
    `${c.name}${c.baseline ? ' (baseline)' : ''}`,
    c.ms.p50.toFixed(0),
    c.ms.p90.toFixed(0),
    String(c.ms.samples),
  ]);
  return [
    `workload image-import: ${s.settings.layers} layers, ${s.settings.files} files, ${mb(s.settings.uncompressedBytes)} unpacked (${mb(s.settings.compressedBytes)} gzip'd); ${s.settings.rounds} rounds`,
    ...pad(['case', 'p50 ms', 'p90 ms', 'samples'], rows),
    `p50 ratio (same run): import / tar -xzf = ${s.ratio}`,
  ].join('\n');
}
