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

/** The sandbox object was the winner of a `mergeInto` and its id is retired. */
export class SandboxDefunct extends RamifyError {}

/** The sandbox went to status `error` while waiting for it (`body` holds the sandbox info). */
export class SandboxErrorState extends RamifyError {}

/** Map an HTTP error status (and message) to an error instance. */
export function errorForStatus(status: number, message: string, body?: unknown, fileRoute = false): RamifyError {
  if (status === 401 || status === 403) return new AuthError(message, status, body);
  if (status === 400 || status === 413 || status === 422) return new InvalidRequest(message, status, body);
  if (status === 404) {
    if (fileRoute && !message.toLowerCase().includes("sandbox not found")) {
      return new FileNotFound(message, status, body);
    }
    return new SandboxNotFound(message, status, body);
  }
  if (status === 409) return new Conflict(message, status, body);
  if (status >= 500 && status <= 599) return new ServerError(message, status, body);
  return new RamifyError(message, status, body);
}
