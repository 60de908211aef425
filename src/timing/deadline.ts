/**
 * A timeout that a busy event loop cannot turn into a false one. When a process's loop is held (a
 * pass over thousands of records, a host so loaded that the process gets a fraction of a core), a
 * timer and the answer it waits for can both be due when the loop comes back, and Node runs timers
 * before it reads sockets: a plain setTimeout would fail a wait whose answer had in fact arrived.
 * `deadline` calls `late` only after the loop has turned `TURNS` more times once the time ran out
 * (setImmediate hops: each turn's poll phase reads what is ready; a connection whose connect was
 * completed by the first turn is read from by the next), so an answer that came in time wins. A
 * wait is declared failed on evidence, not on the process's own slowness.
 */
export interface Deadline {
  clear(): void;
}

const TURNS = 3;

export function deadline(ms: number, late: () => void): Deadline {
  let immediate: NodeJS.Immediate | undefined;
  const hop = (left: number): void => {
    immediate = setImmediate(left > 1 ? () => hop(left - 1) : late);
  };
  const timer = setTimeout(() => hop(TURNS), ms);
  return {
    clear() {
      clearTimeout(timer);
      if (immediate) clearImmediate(immediate);
    },
  };
}
