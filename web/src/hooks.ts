import { useCallback, useEffect, useState } from 'preact/hooks';

/** The route: the part of the location hash after `#/`, split on `/` (each segment decoded). */
export function useRoute(): string[] {
  const decode = (p: string): string => {
    try {
      return decodeURIComponent(p);
    } catch {
      return p;
    }
  };
  const read = (): string[] => location.hash.replace(/^#\/?/, '').split('/').filter(Boolean).map(decode);
  const [route, setRoute] = useState(read);
  useEffect(() => {
    const on = (): void => setRoute(read());
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  return route;
}

export const go = (...parts: string[]): void => {
  location.hash = `#/${parts.map(encodeURIComponent).join('/')}`;
};

export const href = (...parts: string[]): string => `#/${parts.map(encodeURIComponent).join('/')}`;

/**
 * Load something, again every `everyMs` (0: once) and whenever `reload()` is called. The last good
 * value stays shown while a later load fails; the error is shown beside it.
 */
export function usePoll<T>(
  load: () => Promise<T>,
  everyMs = 0,
  deps: unknown[] = [],
): { data: T | undefined; error: unknown; reload: () => void } {
  const [data, setData] = useState<T | undefined>(undefined);
  const [error, setError] = useState<unknown>(undefined);
  const [tick, setTick] = useState(0);
  // another thing to load (a machine's id): what was shown was the other one's
  useEffect(() => {
    setData(undefined);
    setError(undefined);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, deps);
  useEffect(() => {
    // one flag per run of the effect: a load still in flight from an earlier run (before a reload
    // or another id) neither writes its answer nor starts a timer
    let alive = true;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const run = (): void => {
      load()
        .then(
          (v) => {
            if (alive) {
              setData(v);
              setError(undefined);
            }
          },
          (e: unknown) => {
            if (alive) setError(e);
          },
        )
        .finally(() => {
          if (alive && everyMs > 0) timer = setTimeout(run, everyMs);
        });
    };
    run();
    return () => {
      alive = false;
      if (timer) clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [tick, everyMs, ...deps]);
  const reload = useCallback(() => setTick((t) => t + 1), []);
  return { data, error, reload };
}

/** Run an action with its own busy flag and error (buttons show both). */
export function useAction<A extends unknown[]>(
  fn: (...args: A) => Promise<unknown>,
): { run: (...args: A) => Promise<void>; busy: boolean; error: unknown; clear: () => void } {
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<unknown>(undefined);
  const run = async (...args: A): Promise<void> => {
    setBusy(true);
    setError(undefined);
    try {
      await fn(...args);
    } catch (e) {
      setError(e);
    } finally {
      setBusy(false);
    }
  };
  return { run, busy, error, clear: () => setError(undefined) };
}
