/**
 * Every failure a user can cause or meet carries a stable code and a hint that says what to do.
 * The CLI prints `error[CODE]: message` and `hint: ...`, never a stack trace, for these.
 */
export type ErrorCode =
  | 'NOT_ROOT'
  | 'BAD_INPUT'
  | 'BAD_SIZE'
  | 'BAD_NAME'
  | 'SCENARIO_INVALID'
  | 'IMAGE_NOT_FOUND'
  | 'IMAGE_EXISTS'
  | 'IMAGE_IN_USE'
  | 'BAD_IMAGE'
  | 'IMAGE_UNSAFE'
  | 'IMAGE_TOO_LARGE'
  | 'IMAGE_DIGEST_MISMATCH'
  | 'IMAGE_IO'
  | 'IMAGE_BUILD_FAILED'
  | 'MISSING_TOOL'
  | 'SANDBOX_NOT_FOUND'
  | 'SANDBOX_EXISTS'
  | 'NO_USERNS_SLOT'
  | 'SANDBOX_DEAD'
  | 'SANDBOX_PAUSED'
  | 'SANDBOX_RUNNING'
  | 'SANDBOX_STOPPED'
  | 'SANDBOX_BUSY'
  | 'EGRESS_OFF'
  | 'SNAPSHOT_NOT_FOUND'
  | 'SNAPSHOT_EXISTS'
  | 'OPERATION_NOT_FOUND'
  | 'POOL_NOT_FOUND'
  | 'SCENARIO_NOT_FOUND'
  | 'SCENARIO_EXISTS'
  | 'SCENARIO_FAILED'
  | 'POOL_EXISTS'
  | 'STORAGE_UNAVAILABLE'
  | 'STORAGE_FAILED'
  | 'DRIVER_UNAVAILABLE'
  | 'LAUNCH_FAILED'
  | 'VM_ERROR'
  | 'AGENT_UNREACHABLE'
  | 'AGENT_PROTOCOL'
  | 'AGENT_ERROR'
  | 'NO_SHELL'
  | 'COPY_FAILED'
  | 'PORT_IN_USE'
  | 'UNAUTHORIZED'
  | 'USER_NOT_FOUND'
  | 'FORBIDDEN'
  | 'QUOTA_EXCEEDED'
  | 'ABOVE_CEILING'
  | 'KEY_NOT_FOUND'
  | 'KEY_EXISTS'
  | 'PROCESS_NOT_FOUND'
  | 'PROCESS_BUSY'
  | 'FILE_NOT_FOUND'
  | 'FILE_ERROR'
  | 'DISK_FULL'
  | 'RESULTS_NOT_FOUND'
  | 'BAD_RESULTS'
  | 'UI_NOT_BUILT'
  | 'DAEMON_UNREACHABLE'
  | 'DAEMON_ERROR'
  | 'CLUSTER_UNAVAILABLE'
  | 'NODE_UNAVAILABLE'
  | 'NODE_EXISTS'
  | 'SANDBOX_LOST'
  | 'PAYLOAD_TOO_LARGE'
  | 'UNSUPPORTED_MEDIA'
  | 'CGROUP_FAILED'
  | 'HOST_COMMAND_FAILED'
  | 'STATE_TOO_NEW'
  | 'HOST_UNREADABLE'
  | 'HOST_SHORT_OF_MEMORY'
  | 'TIMEOUT'
  | 'ABORTED'
  | 'INTERNAL';

/** What `toJSON` says of a cause: a SnaplabError's code and message, any other error's message. */
export interface CauseJSON {
  code?: ErrorCode;
  message: string;
}

export class SnaplabError extends Error {
  readonly code: ErrorCode;
  readonly hint: string | undefined;

  /** `options.cause`: the error this one was made from (ES2022 `Error`'s own option), kept for `toJSON`. */
  constructor(code: ErrorCode, message: string, hint?: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'SnaplabError';
    this.code = code;
    this.hint = hint;
  }

  toJSON(): { code: ErrorCode; message: string; hint?: string; cause?: CauseJSON } {
    const cause = causeJSON(this.cause);
    return {
      code: this.code,
      message: this.message,
      ...(this.hint === undefined ? {} : { hint: this.hint }),
      ...(cause === undefined ? {} : { cause }),
    };
  }
}

/**
 * A refusal for a limit: over a quota (QUOTA_EXCEEDED, 429, with Retry-After when waiting helps),
 * a request above a key's ceiling (ABOVE_CEILING, 403), or for what a key may not have at all
 * (FORBIDDEN, 403: egress). `limit` names which, in the answer.
 */
export class LimitError extends SnaplabError {
  constructor(
    code: 'QUOTA_EXCEEDED' | 'ABOVE_CEILING' | 'FORBIDDEN',
    readonly limit: string,
    message: string,
    hint: string,
    readonly retryAfterS?: number,
  ) {
    super(code, message, hint);
  }
}

function causeJSON(cause: unknown): CauseJSON | undefined {
  if (cause === undefined) return undefined;
  if (cause instanceof SnaplabError) return { code: cause.code, message: cause.message };
  return { message: cause instanceof Error ? cause.message : String(cause) };
}

export function isSnaplabError(e: unknown, code?: ErrorCode): e is SnaplabError {
  return e instanceof SnaplabError && (code === undefined || e.code === code);
}
