/**
 * The image sources, by kind: the one place that lists them (as drivers/registry.ts lists drivers).
 * The lab takes the source an operation names (resolve the built-in image, import, build); the
 * contract suite and `doctor` go through all of them.
 */
import { archiveSource } from './sources/archive.js';
import { busyboxSource } from './sources/busybox.js';
import { debianSource } from './sources/debian.js';

export { archiveSource, busyboxSource, debianSource };

export const IMAGE_SOURCES = [busyboxSource, debianSource, archiveSource] as const;
