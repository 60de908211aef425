import { constants as osConstants } from 'node:os';
import { SnaplabError } from '../errors.js';
import { decodeError } from './protocol.js';

const errnoNames = new Map<number, string>(Object.entries(osConstants.errno).map(([k, v]) => [v, k]));

/** The error for an agent's ERROR frame. */
export function agentError(p: Buffer): SnaplabError {
  const { errno, message } = decodeError(p);
  return agentErrorOf(errno, message);
}

/** The error for an agent's ERROR reply (errno and its message), as every exec reports it. */
export function agentErrorOf(errno: number, message: string): SnaplabError {
  const name = errnoNames.get(errno);
  return new SnaplabError('AGENT_ERROR', `agent: ${message}${name ? ` (${name})` : ` (errno ${errno})`}`);
}

/** A VM relay's word for "the guest's agent started a new session" (native/relay.c); no agent sends it. */
const ECONNRESET = osConstants.errno.ECONNRESET;

/**
 * The error an exec ends with on an agent's ERROR (its errno and message), in the Node CLI, the
 * library and the C fast path's report alike. A VM relay's ECONNRESET: the guest's agent started a
 * new session, which killed its execs and let its kept ones go (they run on; a later ATTACH finds
 * them). The exec's tie to the machine is lost, as when a connection breaks (AGENT_UNREACHABLE,
 * which the daemon reads as a kept process lost, to be looked for again). A working directory the
 * command could not enter (the agent's "chdir CWD: …") is the caller's: BAD_INPUT. Anything else the
 * agent refused is AGENT_ERROR.
 */
export function execErrorOf(errno: number, message: string): SnaplabError {
  if (errno === ECONNRESET)
    return new SnaplabError('AGENT_UNREACHABLE', `the machine's agent started a new session: ${message}`);
  if (message.startsWith('chdir ')) {
    const name = errnoNames.get(errno);
    return new SnaplabError(
      'BAD_INPUT',
      `cwd ${message.slice('chdir '.length)}${name ? ` (${name})` : ''}`,
      'give a directory that exists in the machine (and that the user may enter)',
    );
  }
  return agentErrorOf(errno, message);
}

export function aborted(what: string): SnaplabError {
  return new SnaplabError('ABORTED', `${what} was aborted`);
}
