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

export function aborted(what: string): SnaplabError {
  return new SnaplabError('ABORTED', `${what} was aborted`);
}
