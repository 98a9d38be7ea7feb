/**
 * Errors raised by the ramify SDK.
 *
 * Every error the server returns is JSON `{"error": "<message>"}`; the SDK maps the HTTP status to
 * one of the classes below and keeps the message (`.message`), the status (`.status`) and the parsed
 * body (`.body`).
 */

/** Base class of every error raised by the SDK. */
export class RamifyError extends Error {
  /** HTTP status of the response, or undefined for client-side errors. */
  readonly status: number | undefined;
  /** The parsed response body (usually `{"error": "..."}`), when there was one. */
  readonly body: unknown;

  constructor(message: string, status?: number, body?: unknown, options?: { cause?: unknown }) {
    super(message, options);
    this.name = new.target.name;
    this.status = status;
    this.body = body;
  }

  override toString(): string {
    return this.status === undefined
      ? `${this.name}: ${this.message}`
      : `${this.name}: ${this.message} (HTTP ${this.status})`;
  }
}

/** 401: missing or wrong API key. */
export class AuthError extends RamifyError {}

/** 400 / 413: malformed request, bad value, or body too large. */
export class InvalidRequest extends RamifyError {}

/** 404: something does not exist (see `SandboxNotFound` and `FileNotFound`). */
export class NotFound extends RamifyError {}

/** 404: the sandbox does not exist (or was closed). */
export class SandboxNotFound extends NotFound {}

/** 404 from a file route: the path does not exist inside the sandbox. `code` is `"ENOENT"`. */
export class FileNotFound extends NotFound {
  readonly code = "ENOENT";
}

/** 409: the sandbox is not in a state that allows the call (e.g. `sandbox is not running`). */
export class Conflict extends RamifyError {}

/** 5xx, or an `{"type": "error"}` event ending a stream. */
export class ServerError extends RamifyError {}

/** A client-side timeout: a request took too long, or a wait (create/pause/resume) did. */
export class TimeoutError extends RamifyError {}

/** The server could not be reached (connection refused/reset before a response). */
export class ServerUnreachable extends RamifyError {}

/**
 * The sandbox was the winner of a `mergeInto` and its id is retired (the server answers 404 for it, saying which
 * sandbox holds its state now): a `SandboxNotFound`, so `instanceof SandboxNotFound` catches it.
 */
export class SandboxDefunct extends SandboxNotFound {}

/** The sandbox went to status `error` while waiting for it (`body` holds the sandbox info). */
export class SandboxErrorState extends RamifyError {}

/**
 * The pause waited for failed: the sandbox was not paused and keeps running (`body` holds the sandbox info, whose
 * `pause.error` says why).
 */
export class PauseFailed extends RamifyError {}

/**
 * The resume waited for failed for a reason retrying may cure: the sandbox is paused again with its snapshot
 * intact (`body` holds the sandbox info, whose `pause.error` says why). A broken snapshot puts the sandbox in
 * status `error` instead (`SandboxErrorState`).
 */
export class ResumeFailed extends RamifyError {}

/**
 * The server's 404 for a sandbox: "sandbox not found", or for an id it retired "sandbox sbx_... was merged into
 * sbx_... at ..." / "sandbox sbx_... was deleted at ...". A file route's 404 for a missing path says otherwise.
 */
const SANDBOX_GONE = /^sandbox (?:not found|sbx_[0-9a-f]{32} was (?:(merged into)|\w))/;

/** Map an HTTP error status (and message) to an error instance. */
export function errorForStatus(status: number, message: string, body?: unknown, fileRoute = false): RamifyError {
  if (status === 401 || status === 403) return new AuthError(message, status, body);
  if (status === 400 || status === 413 || status === 422) return new InvalidRequest(message, status, body);
  if (status === 404) {
    const gone = SANDBOX_GONE.exec(message);
    if (gone === null && fileRoute) return new FileNotFound(message, status, body);
    if (gone === null && (message.startsWith("template ") || message.startsWith("image ")))
      return new NotFound(message, status, body); // a template's or an image's 404
    if (gone !== null && gone[1]) return new SandboxDefunct(message, status, body);
    return new SandboxNotFound(message, status, body);
  }
  if (status === 409) return new Conflict(message, status, body);
  if (status >= 500 && status <= 599) return new ServerError(message, status, body);
  return new RamifyError(message, status, body);
}
