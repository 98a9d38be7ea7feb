/** Result and info types returned by the SDK. */

/** The sandbox object as the server returns it (`GET /v1/sandboxes/{id}`), field names as on the wire. */
export interface SandboxInfo {
  id: string;
  status?: "creating" | "running" | "error" | "pausing" | "paused" | "resuming" | string;
  ip?: string;
  hostname?: string;
  vcpu?: number;
  mem_mib?: number;
  max_procs?: number;
  shape?: string;
  timeout_s?: number;
  on_timeout?: string;
  expires_at?: string | null;
  cwd?: string;
  metadata?: Record<string, string>;
  created_at?: string;
  family_id?: string;
  parent_id?: string | null;
  forked_from?: string | null;
  error?: string;
  pause?: Record<string, unknown>;
  /** Whether the sandbox's ports are reachable over HTTP, and where (`{port}` stands for the port). */
  ingress?: IngressInfo;
  [key: string]: unknown;
}

/** A sandbox's ingress: set up by `ingress_enabled` at create (or fork). */
export interface IngressInfo {
  enabled: boolean;
  /** The server's ingress listener URL, `http://{port}-<id without sbx_>.<domain>:<port>/` (no key needed); absent without `--ingress-listen`. */
  url_template?: string;
  /** The API's route, `/v1/sandboxes/<id>/ports/{port}/` (with the API key). */
  path_template?: string;
}

/** An exception raised by code run with `runCode`. */
export interface ExecutionError {
  name: string;
  value: string;
  traceback: string;
}

/** Result of `runCode`. */
export interface Execution {
  stdout: string;
  stderr: string;
  /** `repr()` of the cell's trailing expression, or null. */
  value: string | null;
  error: ExecutionError | null;
  executionCount: number | null;
  /** True when `interrupt()` stopped the cell (`error` is then a `KeyboardInterrupt`). */
  interrupted: boolean;
}

/** Result of `exec`. */
export interface CommandResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  timedOut: boolean;
  /** True when `interrupt()` stopped the command. */
  interrupted: boolean;
}

/** How many calls `interrupt()` stopped. */
export interface Interrupted {
  runCode: number;
  exec: number;
}

/** A file-system entry (from `files.list` / `files.stat` / `files.mkdir`). */
export interface Entry {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink" | "other" | string;
  size: number;
  mode: string;
  mtime: string;
  linkTarget: string;
}

/** Result of `diff`: files of the other sandbox relative to this one. */
export interface DiffResult {
  added: string[];
  removed: string[];
  modified: string[];
  [key: string]: unknown;
}

type Dict = Record<string, unknown>;

const str = (v: unknown): string => (v === undefined || v === null ? "" : String(v));

export function executionErrorFrom(d: unknown): ExecutionError | null {
  if (!d) return null;
  if (typeof d === "string") return { name: "Error", value: d, traceback: "" };
  const o = d as Dict;
  return { name: str(o.name) || "Error", value: str(o.value), traceback: str(o.traceback) };
}

export function executionFrom(d: Dict): Execution {
  const ec = d.execution_count;
  return {
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    value: d.value === undefined || d.value === null ? null : String(d.value),
    error: executionErrorFrom(d.error),
    executionCount: typeof ec === "number" ? ec : null,
    interrupted: Boolean(d.interrupted),
  };
}

export function commandResultFrom(d: Dict): CommandResult {
  const ec = d.exit_code;
  return {
    exitCode: typeof ec === "number" ? ec : ec === undefined || ec === null ? -1 : Number(ec),
    stdout: str(d.stdout),
    stderr: str(d.stderr),
    timedOut: Boolean(d.timed_out),
    interrupted: Boolean(d.interrupted),
  };
}

export function entryFrom(d: Dict | null): Entry {
  d = d ?? {};
  return {
    name: str(d.name),
    path: str(d.path),
    type: str(d.type) || "other",
    size: Number(d.size) || 0,
    mode: str(d.mode),
    mtime: str(d.mtime),
    linkTarget: str(d.link_target),
  };
}
