/**
 * Who an envd call acts as, as envd decides it: the user asked for (`?username=`, `Authorization:
 * Basic user:`), else the sandbox's default, which is `user` where the image has one (E2B's
 * templates, snaplab's built-in `base` and `code-interpreter-v1`) and root elsewhere (busybox and
 * most imported images). A command runs in its user's home (from the machine's /etc/passwd) unless
 * given a cwd; E2B's `/bin/bash -l -c CMD` runs with /bin/sh where the machine has no /bin/bash.
 * Both are read once a sandbox: when the front made it, soon after (its first command does not
 * wait for that read: see `fresh`), else on its first call; with them, the names of its users and
 * groups (EntryInfo's `owner` and `group`, which envd looks up in the same files).
 */
import type { SandboxApi } from '../sdk/api.js';
import { SnaplabError, isSnaplabError, type ErrorCode } from '../errors.js';
import { handledElsewhere } from '../cleanup.js';

/** How long after its create a sandbox's users, taken from its key's last sandbox of its image, are checked. */
const VERIFY_AFTER_MS = 2000;

/** E2B's default user (envd's, and the SDK's before envd 0.4.0). */
export const E2B_USER = 'user';

/** A machine's user and group names by id (its /etc/passwd and /etc/group), as envd names a file's owner. */
export interface IdNames {
  users: ReadonlyMap<number, string>;
  groups: ReadonlyMap<number, string>;
}

export interface EnvdUser {
  /** undefined: the sandbox's own default, root */
  name: string | undefined;
  ids: IdNames;
  /** the user's home (its working directory and where relative paths are), when known */
  home: string | undefined;
  /** what runs E2B's `/bin/bash` in this machine: itself, or /bin/sh where it has none */
  shell: '/bin/bash' | '/bin/sh';
}

/** What a machine's calls need known of it: its users' homes, and whether it has /bin/bash. */
interface Facts {
  homes: Map<string, string>;
  ids: IdNames;
  bash: boolean;
  /** false: /bin/bash could not be stat'ed (not "not there": a helper killed, a loop of links), so `bash` is a guess */
  sure: boolean;
}

/**
 * What a key's next sandboxes of an image start from, after a sandbox of it was read: that read,
 * where none was known; else only what both say. A sandbox read seconds after its create may have
 * changed its files (a user added, bash installed): what it alone has is not the image's. A user
 * or bash the image gains is then not known until the front restarts: the user is left out (root
 * is the default) and sh runs E2B's commands, never an exec that fails or a user that is not there.
 */
function merged(was: Facts | undefined, f: Facts): Facts | undefined {
  if (!was) return f.sure ? f : undefined;
  const homesBoth = new Map([...f.homes].filter(([name]) => was.homes.has(name)));
  const both = <K, V>(a: ReadonlyMap<K, V>, b: ReadonlyMap<K, V>) => new Map([...a].filter(([k, v]) => b.get(k) === v));
  const ids = { users: both(f.ids.users, was.ids.users), groups: both(f.ids.groups, was.ids.groups) };
  return { homes: homesBoth, ids, bash: f.sure ? was.bash && f.bash : was.bash, sure: true };
}

/** id → name, from an /etc/passwd or /etc/group (the first name of an id) */
function idNames(text: string): Map<number, string> {
  const m = new Map<number, string>();
  for (const line of text.split('\n')) {
    const f = line.split(':');
    if (f.length >= 3 && f[0] && /^\d+$/.test(f[2]!) && !m.has(Number(f[2]))) m.set(Number(f[2]), f[0]);
  }
  return m;
}

/** name → home, from an /etc/passwd */
function homes(passwd: string): Map<string, string> {
  const m = new Map<string, string>();
  for (const line of passwd.split('\n')) {
    const f = line.split(':');
    if (f.length >= 7 && f[0] && f[5]) m.set(f[0], f[5]);
  }
  return m;
}

export class EnvdUsers {
  private readonly facts = new Map<string, Promise<Facts>>();
  /** a sandbox's facts being read again for a name they lacked */
  private readonly rereading = new Map<string, Promise<Facts>>();
  /** key + image → its facts as a sandbox of that key and image last read them (fresh sandboxes start from these) */
  private readonly ofImage = new Map<string, Facts>();

  /**
   * The user a call acts as: `asked`, else `user` where the machine has one, else root. A user the
   * machine's /etc/passwd does not name (read again once, for one added since) is refused as envd
   * refuses it: UNAUTHORIZED, "invalid username" (the file calls run as root: nothing else would).
   */
  async of(box: SandboxApi, asked: string | undefined): Promise<EnvdUser> {
    let facts = await this.factsOf(box);
    if (asked !== undefined && asked !== 'root' && !facts.homes.has(asked)) {
      // read again; callers meanwhile share that read (a flood of names it lacks, at once, costs
      // one), and one that comes after it reads again (a user added since is found)
      let again = this.rereading.get(box.id);
      if (!again) {
        this.facts.delete(box.id);
        again = this.factsOf(box);
        this.rereading.set(box.id, again);
        const done = (): void => void (this.rereading.get(box.id) === again && this.rereading.delete(box.id));
        again.then(done, done);
      }
      facts = await again;
      if (!facts.homes.has(asked))
        throw new SnaplabError(
          'UNAUTHORIZED',
          `invalid username: ${JSON.stringify(asked)} is not a user of sandbox ${box.id}`,
          "give a user in the sandbox's /etc/passwd",
        );
    }
    const { homes: known, bash, ids } = facts;
    const name = asked ?? (known.has(E2B_USER) ? E2B_USER : undefined);
    const home = known.get(name ?? 'root') ?? (name === undefined || name === 'root' ? '/root' : undefined);
    return { name, ids, home, shell: bash ? '/bin/bash' : '/bin/sh' };
  }

  /**
   * A sandbox this front just made for `apiKey`: its facts are those its key's last sandbox of the
   * same image had (a fresh machine's /etc/passwd and /bin/bash are its image's), and they are read
   * to check them, VERIFY_AFTER_MS later, unless it is gone by then: that read (two agent commands)
   * took the same cores as its first command, which used the known users all the same (a first
   * `commands.run` from a pool 152 → 103 ms, docs/benchmarks.md). The read replaces them for it,
   * and for the next only where both agree (`merged`). The key's first sandbox of an image has its
   * read at once, and its first call waits for it. Nothing is shared between keys.
   */
  fresh(box: SandboxApi, apiKey: string): void {
    const image = `${apiKey}\0${box.image}`;
    const seen = this.ofImage.get(image);
    const check = (): void => {
      const read = this.read(box);
      if (!seen) read.catch(() => this.facts.get(box.id) === read && this.facts.delete(box.id));
      read.then((f) => {
        const next = merged(this.ofImage.get(image), f);
        if (next) this.ofImage.set(image, next);
        if (this.facts.has(box.id)) this.facts.set(box.id, Promise.resolve(f));
      }, handledElsewhere);
      if (!seen) this.facts.set(box.id, read);
    };
    if (!seen) {
      check();
      return;
    }
    this.facts.set(box.id, Promise.resolve(seen));
    // (a sandbox forgotten meanwhile, killed: nothing to check)
    setTimeout(() => this.facts.has(box.id) && check(), VERIFY_AFTER_MS).unref();
  }

  private factsOf(box: SandboxApi): Promise<Facts> {
    let p = this.facts.get(box.id);
    if (!p) {
      p = this.read(box);
      this.facts.set(box.id, p);
      // a failure (the machine paused, gone) is asked again next time
      p.catch(() => this.facts.delete(box.id));
    }
    return p;
  }

  private async read(box: SandboxApi): Promise<Facts> {
    // a machine without /etc/passwd: root alone; without a /bin/bash it can stat: sh (as a shell's
    // `[ -x /bin/bash ]` says false on any error), while a machine paused or gone fails the read
    const missing =
      <T>(none: T, codes: ErrorCode[]) =>
      (e: unknown): T => {
        if (codes.some((c) => isSnaplabError(e, c))) return none;
        throw e;
      };
    const [passwd, group, bash] = await Promise.all([
      box.files.read('/etc/passwd').then((b) => b.toString('utf8'), missing('', ['FILE_NOT_FOUND'])),
      box.files.read('/etc/group').then((b) => b.toString('utf8'), missing('', ['FILE_NOT_FOUND'])),
      box.files
        .stat('/bin/bash', { follow: true })
        .then((i) => (i.type === 'file' ? 'yes' : 'no'), missing('no' as const, ['FILE_NOT_FOUND']))
        .catch(missing('unsure' as const, ['FILE_ERROR'])),
    ]);
    return {
      homes: homes(passwd),
      ids: { users: idNames(passwd), groups: idNames(group) },
      bash: bash === 'yes',
      sure: bash !== 'unsure',
    };
  }

  forget(id: string): void {
    this.facts.delete(id);
    this.rereading.delete(id);
  }
}
