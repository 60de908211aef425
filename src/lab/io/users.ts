import type { AgentClient } from '../../agent/client.js';
import { SnaplabError } from '../../errors.js';

interface Passwd {
  name: string;
  uid: number;
  gid: number;
}
interface Group {
  name: string;
  gid: number;
  members: string[];
}

function parsePasswd(text: string): Passwd[] {
  return (
    text
      .split('\n')
      .map((l) => l.split(':'))
      // an id past MAX_ID ((uid_t)-1 is "no change" to the kernel) names no one
      .filter(
        (f) =>
          f.length >= 4 &&
          /^\d+$/.test(f[2]!) &&
          /^\d+$/.test(f[3]!) &&
          Number(f[2]) <= MAX_ID &&
          Number(f[3]) <= MAX_ID,
      )
      .map((f) => ({ name: f[0]!, uid: Number(f[2]), gid: Number(f[3]) }))
  );
}

function parseGroup(text: string): Group[] {
  return text
    .split('\n')
    .map((l) => l.split(':'))
    .filter((f) => f.length >= 3 && /^\d+$/.test(f[2]!) && Number(f[2]) <= MAX_ID)
    .map((f) => ({ name: f[0]!, gid: Number(f[2]), members: (f[3] ?? '').split(',').filter(Boolean) }));
}

const MAX_ID = 0xfffffffe;

/** "UID:GID" when `spec` is two numbers a file may be given (no lookup needed: no names, no groups); else undefined. */
export function numericOwner(spec: string): string | undefined {
  const m = /^(\d{1,10}):(\d{1,10})$/.exec(spec);
  return m && Number(m[1]) <= MAX_ID && Number(m[2]) <= MAX_ID ? `${Number(m[1])}:${Number(m[2])}` : undefined;
}

/**
 * `user[:group]` as Docker reads it, against the machine's own /etc/passwd and /etc/group (read
 * through the agent: the files of the machine as it is now, not of its image): a name or a uid;
 * the group is the user's primary group unless given; supplementary groups come from /etc/group.
 * Returns the agent's "UID:GID[:G1,...]".
 */
export async function resolveUser(agent: AgentClient, spec: string): Promise<string> {
  const [u, g, extra] = spec.split(':');
  if (!u || extra !== undefined || g === '') {
    throw new SnaplabError(
      'BAD_INPUT',
      `invalid user ${JSON.stringify(spec)}`,
      'give USER or USER:GROUP, each a name or a number (e.g. nginx, 1000:1000)',
    );
  }
  const read = async (path: string): Promise<string> =>
    (await agent.getFile(path).catch(() => Buffer.alloc(0))).toString('utf8');
  const numeric = (x: string): boolean => /^\d+$/.test(x) && Number(x) <= MAX_ID;
  // the machine's files even for a numeric uid: its primary group and groups come from there (both
  // asked at once: every command run as a user waits for them)
  const [passwd, group] = await Promise.all([read('/etc/passwd'), read('/etc/group')]);
  const [users, groups] = [parsePasswd(passwd), parseGroup(group)];
  const found = numeric(u) ? users.find((p) => p.uid === Number(u)) : users.find((p) => p.name === u);
  if (!found && !numeric(u))
    throw new SnaplabError(
      'USER_NOT_FOUND',
      `no user ${JSON.stringify(u)} in the machine's /etc/passwd`,
      'give a user that exists in the machine, or a numeric uid',
    );
  const uid = found?.uid ?? Number(u);
  const name = found?.name;
  let gid = found?.gid;
  if (g !== undefined) {
    if (numeric(g)) gid = Number(g);
    else {
      const named = groups.find((x) => x.name === g);
      if (!named)
        throw new SnaplabError(
          'BAD_INPUT',
          `no group ${JSON.stringify(g)} in the machine's /etc/group`,
          'give a group that exists in the machine, or a numeric gid',
        );
      gid = named.gid;
    }
  }
  // a uid the machine does not know runs with gid 0 and no groups, as in Docker
  gid ??= 0;
  const supplementary =
    name === undefined
      ? []
      : [...new Set(groups.filter((x) => x.members.includes(name) && x.gid !== gid).map((x) => x.gid))].slice(0, 32);
  return `${uid}:${gid}${supplementary.length ? `:${supplementary.join(',')}` : ''}`;
}
