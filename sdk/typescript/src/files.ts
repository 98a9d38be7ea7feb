/** File operations of a sandbox (`sb.files`). */
import { RamifyError, FileNotFound } from "./errors.js";
import { readBody, readError, type RequestOptions } from "./http.js";
import { entryFrom, fromBase64, pathField, type Entry, type SandboxPath } from "./models.js";
import type { Sandbox } from "./sandbox.js";

const TRANSFER_TIMEOUT_S = 300;

/** What `files.write` accepts: text (written as UTF-8), bytes, a Blob, or a stream of bytes. */
export type FileData = string | Uint8Array | ArrayBuffer | Blob | ReadableStream<Uint8Array>;

export interface WriteOptions {
  /** File mode: a number (`0o755`) or an octal string (`"0755"`); server default `0644`. */
  mode?: number | string;
}

/** A path for messages: the string, or the bytes decoded with U+FFFD for what is not UTF-8. */
function showPath(p: SandboxPath): string {
  return typeof p === "string" ? p : new TextDecoder().decode(p);
}

function modeStr(mode: number | string | undefined): string | undefined {
  if (mode === undefined) return undefined;
  return typeof mode === "number" ? mode.toString(8).padStart(4, "0") : String(mode);
}

/** `sb.files`: read, write, list and transfer files inside the sandbox. */
export class Files {
  /** @internal */
  constructor(private readonly sb: Sandbox) {}

  private async req(method: string, suffix: string, opts: RequestOptions = {}): Promise<Response> {
    const sb = this.sb as unknown as SandboxInternals;
    sb._check();
    return sb._client.request(method, sb._path(suffix), { fileRoute: true, ...opts });
  }

  private async json(method: string, suffix: string, opts: RequestOptions = {}): Promise<Record<string, unknown> | null> {
    const res = await this.req(method, suffix, opts);
    const data = await readBody(res, `${method} ${suffix}`);
    if (data.length === 0) return null;
    try {
      return JSON.parse(new TextDecoder().decode(data));
    } catch (e) {
      throw new RamifyError("invalid JSON from server", res.status, undefined, { cause: e });
    }
  }

  private transferTimeout(): number | null {
    return (this.sb as unknown as SandboxInternals)._client.longer(TRANSFER_TIMEOUT_S);
  }

  // -- reading ------------------------------------------------------------------------------------
  /** The whole content of a file. */
  async read(path: SandboxPath): Promise<Uint8Array> {
    const res = await this.req("GET", "/files", {
      query: pathField(path),
      timeoutS: this.transferTimeout(),
      headers: { Accept: "application/octet-stream" },
    });
    return readBody(res, `read ${showPath(path)}`);
  }

  /** The content of a file decoded as UTF-8 (invalid bytes replaced, or an error with `fatal`). */
  async readText(path: SandboxPath, opts: { fatal?: boolean } = {}): Promise<string> {
    return new TextDecoder("utf-8", { fatal: opts.fatal ?? false }).decode(await this.read(path));
  }

  /**
   * A stream of the file's bytes, read from the network as it is consumed. Errors (missing file,
   * ...) are thrown by this call, not on the first read. Cancel the stream if you stop early.
   */
  async readStream(path: SandboxPath): Promise<ReadableStream<Uint8Array>> {
    const res = await this.req("GET", "/files", {
      query: pathField(path),
      timeoutS: this.transferTimeout(),
      headers: { Accept: "application/octet-stream" },
    });
    const body = res.body;
    if (!body) return new ReadableStream<Uint8Array>({ start: (c) => c.close() });
    const reader = body.getReader();
    return new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (done) controller.close();
          else controller.enqueue(value);
        } catch (e) {
          controller.error(readError(e, `read ${showPath(path)}`));
        }
      },
      cancel(reason) {
        return reader.cancel(reason);
      },
    });
  }

  /** Stream a sandbox file to a local file (node:fs); return the number of bytes written. */
  async downloadFile(remotePath: string, localPath: string): Promise<number> {
    const stream = await this.readStream(remotePath);
    const { open } = await import("node:fs/promises");
    const fh = await open(localPath, "w");
    let n = 0;
    const reader = stream.getReader();
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        await fh.write(value);
        n += value.length;
      }
    } catch (e) {
      await reader.cancel().catch(() => {});
      throw e;
    } finally {
      await fh.close();
    }
    return n;
  }

  // -- writing ------------------------------------------------------------------------------------
  /**
   * Write `data` to `path` (parent directories are created). A `ReadableStream` is sent as it is
   * read (chunked transfer encoding). Returns the server's `{path, size}`.
   */
  async write(path: SandboxPath, data: FileData, opts: WriteOptions = {}): Promise<{ path: string; size: number; pathBytes?: Uint8Array }> {
    let body: BodyInit;
    if (typeof data === "string") body = new TextEncoder().encode(data);
    else if (data instanceof Uint8Array || data instanceof ArrayBuffer) body = data as BodyInit;
    else if (typeof Blob !== "undefined" && data instanceof Blob) body = data;
    else if (typeof ReadableStream !== "undefined" && data instanceof ReadableStream) body = data;
    else throw new TypeError("data must be a string, Uint8Array, ArrayBuffer, Blob or ReadableStream");
    const r = await this.json("PUT", "/files", {
      query: { ...pathField(path), mode: modeStr(opts.mode) },
      body,
      headers: { "Content-Type": "application/octet-stream" },
      timeoutS: this.transferTimeout(),
    });
    const out: { path: string; size: number; pathBytes?: Uint8Array } = { path: String(r?.path ?? showPath(path)), size: Number(r?.size ?? 0) };
    if (r?.path_b64) out.pathBytes = fromBase64(String(r.path_b64));
    return out;
  }

  /** Stream a local file (node:fs) into the sandbox. */
  async uploadFile(localPath: string, remotePath: SandboxPath, opts: WriteOptions = {}): Promise<{ path: string; size: number; pathBytes?: Uint8Array }> {
    const { openAsBlob } = await import("node:fs");
    return this.write(remotePath, await openAsBlob(localPath), opts);
  }

  // -- metadata -----------------------------------------------------------------------------------
  /** List a directory (entries sorted by name). */
  async list(path: SandboxPath): Promise<Entry[]> {
    const data = await this.json("GET", "/files/list", { query: pathField(path) });
    const entries = (data?.entries as Record<string, unknown>[] | undefined) ?? [];
    return entries.map(entryFrom);
  }

  async stat(path: SandboxPath): Promise<Entry> {
    return entryFrom(await this.json("GET", "/files/stat", { query: pathField(path) }));
  }

  async exists(path: SandboxPath): Promise<boolean> {
    try {
      await this.stat(path);
      return true;
    } catch (e) {
      if (e instanceof FileNotFound) return false;
      throw e;
    }
  }

  /** Create a directory (with its parents unless `parents: false`). */
  async mkdir(path: SandboxPath, opts: { parents?: boolean } = {}): Promise<Entry> {
    return entryFrom(await this.json("POST", "/files/mkdir", { json: { ...pathField(path), parents: opts.parents ?? true } }));
  }

  /** Remove a file, or a directory with `recursive: true`. */
  async remove(path: SandboxPath, opts: { recursive?: boolean } = {}): Promise<void> {
    const res = await this.req("DELETE", "/files", {
      query: { ...pathField(path), recursive: opts.recursive ? "true" : undefined },
      timeoutS: this.transferTimeout(),
    });
    await res.body?.cancel().catch(() => {});
  }
}

/** @internal What Files needs from Sandbox. */
interface SandboxInternals {
  _check(): void;
  _path(suffix?: string): string;
  _client: import("./http.js").HttpClient;
}
