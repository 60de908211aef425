import { describe, expect, it } from 'vitest';
import { readUsernsPolicy, usernsPolicyVerdict } from './policy.js';

describe("the host's user namespace policy, as doctor reports it", () => {
  it("reads this host's settings: every machine's namespace is counted on its own base uid", () => {
    const p = readUsernsPolicy();
    expect(p.maxUserNamespaces).toBeGreaterThan(0); // this host makes them: the suite's sandboxes have one
    expect(usernsPolicyVerdict(p)).toMatchObject({
      ok: true,
      reason: expect.stringContaining(`user.max_user_namespaces=${p.maxUserNamespaces}`),
    });
  });

  it('restricted hosts (Debian, Ubuntu 24.04) still start machines, and say what nested namespaces lose', () => {
    const base = { maxUserNamespaces: 60000, inotifyInstances: 128 };
    const debian = usernsPolicyVerdict({ ...base, unprivilegedClone: 0 });
    expect(debian).toMatchObject({ ok: true, fix: expect.stringContaining('unprivileged_userns_clone=1') });
    expect(debian.reason).toMatch(
      /keeps CAP_SYS_ADMIN[\s\S]*nested user namespaces inside system machines are refused/,
    );
    const ubuntu = usernsPolicyVerdict({ ...base, apparmorRestrict: 1 });
    expect(ubuntu).toMatchObject({
      ok: true,
      reason: expect.stringMatching(/apparmor_restrict_unprivileged_userns=1/),
    });
    expect(ubuntu.fix).toBeUndefined();
    expect(usernsPolicyVerdict({ ...base, maxUserNamespaces: 0 })).toMatchObject({
      ok: false,
      fix: expect.any(String),
    });
  });
});
