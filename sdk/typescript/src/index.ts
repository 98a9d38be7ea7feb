/**
 * TypeScript SDK for ramify, a self-hosted sandbox server for AI agents.
 *
 * ```ts
 * import { Sandbox } from "ramify";
 * const sb = await Sandbox.create();
 * await sb.runCode("x = 42");
 * console.log((await sb.runCode("x + 1")).value); // '43'
 * await sb.close();
 * ```
 */
export { VERSION } from "./version.js";
export {
  Sandbox,
  DEFAULT_POLL_TIMEOUT_S,
  type CreateOptions,
  type BuildImageOptions,
  type ListOptions,
  type RunCodeOptions,
  type ExecOptions,
  type WaitOptions,
  type OutputCallback,
  type ResultCallback,
} from "./sandbox.js";
export { Files, type FileData, type WriteOptions } from "./files.js";
export { events, type LifecycleEvent, type EventsOptions } from "./events.js";
export { DEFAULT_API_URL, DEFAULT_REQUEST_TIMEOUT_S, retryPolicy, type ClientOptions } from "./http.js";
export type { SandboxInfo, IngressInfo, SSHInfo, TemplateInfo, ImageInfo, Execution, ExecutionError, CommandResult, Entry, DiffResult, Interrupted, SandboxPath } from "./models.js";
export { Result, diffPaths } from "./models.js";
export {
  RamifyError,
  AuthError,
  InvalidRequest,
  NotFound,
  SandboxNotFound,
  FileNotFound,
  Conflict,
  ServerError,
  TimeoutError,
  ServerUnreachable,
  SandboxDefunct,
  SandboxErrorState,
  PauseFailed,
  ResumeFailed,
} from "./errors.js";
