/**
 * Follow the server's lifecycle events (`GET /v1/events`, server-sent events).
 *
 * ```ts
 * import { events } from "ramify";
 * for await (const ev of events({ family: sb.info.family_id })) {
 *   console.log(ev.id, ev.type, ev.sandbox, ev.children);   // `break` to stop
 * }
 * ```
 *
 * The iterator reconnects by itself when the connection drops, resuming after the last event it yielded
 * (`Last-Event-ID`); a `missed` event says that events were lost (the id was older than the server's history,
 * or the server restarted). See docs/observability.md.
 */
import { HttpClient, readError, type ClientOptions } from "./http.js";
import { RamifyError, ServerError, ServerUnreachable, TimeoutError } from "./errors.js";

/** One lifecycle event; fields that do not apply to its type are absent. */
export interface LifecycleEvent {
  type: string;
  /** Absent on `missed`. */
  id?: number;
  time: string;
  sandbox?: string;
  family?: string;
  status?: string;
  parent?: string;
  children?: string[];
  winner?: string;
  other?: string;
  n?: number;
  ms?: number;
  pause_ms?: number;
  bytes?: number;
  reason?: string;
  error?: string;
  after?: number;
  oldest?: number;
}

export interface EventsOptions extends ClientOptions {
  /** Only events that mention this sandbox (subject, fork parent or child, merge winner, diff side). */
  sandbox?: string;
  /** Only events of this fork family. */
  family?: string;
  /** Start after this event id (from the server's recent history); default: from the next event. */
  after?: number;
  /** Re-open a dropped stream after a second, resuming (default true); false: end with the stream. */
  reconnect?: boolean;
  /** Stops the iterator (it then returns). */
  signal?: AbortSignal;
}

const sleep = (ms: number, signal?: AbortSignal) =>
  new Promise<void>((resolve) => {
    if (signal?.aborted) return resolve();
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => (clearTimeout(t), resolve()), { once: true });
  });

/** Parse an SSE body into events. */
async function* parse(res: Response, signal?: AbortSignal): AsyncGenerator<LifecycleEvent> {
  if (!res.body) return;
  const reader = res.body.getReader();
  if (signal?.aborted) {
    // aborted while the request was on its way (an abort listener added now would never fire)
    reader.cancel().catch(() => {});
    return;
  }
  const onAbort = () => reader.cancel().catch(() => {});
  signal?.addEventListener("abort", onAbort, { once: true });
  const decoder = new TextDecoder();
  let buf = "";
  let data: string[] = [];
  try {
    for (;;) {
      let chunk: ReadableStreamReadResult<Uint8Array>;
      try {
        chunk = await reader.read();
      } catch (e) {
        if (signal?.aborted) return;
        throw readError(e, "GET /v1/events");
      }
      if (chunk.done) return;
      buf += decoder.decode(chunk.value, { stream: true });
      let nl: number;
      while ((nl = buf.indexOf("\n")) >= 0) {
        const line = buf.slice(0, nl).replace(/\r$/, "");
        buf = buf.slice(nl + 1);
        if (line !== "") {
          // id: and event: repeat what data holds; ":" lines are keepalives
          if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          continue;
        }
        if (data.length === 0) continue;
        const text = data.join("\n");
        data = [];
        try {
          yield JSON.parse(text) as LifecycleEvent;
        } catch (e) {
          throw new RamifyError(`invalid event from server: ${text.slice(0, 200)}`, res.status, undefined, { cause: e });
        }
      }
    }
  } finally {
    signal?.removeEventListener("abort", onAbort);
    reader.cancel().catch(() => {});
  }
}

/** Yield lifecycle events as they happen (see the module's doc). Errors the server answers (401, 400) throw. */
export async function* events(opts: EventsOptions = {}): AsyncGenerator<LifecycleEvent> {
  // No request timeout: the stream is open-ended (the server sends a keepalive every 15 s).
  const client = new HttpClient({ ...opts, requestTimeoutS: null });
  const reconnect = opts.reconnect ?? true;
  let last = opts.after ?? 0;
  while (!opts.signal?.aborted) {
    const headers: Record<string, string> = { Accept: "text/event-stream" };
    if (last) headers["Last-Event-ID"] = String(last);
    try {
      const res = await client.request("GET", "/v1/events", {
        query: { sandbox: opts.sandbox, family: opts.family },
        headers,
        retry: false,
      });
      for await (const ev of parse(res, opts.signal)) {
        if (ev.id) last = ev.id;
        yield ev;
      }
      if (!reconnect) return;
    } catch (e) {
      if (opts.signal?.aborted) return;
      const transient = e instanceof ServerUnreachable || e instanceof TimeoutError || e instanceof ServerError;
      if (!reconnect || !transient) throw e;
    }
    await sleep(1000, opts.signal);
  }
}
