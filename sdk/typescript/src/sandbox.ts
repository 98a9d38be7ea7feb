/** The `Sandbox` client. */
import {
  RamifyError,
  SandboxDefunct,
  SandboxErrorState,
  PauseFailed,
  ResumeFailed,
  SandboxNotFound,
  ServerError,
  TimeoutError,
} from "./errors.js";
import { Files } from "./files.js";
import { HttpClient, iterNdjson, readJson, type ClientOptions } from "./http.js";
import {
  commandResultFrom,
  resultFrom,
  type Result,
  executionFrom,
  type CommandResult,
  type DiffResult,
  type Execution,
  type IngressInfo,
  type Interrupted,
  type SandboxInfo,
  type TemplateInfo,
  type ImageInfo,
  type SandboxPath,
  pathField,
  toBase64,
} from "./models.js";

/** Called with each chunk of output as it arrives. */
export type OutputCallback = (data: string) => unknown;
/** Called with each `display_data` result of `runCode` as it is displayed. */
export type ResultCallback = (result: Result) => unknown;

/** Options of `Sandbox.create` (all optional; server defaults apply). */
export interface CreateOptions extends ClientOptions {
  /** CPU quota in cores (0.1 .. 64). */
  vcpu?: number;
  /** Memory limit in MiB. */
  memMib?: number;
  /** Max processes and threads. */
  maxProcs?: number;
  /** Destroy (or pause) the sandbox this many seconds after creation; 0 = never. */
  timeoutS?: number;
  /** What happens when `timeoutS` fires. */
  onTimeout?: "destroy" | "pause";
  env?: Record<string, string>;
  cwd?: string;
  metadata?: Record<string, string>;
  /** Disk quota of the sandbox's writable layer in MiB (server default: its --disk-mib). */
  diskMib?: number;
  /** Outbound allowlist: CIDRs, IPs or hostnames, optionally with `:port`; `[]` = no outbound traffic. */
  egress?: string[];
  /** Make the sandbox's ports reachable over HTTP (`url(port)`, `apiUrl(port)`); fork children inherit it. */
  ingressEnabled?: boolean;
  /** Start from this template (`saveTemplate`): its files and variables, and its settings for options not given. */
  template?: string;
  /** Run on this image (`Sandbox.buildImage`); absent or `"default"` is the default image. */
  image?: string;
  /** SSH public keys (authorized_keys lines) that may `ssh -p PORT <id>@HOST` into the sandbox; fork children inherit them. */
  sshPubkeys?: string[];
}

/** What `Sandbox.buildImage` puts on top of the default image. */
export interface BuildImageOptions extends ClientOptions {
  /** Debian packages (Debian's `python3-*` packages need no pip index). */
  apt?: string[];
  /** pip requirements (`"name"`, `"name==1.2"`), installed from `pipIndex`. */
  pip?: string[];
  /** A PEP 503 simple index the server reaches. */
  pipIndex?: string;
  /** Called with each progress line. */
  onProgress?: (line: string) => unknown;
  /** How long the build may take, in seconds (default 1800; `null`: no limit). */
  timeoutS?: number | null;
}

export interface ListOptions extends ClientOptions {
  /** Only sandboxes whose metadata has all these labels. */
  metadata?: Record<string, string>;
  status?: string;
}

export interface RunCodeOptions {
  /** Server-side timeout in seconds (server default 300; 0 = none). */
  timeoutS?: number;
  /**
   * runCode: set in the interpreter's `os.environ` for this call only (restored after it).
   * exec: added to the sandbox's environment for the command.
   */
  env?: Record<string, string>;
  /** With a callback, the output is streamed and the callback called before the result. */
  onStdout?: OutputCallback;
  onStderr?: OutputCallback;
  /** runCode: called with each `display_data` result (figure, `display()`) as it is displayed (streamed). */
  onResult?: ResultCallback;
}

export interface ExecOptions extends RunCodeOptions {
  /** Absolute working directory (default the sandbox's cwd). */
  cwd?: string;
  stdin?: string | Uint8Array;
}

export interface WaitOptions {
  /** Poll until the target status is reached (default true). */
  wait?: boolean;
  /** Give up waiting after this many seconds (default 300): throws `TimeoutError`. */
  pollTimeoutS?: number;
  /**
   * Called about twice a second while it waits, with how far the pause or resume has got (the server's
   * `progress`: `phase`, `bytes`, `total_bytes` for a resume, `elapsed_ms`).
   */
  onProgress?: (p: NonNullable<SandboxInfo["progress"]>) => void;
}

const SERVER_DEFAULT_RUN_TIMEOUT_S = 300;
const RUN_TIMEOUT_MARGIN_S = 30;
export const DEFAULT_POLL_TIMEOUT_S = 300;
/** Seconds one wait request may take (the server allows 60). */
const WAIT_CHUNK_S = 20;


function sandboxId(x: Sandbox | string): string {
  if (typeof x === "string") return x;
  if (x instanceof Sandbox) return x.id;
  throw new TypeError("expected a Sandbox or a sandbox id");
}

function isNdjson(res: Response): boolean {
  // Anything but plain JSON is read as NDJSON (one event per line).
  const ct = (res.headers.get("content-type") ?? "").split(";")[0]!.trim().toLowerCase();
  return ct !== "application/json";
}

function enc(s: string): string {
  return encodeURIComponent(s);
}

/**
 * A ramify sandbox. Create one with `await Sandbox.create()`, attach to an existing one with
 * `await Sandbox.connect(id)`, enumerate them with `await Sandbox.list()`.
 */
export class Sandbox {
  /** The sandbox id (`sbx_...`). */
  readonly id: string;
  /** The last sandbox object read from the server (wire field names). */
  info: SandboxInfo;
  /** File operations. */
  readonly files: Files;
  /** @internal */
  readonly _client: HttpClient;
  private _closed = false;
  private _mergedInto: string | null = null;

  /** Use `Sandbox.create`, `Sandbox.connect` or `Sandbox.list`. */
  private constructor(client: HttpClient, info: SandboxInfo) {
    if (!info || typeof info.id !== "string") throw new RamifyError(`unexpected sandbox object: ${JSON.stringify(info)}`);
    this._client = client;
    this.info = { ...info };
    this.id = info.id;
    this.files = new Files(this);
  }

  /** Create a sandbox (`POST /v1/sandboxes`); resolves once it is running. */
  static async create(opts: CreateOptions = {}): Promise<Sandbox> {
    const client = new HttpClient(opts);
    const body: Record<string, unknown> = {};
    const fields: Array<[string, unknown]> = [
      ["vcpu", opts.vcpu],
      ["mem_mib", opts.memMib],
      ["max_procs", opts.maxProcs],
      ["timeout_s", opts.timeoutS],
      ["on_timeout", opts.onTimeout],
      ["cwd", opts.cwd],
      ["env", opts.env],
      ["metadata", opts.metadata],
      ["disk_mib", opts.diskMib],
      ["egress", opts.egress],
      ["ingress_enabled", opts.ingressEnabled || undefined],
      ["template", opts.template],
      ["image", opts.image],
      ["ssh_pubkeys", opts.sshPubkeys],
    ];
    for (const [k, v] of fields) if (v !== undefined && v !== null) body[k] = v;
    const res = await client.request("POST", "/v1/sandboxes", { json: body, timeoutS: client.longer(120) });
    const info = (await readJson(res, "POST", "/v1/sandboxes")) as SandboxInfo | null;
    if (!info || typeof info !== "object" || typeof info.id !== "string") {
      throw new RamifyError(`unexpected create response: ${JSON.stringify(info)}`, res.status, info);
    }
    const sb = new Sandbox(client, info);
    if (info.status === "creating" || info.status === "resuming") {
      try {
        await sb._waitFor("running", DEFAULT_POLL_TIMEOUT_S);
      } catch (e) {
        await sb.close().catch(() => {});
        throw e;
      }
    }
    return sb;
  }

  /** Attach to an existing sandbox (`GET /v1/sandboxes/{id}`); throws `SandboxNotFound`. */
  static async connect(id: string, opts: ClientOptions = {}): Promise<Sandbox> {
    const client = new HttpClient(opts);
    const info = await client.json<SandboxInfo>("GET", `/v1/sandboxes/${enc(id)}`);
    return new Sandbox(client, info);
  }

  /** List sandboxes (oldest first), optionally filtered by metadata labels and status. */
  static async list(opts: ListOptions = {}): Promise<Sandbox[]> {
    const client = new HttpClient(opts);
    const query: Array<[string, string]> = Object.entries(opts.metadata ?? {}).map(([k, v]) => [`metadata.${k}`, String(v)]);
    if (opts.status !== undefined) query.push(["status", opts.status]);
    const data = await client.json<{ sandboxes?: SandboxInfo[] } | null>("GET", "/v1/sandboxes", { query });
    return (data?.sandboxes ?? []).map((info) => new Sandbox(client, info));
  }

  // -- state --------------------------------------------------------------------------------------
  /** @internal */
  _path(suffix = ""): string {
    return `/v1/sandboxes/${enc(this.id)}${suffix}`;
  }

  /** @internal */
  _check(): void {
    if (this._mergedInto !== null) {
      throw new SandboxDefunct(
        `sandbox ${this.id} was merged into ${this._mergedInto} and is defunct; use the parent sandbox (${this._mergedInto}) instead`,
      );
    }
    if (this._closed) throw new SandboxNotFound(`sandbox ${this.id} is closed`);
  }

  /** True once this sandbox was the winner of a `mergeInto` (its id is retired). */
  get defunct(): boolean {
    return this._mergedInto !== null;
  }

  get closed(): boolean {
    return this._closed;
  }

  /** Re-read the sandbox (`GET`), update `info` and return it. */
  async refresh(): Promise<SandboxInfo> {
    this._check();
    const info = await this._client.json<SandboxInfo | null>("GET", this._path());
    if (info && typeof info === "object") this.info = info;
    return this.info;
  }

  /** Current status, fetched from the server (`running`, `paused`, ...). */
  async status(): Promise<string> {
    return String((await this.refresh()).status ?? "");
  }

  /**
   * Keep the sandbox alive: it now times out `timeoutS` seconds from now (0: never), with its
   * `on_timeout` action (`POST /v1/sandboxes/{id}/timeout`). Running or paused sandboxes only.
   * Updates `info` (`expires_at` is the new deadline) and returns it.
   */
  async setTimeout(timeoutS: number): Promise<SandboxInfo> {
    this._check();
    if (!Number.isInteger(timeoutS)) throw new TypeError("timeoutS must be an integer number of seconds");
    const info = await this._client.json<SandboxInfo | null>("POST", this._path("/timeout"), { json: { timeout_s: timeoutS } });
    if (info && typeof info === "object") this.info = info;
    return this.info;
  }

  /**
   * Authorize more SSH keys (authorized_keys lines) on this running or paused sandbox
   * (`POST /v1/sandboxes/{id}/ssh_keys`); keys it already has are skipped. Updates `info`, whose `ssh` lists
   * the keys and, with a server running `--ssh-listen`, the `command` that connects, and returns it.
   */
  async addSshKeys(keys: string[] | string): Promise<SandboxInfo> {
    this._check();
    const list = (typeof keys === "string" ? [keys] : keys).map((k) => String(k).trim());
    const info = await this._client.json<SandboxInfo | null>("POST", this._path("/ssh_keys"), { json: { keys: list } });
    if (info && typeof info === "object") this.info = info;
    return this.info;
  }

  /**
   * Stop the `runCode` and `exec` calls in flight in this sandbox (`POST .../interrupt`), from anywhere: a
   * running cell gets a `KeyboardInterrupt` (its variables survive), cells queued behind it end without running,
   * and every `exec`'s command is killed with what it started. Each stopped call resolves with `interrupted`
   * set. `what` limits it to `"run_code"` or `"exec"` calls. Resolves to how many calls were stopped.
   */
  async interrupt(what?: "run_code" | "exec"): Promise<Interrupted> {
    this._check();
    if (what !== undefined && what !== "run_code" && what !== "exec") {
      throw new TypeError('what must be "run_code", "exec" or undefined');
    }
    const out = await this._client.json<{ interrupted?: { run_code?: number; exec?: number } } | null>(
      "POST", this._path("/interrupt"), { json: what === undefined ? {} : { what } });
    const n = out?.interrupted ?? {};
    return { runCode: Number(n.run_code ?? 0), exec: Number(n.exec ?? 0) };
  }

  private runTimeout(timeoutS: number | undefined): number | null {
    const rt = this._client.requestTimeoutS;
    if (timeoutS === 0 || rt === null) return null;
    const server = timeoutS === undefined ? SERVER_DEFAULT_RUN_TIMEOUT_S : timeoutS;
    return Math.max(rt, server + RUN_TIMEOUT_MARGIN_S);
  }

  // -- code ---------------------------------------------------------------------------------------
  /**
   * Run Python code in the sandbox's persistent interpreter. With `onStdout` / `onStderr` the
   * output is streamed (NDJSON) and the callbacks are called with each chunk as it arrives, before
   * the promise resolves.
   */
  async runCode(code: string, opts: RunCodeOptions = {}): Promise<Execution> {
    this._check();
    const body: Record<string, unknown> = { code };
    if (opts.timeoutS !== undefined) body.timeout_s = opts.timeoutS;
    if (opts.env !== undefined) body.env = opts.env;
    const d = await this.call("/run_code", body, opts, ["result"], "run_code stream ended without a result event");
    return executionFrom(d);
  }

  /** Run a command: a string goes through `/bin/sh -c`, an array is an argv (no shell). */
  async exec(cmd: string | string[], opts: ExecOptions = {}): Promise<CommandResult> {
    this._check();
    const body: Record<string, unknown> = {};
    if (typeof cmd === "string") body.cmd = cmd;
    else if (Array.isArray(cmd)) {
      if (cmd.length === 0) throw new TypeError("argv must not be empty");
      body.argv = cmd.map(String);
    } else throw new TypeError("cmd must be a string or an array of strings");
    if (opts.env !== undefined) body.env = opts.env;
    if (opts.cwd !== undefined) body.cwd = opts.cwd;
    if (opts.timeoutS !== undefined) body.timeout_s = opts.timeoutS;
    if (opts.stdin !== undefined) body.stdin = typeof opts.stdin === "string" ? opts.stdin : new TextDecoder().decode(opts.stdin);
    const d = await this.call("/exec", body, opts, ["exit", "result"], "exec stream ended without an exit event");
    return commandResultFrom(d);
  }

  private async call(
    suffix: string,
    body: Record<string, unknown>,
    opts: RunCodeOptions,
    finalTypes: string[],
    noFinal: string,
  ): Promise<Record<string, unknown>> {
    const path = this._path(suffix);
    const timeoutS = this.runTimeout(opts.timeoutS);
    const { onStdout, onStderr, onResult } = opts;
    if (!onStdout && !onStderr && !onResult) {
      return ((await this._client.json("POST", path, { json: body, timeoutS })) ?? {}) as Record<string, unknown>;
    }
    body.stream = true;
    const res = await this._client.request("POST", path, {
      json: body,
      timeoutS,
      headers: { Accept: "application/x-ndjson" },
    });
    if (!isNdjson(res)) {
      // The server ignored "stream": deliver the output in one go.
      const d = ((await readJson(res, "POST", path)) ?? {}) as Record<string, unknown>;
      if (d.stdout && onStdout) await onStdout(String(d.stdout));
      if (d.stderr && onStderr) await onStderr(String(d.stderr));
      for (const r of Array.isArray(d.results) ? d.results.map(resultFrom) : []) {
        if (onResult && r.type === "display_data") await onResult(r);
      }
      return d;
    }
    const out: string[] = [];
    const err: string[] = [];
    for await (const ev of iterNdjson(res, `POST ${path}`)) {
      const type = ev.type;
      if (type === "stdout" || type === "stderr") {
        const data = ev.data === undefined || ev.data === null ? "" : String(ev.data);
        (type === "stdout" ? out : err).push(data);
        const cb = type === "stdout" ? onStdout : onStderr;
        if (cb) await cb(data);
      } else if (type === "display_data") {
        if (onResult) await onResult(resultFrom(ev));
      } else if (typeof type === "string" && finalTypes.includes(type)) {
        return { stdout: out.join(""), stderr: err.join(""), ...ev };
      } else if (type === "error") {
        throw new ServerError(String(ev.error ?? ev.data ?? "stream error"), res.status, ev);
      }
    }
    throw new RamifyError(noFinal, res.status);
  }

  // -- ingress ------------------------------------------------------------------------------------
  async _ingress(): Promise<IngressInfo> {
    let ing = this.info.ingress;
    if (!ing) ing = (await this.refresh()).ingress;
    if (!ing?.enabled) {
      throw new RamifyError(`sandbox ${this.id} was created without ingressEnabled: its ports are not reachable`, undefined, ing);
    }
    return ing;
  }

  /**
   * The URL of `port` inside the sandbox through the server's ingress listener (no API key needed), e.g.
   * `http://8000-<id without sbx_>.localhost:7080/`. Needs `ingressEnabled` and a server started with
   * `--ingress-listen` (else see `apiUrl`).
   */
  async url(port: number): Promise<string> {
    const t = (await this._ingress()).url_template;
    if (!t) throw new RamifyError("the server has no ingress listener (ramify serve --ingress-listen): use apiUrl(port) with the API key");
    return t.replace("{port}", String(Math.trunc(port)));
  }

  /** The API's URL of `port` inside the sandbox; requests need the API key (`Authorization: Bearer`), which is not forwarded. */
  async apiUrl(port: number): Promise<string> {
    const t = (await this._ingress()).path_template ?? this._path("/ports/{port}/");
    return this._client.apiUrl + t.replace("{port}", String(Math.trunc(port)));
  }

  // -- fork / merge / diff --------------------------------------------------------------------------
  /**
   * Fork this sandbox into `n` children (1..32, default 1) that inherit its memory and files (and its SSH keys,
   * plus `sshPubkeys` if given).
   */
  async fork(opts: { n?: number; ingressEnabled?: boolean; sshPubkeys?: string[] } = {}): Promise<Sandbox[]> {
    this._check();
    const n = opts.n ?? 1;
    if (!Number.isInteger(n)) throw new TypeError("n must be an integer");
    const body: Record<string, unknown> = { n };
    if (opts.ingressEnabled !== undefined) body.ingress_enabled = opts.ingressEnabled;
    if (opts.sshPubkeys !== undefined) body.ssh_pubkeys = opts.sshPubkeys;
    const data = await this._client.json<{ children?: unknown } | null>("POST", this._path("/fork"), {
      json: body,
      timeoutS: this._client.longer(300),
    });
    const children = data?.children;
    if (!Array.isArray(children)) throw new RamifyError(`unexpected fork response: ${JSON.stringify(data)}`, undefined, data);
    return children.map((c) => new Sandbox(this._client, typeof c === "string" ? { id: c } : (c as SandboxInfo)));
  }

  /**
   * Replace this sandbox's state with `winner`'s (typically a fork child). This sandbox keeps its
   * id; the winner's id is retired and the winner object becomes defunct (`close()` is a no-op,
   * other calls throw `SandboxDefunct`). Siblings are untouched: close them yourself.
   */
  async mergeInto(winner: Sandbox | string): Promise<void> {
    this._check();
    const wid = sandboxId(winner);
    if (winner instanceof Sandbox) winner._check();
    const res = await this._client.request("POST", this._path(`/merge_into/${enc(wid)}`), {
      timeoutS: this._client.longer(300),
    });
    await res.body?.cancel().catch(() => {});
    if (winner instanceof Sandbox) winner._mergedInto = this.id;
    try {
      await this.refresh();
    } catch (e) {
      if (!(e instanceof RamifyError)) throw e;
    }
  }

  /**
   * Compare file-system state with another sandbox: `added` = only in `other`, `removed` = only in
   * this one, `modified` = different content. `paths` default to the server's (`/root`, `/tmp`). A path
   * that is not UTF-8 is listed in a display form with its base64 at the same index of `added_b64` (...):
   * `diffPaths(d, "added")` gives each as the string or the raw bytes to pass to `files`.
   */
  async diff(other: Sandbox | string, opts: { paths?: SandboxPath[] | SandboxPath } = {}): Promise<DiffResult> {
    this._check();
    const paths = typeof opts.paths === "string" || opts.paths instanceof Uint8Array ? [opts.paths] : (opts.paths ?? []);
    let fields = paths.map((p) => pathField(p, "paths"));
    if (fields.some((f) => "paths_b64" in f)) {
      // One form for all: the server takes paths or paths_b64, not both.
      fields = fields.map((f) => ("paths_b64" in f ? f : { paths_b64: toBase64(new TextEncoder().encode(f.paths)) }));
    }
    const d = await this._client.json<Partial<DiffResult> | null>("GET", this._path(`/diff/${enc(sandboxId(other))}`), {
      query: fields.flatMap((f) => Object.entries(f) as [string, string][]),
      timeoutS: this._client.longer(300),
    });
    return { ...(d ?? {}), added: d?.added ?? [], removed: d?.removed ?? [], modified: d?.modified ?? [] };
  }

  // -- images ---------------------------------------------------------------------------------------
  /**
   * Build (or rebuild) the named image `name` on the server, on top of the default image (`POST /v1/images`),
   * streaming its progress to `opts.onProgress`. Resolves to the image; throws `InvalidRequest` for bad input,
   * `Conflict` while sandboxes use the name, `ServerError` when the build fails. `Sandbox.create({ image: name })`
   * runs on it.
   */
  static async buildImage(name: string, opts: BuildImageOptions = {}): Promise<ImageInfo> {
    const client = new HttpClient(opts);
    const body: Record<string, unknown> = { name };
    if (opts.apt?.length) body.apt = opts.apt;
    if (opts.pip?.length) body.pip = opts.pip;
    if (opts.pipIndex) body.pip_index = opts.pipIndex;
    const res = await client.request("POST", "/v1/images", {
      json: body,
      timeoutS: opts.timeoutS === undefined ? 1800 : opts.timeoutS,
      headers: { Accept: "application/x-ndjson" },
    });
    for await (const ev of iterNdjson(res, "POST /v1/images")) {
      if (ev.type === "progress") {
        if (opts.onProgress) await opts.onProgress(String(ev.data ?? ""));
      } else if (ev.type === "done") {
        return ev.image as ImageInfo;
      } else if (ev.type === "error") {
        throw new ServerError(`image build failed: ${String(ev.error)}`, res.status, ev);
      }
    }
    throw new RamifyError("image build: the stream ended without a result", res.status);
  }

  /** The default image and the named ones (`GET /v1/images`). */
  static async listImages(opts: ClientOptions = {}): Promise<ImageInfo[]> {
    const data = await new HttpClient(opts).json<{ images?: ImageInfo[] } | null>("GET", "/v1/images");
    return data?.images ?? [];
  }

  /** One image (`GET /v1/images/{name}`; `"default"` is the default one); throws `NotFound`. */
  static async getImage(name: string, opts: ClientOptions = {}): Promise<ImageInfo> {
    return new HttpClient(opts).json<ImageInfo>("GET", `/v1/images/${enc(name)}`);
  }

  /** Delete a named image; throws `Conflict` while sandboxes or templates use it. */
  static async deleteImage(name: string, opts: ClientOptions = {}): Promise<void> {
    await new HttpClient(opts).request("DELETE", `/v1/images/${enc(name)}`);
  }

  // -- templates ------------------------------------------------------------------------------------
  /**
   * Capture this sandbox (its files and its interpreter's variables) as template `name` (`POST /v1/templates`);
   * the sandbox keeps running. `Sandbox.create({ template: name })` starts new sandboxes from it. Throws
   * `Conflict` when the name is taken.
   */
  async saveTemplate(name: string): Promise<TemplateInfo> {
    this._check();
    return this._client.json<TemplateInfo>("POST", "/v1/templates", {
      json: { name, from: this.id },
      timeoutS: this._client.longer(300),
    });
  }

  /** Every template, by name (`GET /v1/templates`). */
  static async listTemplates(opts: ClientOptions = {}): Promise<TemplateInfo[]> {
    const data = await new HttpClient(opts).json<{ templates?: TemplateInfo[] } | null>("GET", "/v1/templates");
    return data?.templates ?? [];
  }

  /** One template (`GET /v1/templates/{name}`); throws `NotFound`. */
  static async getTemplate(name: string, opts: ClientOptions = {}): Promise<TemplateInfo> {
    return new HttpClient(opts).json<TemplateInfo>("GET", `/v1/templates/${enc(name)}`);
  }

  /** Delete a template; sandboxes created from it are not affected. Throws `NotFound`. */
  static async deleteTemplate(name: string, opts: ClientOptions = {}): Promise<void> {
    await new HttpClient(opts).request("DELETE", `/v1/templates/${enc(name)}`);
  }

  // -- pause / resume -------------------------------------------------------------------------------
  /** Pause (snapshot) the sandbox; with `wait` (default) poll until it is `paused`. */
  async pause(opts: WaitOptions = {}): Promise<SandboxInfo> {
    return this.transition("/pause", "paused", opts);
  }

  /** Resume a paused sandbox; with `wait` (default) poll until it is `running`. */
  async resume(opts: WaitOptions = {}): Promise<SandboxInfo> {
    return this.transition("/resume", "running", opts);
  }

  private async transition(suffix: string, target: string, opts: WaitOptions): Promise<SandboxInfo> {
    this._check();
    const res = await this._client.request("POST", this._path(suffix), { timeoutS: this._client.longer(120) });
    let data: unknown = null;
    try {
      data = await readJson(res, "POST", this._path(suffix));
    } catch (e) {
      if (!(e instanceof RamifyError)) throw e;
    }
    if (data && typeof data === "object" && (data as SandboxInfo).id === this.id) this.info = data as SandboxInfo;
    if (opts.wait ?? true) {
      if (data && typeof data === "object" && (data as SandboxInfo).status === target) return this.info;
      await this._waitFor(target, opts.pollTimeoutS ?? DEFAULT_POLL_TIMEOUT_S, opts.onProgress);
    }
    return this.info;
  }

  /** Wait until the sandbox reaches `target` status; throws on `error` or after `timeoutS`. */
  async waitForStatus(target: string, opts: { timeoutS?: number } = {}): Promise<SandboxInfo> {
    this._check();
    return this._waitFor(target, opts.timeoutS ?? DEFAULT_POLL_TIMEOUT_S);
  }

  /**
   * @internal Wait until the status is `target`: the server answers `GET .../wait` as soon as it is (or when it goes
   * to `error`, or, waiting for `paused`, when the pause failed, or, waiting for `running`, when the resume failed),
   * so this returns within milliseconds of the transition (the 202's `X-Poll-After` is not needed). Throws
   * `SandboxErrorState` on `error`, `PauseFailed` when the pause failed and `ResumeFailed` when the resume failed
   * (the sandbox is paused again).
   */
  async _waitFor(
    target: string,
    timeoutS: number,
    onProgress?: (p: NonNullable<SandboxInfo["progress"]>) => void,
  ): Promise<SandboxInfo> {
    const deadline = Date.now() + timeoutS * 1000;
    for (;;) {
      const remainingMs = deadline - Date.now();
      if (remainingMs <= 0) {
        throw new TimeoutError(
          `sandbox ${this.id} did not become '${target}' within ${timeoutS}s (last status '${this.info.status}')`,
        );
      }
      const chunkS = Math.min(remainingMs / 1000, onProgress ? 0.5 : WAIT_CHUNK_S);
      const path = this._path("/wait");
      const res = await this._client.request("GET", path, {
        query: { status: target, timeout_s: chunkS.toFixed(3) },
        timeoutS: this._client.longer(chunkS + 30),
      });
      const info = (await readJson(res, "GET", path)) as SandboxInfo | null;
      if (info && typeof info === "object") this.info = info;
      const status = this.info.status;
      if (status === target) return this.info;
      if (status === "error") {
        throw new SandboxErrorState(
          `sandbox ${this.id} went to status 'error' while waiting for '${target}': ${this.info.error || "unknown error"}`,
          undefined,
          this.info,
        );
      }
      const pauseError = this.info.pause?.error;
      if (target === "paused" && status === "running" && pauseError) {
        throw new PauseFailed(`sandbox ${this.id} was not paused and keeps running: ${pauseError}`, undefined, this.info);
      }
      if (target === "running" && status === "paused" && pauseError) {
        throw new ResumeFailed(`sandbox ${this.id} was not resumed and is paused again: ${pauseError}`, undefined, this.info);
      }
      if (onProgress && this.info.progress) onProgress(this.info.progress);
    }
  }

  // -- lifecycle ------------------------------------------------------------------------------------
  /** Destroy the sandbox (`DELETE`). Idempotent; a 404 is ignored; a no-op when defunct. */
  async close(): Promise<void> {
    if (this._closed || this._mergedInto !== null) return;
    try {
      const res = await this._client.request("DELETE", this._path());
      await res.body?.cancel().catch(() => {});
    } catch (e) {
      if (!(e instanceof SandboxNotFound)) throw e;
    }
    this._closed = true;
  }

  /** Alias of `close`. */
  kill(): Promise<void> {
    return this.close();
  }

  toString(): string {
    let state: unknown = this.info.status;
    if (this._mergedInto !== null) state = `defunct (merged into ${this._mergedInto})`;
    else if (this._closed) state = "closed";
    return `Sandbox(id=${this.id}, status=${String(state)})`;
  }
}
