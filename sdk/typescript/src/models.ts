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
  /**
   * What the last pause and resume reported; `error` when the last pause failed (the sandbox keeps running) or the
   * last resume failed (it is paused again); `warning` when the resumed sandbox's files take more than its
   * `disk_mib` (its writes fail until it frees space).
   */
  pause?: { error?: string; warning?: string; [key: string]: unknown };
  /**
   * While pausing or resuming: the part being moved (`session`, `files`, `commit`), the bytes moved so far and,
   * for a resume, the snapshot's size.
   */
  progress?: { phase: string; bytes: number; total_bytes?: number; elapsed_ms: number };
  /** Whether the sandbox's ports are reachable over HTTP, and where (`{port}` stands for the port). */
  ingress?: IngressInfo;
  /** The template the sandbox was created from, if any. */
  template?: string;
  /** The image the sandbox runs on (`"default"` for the default image). */
  image?: string;
  /** Its SSH access: the authorized keys and, with a server running `--ssh-listen`, how to connect. */
  ssh?: SSHInfo;
  [key: string]: unknown;
}

/** A sandbox's SSH access (see docs/ssh.md). */
export interface SSHInfo {
  keys: Array<{ type: string; fingerprint: string; comment?: string }>;
  /** `ssh -p PORT <id>@HOST`; absent when the server runs no SSH server. */
  command?: string;
  /** The SSH server's host key, and its line for a known_hosts file. */
  host_key?: string;
  known_hosts?: string;
}

/** A sandbox's ingress: set up by `ingress_enabled` at create (or fork). */
export interface IngressInfo {
  enabled: boolean;
  /** The server's ingress listener URL, `http://{port}-<id without sbx_>.<domain>:<port>/` (no key needed); absent without `--ingress-listen`. */
  url_template?: string;
  /** The API's route, `/v1/sandboxes/<id>/ports/{port}/` (with the API key). */
  path_template?: string;
}

/** A template (`POST /v1/templates`): a captured sandbox's files and interpreter session (wire field names). */
export interface TemplateInfo {
  name: string;
  /** The sandbox it was captured from. */
  from: string;
  created_at: string;
  /** Bytes of its snapshot. */
  size: number;
  /** Variables the capture could not save. */
  not_saved: Array<{ name: string; type?: string; reason: string }>;
  capture_ms: number;
  /** What sandboxes created from it get unless their create options say otherwise. */
  spec: Record<string, unknown>;
}

/** An image (`POST /v1/images`): the default one, or a named one built on top of it (wire field names). */
export interface ImageInfo {
  name: string;
  id: string;
  default: boolean;
  /** A named image: the default image it was built on. */
  base_id?: string;
  apt: string[];
  pip: string[];
  pip_index?: string;
  built_at: string;
  /** Bytes of the image (a named image: its own layer). */
  size_bytes: number;
  /** Sandboxes (any status) and templates on the image. */
  sandboxes: number;
  templates: number;
  /** Why sandboxes cannot start on it now, if they cannot. */
  error?: string;
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
  /**
   * The cell's rich results in order, as a Jupyter kernel gives them: an `execute_result` for the trailing
   * expression, a `display_data` for each `display()`, `plt.show()` or figure left open.
   */
  results: Result[];
}

const EXT: Record<string, string> = {
  "image/png": ".png", "image/jpeg": ".jpg", "image/svg+xml": ".svg", "text/html": ".html",
  "application/json": ".json", "text/markdown": ".md", "text/latex": ".tex", "text/plain": ".txt",
};

/**
 * A rich result of `runCode`: `type` is `"execute_result"` or `"display_data"`; `data` maps mime types to values
 * (`image/png` base64, `text/plain` always). The getters give the common formats, `undefined` when absent:
 * `(await sb.runCode("...plt.show()")).results[0].save("chart.png")`.
 */
export class Result {
  constructor(readonly type: string, readonly data: Record<string, unknown>) {}

  /** The mime types this result has. */
  formats(): string[] {
    return Object.keys(this.data);
  }
  private bytes(mime: string): Uint8Array | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? fromBase64(v) : undefined;
  }
  private string(mime: string): string | undefined {
    const v = this.data[mime];
    return typeof v === "string" ? v : undefined;
  }
  /** The PNG image, decoded. */
  get png(): Uint8Array | undefined { return this.bytes("image/png"); }
  get jpeg(): Uint8Array | undefined { return this.bytes("image/jpeg"); }
  /** `text/plain`: the object's repr. */
  get text(): string | undefined { return this.string("text/plain"); }
  get html(): string | undefined { return this.string("text/html"); }
  get svg(): string | undefined { return this.string("image/svg+xml"); }
  get markdown(): string | undefined { return this.string("text/markdown"); }
  get latex(): string | undefined { return this.string("text/latex"); }
  /** `application/json`, as a value. */
  get json(): unknown { return this.data["application/json"]; }

  /**
   * Write the result to a local file (node:fs): the format named (a mime type), else the one the path's extension
   * names, else the richest it has. Returns the path.
   */
  async save(path: string, format?: string): Promise<string> {
    const dot = path.lastIndexOf(".");
    const ext = dot > path.lastIndexOf("/") ? path.slice(dot).toLowerCase() : "";
    const mime = format ?? Object.keys(EXT).find((m) => EXT[m] === ext && m in this.data) ??
      Object.keys(EXT).find((m) => m in this.data);
    if (mime === undefined || !(mime in this.data)) {
      throw new Error(`result has no ${mime ?? "known"} format; it has ${this.formats().join(", ")}`);
    }
    const v = this.data[mime];
    const content = mime === "image/png" || mime === "image/jpeg" ? fromBase64(String(v))
      : typeof v === "string" ? v : JSON.stringify(v);
    const { writeFile } = await import("node:fs/promises");
    await writeFile(path, content);
    return path;
  }
}

export function resultFrom(d: unknown): Result {
  const o = (d ?? {}) as Record<string, unknown>;
  return new Result(String(o.type ?? "display_data"), (o.data ?? {}) as Record<string, unknown>);
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

/**
 * A path of a sandbox file: a string, or its raw bytes (any name Linux allows, also one that is not UTF-8, which
 * is sent as `path_b64`).
 */
export type SandboxPath = string | Uint8Array;

/**
 * A file-system entry (from `files.list` / `files.stat` / `files.mkdir`). When a name is not UTF-8, `name`,
 * `path` and `linkTarget` are display forms (U+FFFD for each byte that is not UTF-8) and `nameBytes`,
 * `pathBytes` and `linkTargetBytes` hold the raw bytes: address such a file with `entry.pathBytes ?? entry.path`.
 */
export interface Entry {
  name: string;
  path: string;
  type: "file" | "dir" | "symlink" | "other" | string;
  size: number;
  mode: string;
  mtime: string;
  linkTarget: string;
  nameBytes?: Uint8Array;
  pathBytes?: Uint8Array;
  linkTargetBytes?: Uint8Array;
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
    results: Array.isArray(d.results) ? d.results.map(resultFrom) : [],
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
  const e: Entry = {
    name: str(d.name),
    path: str(d.path),
    type: str(d.type) || "other",
    size: Number(d.size) || 0,
    mode: str(d.mode),
    mtime: str(d.mtime),
    linkTarget: str(d.link_target),
  };
  if (d.name_b64) e.nameBytes = fromBase64(str(d.name_b64));
  if (d.path_b64) e.pathBytes = fromBase64(str(d.path_b64));
  if (d.link_target_b64) e.linkTargetBytes = fromBase64(str(d.link_target_b64));
  return e;
}

export function toBase64(b: Uint8Array): string {
  let s = "";
  for (let i = 0; i < b.length; i += 0x8000) s += String.fromCharCode(...b.subarray(i, i + 0x8000));
  return btoa(s);
}

export function fromBase64(s: string): Uint8Array {
  const bin = atob(s);
  const out = new Uint8Array(bin.length);
  for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
  return out;
}

/**
 * The request field naming `p` under `key`: `{[key]: string}` for a string or for bytes that are UTF-8, else
 * `{[key + "_b64"]: base64}` (the server takes it in place of the plain field).
 */
export function pathField(p: SandboxPath, key = "path"): Record<string, string> {
  if (typeof p === "string") return { [key]: p };
  try {
    return { [key]: new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(p) };
  } catch {
    return { [key + "_b64"]: toBase64(p) };
  }
}

/**
 * The paths of a diff list (`"added"`, `"removed"` or `"modified"`) as the files they name: a string, or the
 * raw bytes where the server gave the path in base64 (`added_b64`, ...: the path is not UTF-8).
 */
export function diffPaths(d: DiffResult, kind: "added" | "removed" | "modified"): SandboxPath[] {
  const b64 = d[`${kind}_b64`];
  return d[kind].map((p, i) => (Array.isArray(b64) && typeof b64[i] === "string" ? fromBase64(b64[i] as string) : p));
}
