/**
 * Minimal HTTP layer over the global `fetch` (no dependencies).
 */
import { RamifyError, ServerUnreachable, TimeoutError, errorForStatus } from "./errors.js";
import { VERSION } from "./version.js";

export const DEFAULT_API_URL = "http://127.0.0.1:7070";
/** Default per-request timeout in seconds. */
export const DEFAULT_REQUEST_TIMEOUT_S = 60;

/**
 * Retry policy for idempotent calls (GET / HEAD / DELETE) on connection errors that happen before a
 * response arrives: `maxTries` attempts, delays `baseDelayMs * 2^k` (+ up to 10% jitter).
 * Mutable so tests (or users) can tune it.
 */
export const retryPolicy = { maxTries: 4, baseDelayMs: 200 };

const IDEMPOTENT = new Set(["GET", "HEAD", "DELETE", "OPTIONS"]);

/** Connection settings shared by `Sandbox.create`, `connect` and `list`. */
export interface ClientOptions {
  /** Server URL; default `RAMIFY_API_URL` or `http://127.0.0.1:7070`. */
  apiUrl?: string;
  /** API key; default `RAMIFY_API_KEY`. */
  apiKey?: string;
  /** Per-request timeout in seconds (default 60; `null` or 0 = none). Long calls get more. */
  requestTimeoutS?: number | null;
  /** A `fetch` implementation to use instead of the global one. */
  fetch?: typeof fetch;
}

export type QueryValue = string | number | boolean | null | undefined;
export type Query = Record<string, QueryValue> | Array<[string, QueryValue]>;

export interface RequestOptions {
  query?: Query;
  /** JSON body (sets Content-Type). */
  json?: unknown;
  /** Raw body. */
  body?: BodyInit | null;
  headers?: Record<string, string>;
  /** Timeout in seconds for this request; `null` = none; undefined = the client default. */
  timeoutS?: number | null;
  /** 404s of file routes become `FileNotFound` instead of `SandboxNotFound`. */
  fileRoute?: boolean;
  /** Retry on connection errors; default true for GET/HEAD/DELETE with a replayable body. */
  retry?: boolean;
}

function env(name: string): string | undefined {
  const proc = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  const v = proc?.env?.[name];
  return v === "" ? undefined : v;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function isTimeout(e: unknown): boolean {
  return e instanceof Error && (e.name === "TimeoutError" || (e as { code?: unknown }).code === 23);
}

function describe(e: unknown): string {
  if (!(e instanceof Error)) return String(e);
  const cause = (e as { cause?: unknown }).cause;
  if (cause instanceof Error) {
    const code = (cause as { code?: unknown }).code;
    return code ? `${cause.message} (${String(code)})` : cause.message;
  }
  return e.message;
}

export class HttpClient {
  readonly apiUrl: string;
  readonly apiKey: string | undefined;
  readonly requestTimeoutS: number | null;
  private readonly fetchImpl: typeof fetch;

  constructor(opts: ClientOptions = {}) {
    let url = opts.apiUrl || env("RAMIFY_API_URL") || DEFAULT_API_URL;
    if (!url.includes("://")) url = "http://" + url;
    let parsed: URL;
    try {
      parsed = new URL(url);
    } catch {
      throw new TypeError(`invalid apiUrl: ${JSON.stringify(url)}`);
    }
    if (parsed.protocol !== "http:" && parsed.protocol !== "https:") {
      throw new TypeError(`unsupported apiUrl scheme ${parsed.protocol} (want http or https)`);
    }
    this.apiUrl = url.replace(/\/+$/, "");
    this.apiKey = opts.apiKey !== undefined ? opts.apiKey : env("RAMIFY_API_KEY");
    const rt = opts.requestTimeoutS === undefined ? DEFAULT_REQUEST_TIMEOUT_S : opts.requestTimeoutS;
    this.requestTimeoutS = rt === null || rt === 0 ? null : rt;
    const f = opts.fetch ?? globalThis.fetch;
    if (typeof f !== "function") throw new TypeError("no global fetch: Node 20 or newer is required");
    this.fetchImpl = f;
  }

  /** `max(requestTimeoutS, atLeast)`, or null when the client has no timeout. */
  longer(atLeast: number): number | null {
    return this.requestTimeoutS === null ? null : Math.max(this.requestTimeoutS, atLeast);
  }

  urlFor(path: string, query?: Query): string {
    let url = this.apiUrl + path;
    if (query) {
      const entries = Array.isArray(query) ? query : Object.entries(query);
      const params = new URLSearchParams();
      for (const [k, v] of entries) if (v !== undefined && v !== null) params.append(k, String(v));
      const qs = params.toString();
      if (qs) url += "?" + qs;
    }
    return url;
  }

  /** Send a request; throw a `RamifyError` subclass on error statuses. The body is not read. */
  async request(method: string, path: string, opts: RequestOptions = {}): Promise<Response> {
    method = method.toUpperCase();
    const headers: Record<string, string> = {
      "User-Agent": `ramify-typescript/${VERSION}`,
      Accept: "application/json",
    };
    if (this.apiKey) headers["Authorization"] = `Bearer ${this.apiKey}`;
    let body: BodyInit | null | undefined = opts.body;
    if (opts.json !== undefined) {
      body = JSON.stringify(opts.json);
      headers["Content-Type"] = "application/json";
    }
    Object.assign(headers, opts.headers ?? {});
    const streamed = typeof ReadableStream !== "undefined" && body instanceof ReadableStream;
    const keyed = () => Object.keys(headers).some((k) => k.toLowerCase() === "idempotency-key");
    if (method === "POST" && !streamed && !keyed()) {
      // The server does a POST with a key at most once and answers a repeat with the first call's answer: a
      // call whose connection broke is retried without forking (creating, merging...) twice.
      headers["Idempotency-Key"] = globalThis.crypto.randomUUID();
    }
    let retry = opts.retry ?? (IDEMPOTENT.has(method) || keyed());
    if (streamed) retry = false; // a streamed body cannot be replayed
    const tries = retry ? Math.max(1, retryPolicy.maxTries) : 1;
    const timeoutS = opts.timeoutS === undefined ? this.requestTimeoutS : opts.timeoutS;
    const url = this.urlFor(path, opts.query);

    let lastErr: unknown;
    for (let attempt = 0; attempt < tries; attempt++) {
      if (attempt > 0) {
        const delay = retryPolicy.baseDelayMs * 2 ** (attempt - 1);
        await sleep(delay + Math.random() * (delay / 10));
      }
      const init: RequestInit & { duplex?: string } = { method, headers, body: body ?? null };
      if (streamed) init.duplex = "half";
      if (timeoutS !== null && timeoutS > 0) init.signal = AbortSignal.timeout(Math.ceil(timeoutS * 1000));
      let res: Response;
      try {
        res = await this.fetchImpl(url, init);
      } catch (e) {
        if (isTimeout(e)) {
          throw new TimeoutError(`${method} ${path}: timed out after ${timeoutS}s`, undefined, undefined, { cause: e });
        }
        if (e instanceof RamifyError) throw e;
        lastErr = e;
        continue;
      }
      if (res.status >= 400) {
        let text = "";
        try {
          text = await res.text();
        } catch {
          /* ignore */
        }
        const [msg, parsed] = errorMessage(text, res.status, res.statusText);
        throw errorForStatus(res.status, msg, parsed, opts.fileRoute ?? false);
      }
      return res;
    }
    throw new ServerUnreachable(
      `${method} ${path}: cannot reach ramify server at ${this.apiUrl} after ${tries} ${tries === 1 ? "try" : "tries"}: ${describe(lastErr)}`,
      undefined,
      undefined,
      { cause: lastErr },
    );
  }

  /** Send a request and decode its JSON body (null for an empty body). */
  async json<T = unknown>(method: string, path: string, opts: RequestOptions = {}): Promise<T> {
    const res = await this.request(method, path, opts);
    return (await readJson(res, method, path)) as T;
  }
}

function errorMessage(text: string, status: number, reason: string): [string, unknown] {
  let body: unknown = undefined;
  let msg = "";
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = text;
    }
    if (body && typeof body === "object" && typeof (body as { error?: unknown }).error === "string") {
      msg = (body as { error: string }).error;
    } else if (typeof body === "string") {
      msg = body.trim().slice(0, 500);
    }
  }
  return [msg || reason || `HTTP ${status}`, body];
}

/** Read the whole body, mapping timeouts and broken connections to SDK errors. */
export async function readBody(res: Response, what: string): Promise<Uint8Array> {
  try {
    return new Uint8Array(await res.arrayBuffer());
  } catch (e) {
    throw readError(e, what);
  }
}

export function readError(e: unknown, what: string): RamifyError {
  if (e instanceof RamifyError) return e;
  if (isTimeout(e)) return new TimeoutError(`${what}: timed out reading the response`, undefined, undefined, { cause: e });
  return new ServerUnreachable(`${what}: connection lost mid-response: ${describe(e)}`, undefined, undefined, { cause: e });
}

export async function readJson(res: Response, method: string, path: string): Promise<unknown> {
  const data = await readBody(res, `${method} ${path}`);
  if (data.length === 0) return null;
  const text = new TextDecoder().decode(data);
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new RamifyError(`invalid JSON from server: ${text.slice(0, 200)}`, res.status, undefined, { cause: e });
  }
}

/** Yield one decoded JSON object per non-empty NDJSON line, as the lines arrive. */
export async function* iterNdjson(res: Response, what: string): AsyncGenerator<Record<string, unknown>> {
  if (!res.body) return;
  const reader = res.body.getReader();
  const decoder = new TextDecoder();
  let buf = "";
  const parse = (line: string): Record<string, unknown> | undefined => {
    line = line.trim();
    if (!line) return undefined;
    let ev: unknown;
    try {
      ev = JSON.parse(line);
    } catch (e) {
      throw new RamifyError(`invalid NDJSON line from server: ${line.slice(0, 200)}`, res.status, undefined, { cause: e });
    }
    return ev && typeof ev === "object" && !Array.isArray(ev) ? (ev as Record<string, unknown>) : undefined;
  };
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e) {
        throw readError(e, what);
      }
      if (chunk.done) break;
      buf += decoder.decode(chunk.value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const ev = parse(buf.slice(0, nl));
        buf = buf.slice(nl + 1);
        if (ev) yield ev;
      }
    }
    buf += decoder.decode();
    const ev = parse(buf);
    if (ev) yield ev;
  } finally {
    reader.cancel().catch(() => {});
  }
}
