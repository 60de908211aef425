import { Command } from 'commander';
import { describe, expect, it } from 'vitest';
import { COMMANDS } from './commands.js';

describe('the CLI entry', () => {
  it('names every command each register function makes (only the invoked one is set up)', () => {
    for (const [names, register] of COMMANDS) {
      const p = new Command();
      register(p);
      expect(p.commands.map((c) => c.name())).toEqual(names);
    }
    expect(COMMANDS.flatMap(([n]) => n)).toEqual(expect.arrayContaining(['exec', 'ls', 'up', 'bench']));
  });
});
