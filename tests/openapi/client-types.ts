// Compiled (tsc --strict, never run) against the types openapi-typescript generates from internal/api/openapi.json:
// what a user of a generated client (openapi-fetch) writes must type-check, and what the API refuses must not.
import createClient from "openapi-fetch";
import type { components, paths } from "./generated/api.js";

type Execution = components["schemas"]["Execution"];
type ExecResult = components["schemas"]["ExecResult"];
type Sandbox = components["schemas"]["Sandbox"];

// Exact type equality: Equal<A, B> is true only if A and B are the same type.
type Equal<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function assertType<T extends true>(_: T): void {}

const id = "sbx_0123456789abcdef0123456789abcdef";
// run_code and exec answer JSON or, when asked, an NDJSON stream (two media types of one 200): a client that
// names the media type it accepts gets the JSON types, as docs/api.md says.
const api = createClient<paths, "application/json">({ baseUrl: "http://127.0.0.1:7070" });
const raw = createClient<paths>({ baseUrl: "http://127.0.0.1:7070" });

export async function usage(): Promise<void> {
  // Every create field is optional, those with a default included.
  const created = await api.POST("/v1/sandboxes", { body: {} });
  await api.POST("/v1/sandboxes", { body: { vcpu: 2, on_timeout: "pause", cwd: "/tmp" } });
  await api.POST("/v1/sandboxes");
  if (created.data) assertType<Equal<typeof created.data, Sandbox>>(true);

  // run_code: code is required, the rest optional; the plain call's data is the JSON type, not a union with events.
  const run = await api.POST("/v1/sandboxes/{id}/run_code", { params: { path: { id } }, body: { code: "1 + 1" } });
  if (run.data) {
    assertType<Equal<typeof run.data, Execution>>(true);
    const value: string | null = run.data.value;
    void value;
  }
  // @ts-expect-error code is required
  await api.POST("/v1/sandboxes/{id}/run_code", { params: { path: { id } }, body: {} });

  // exec: the same.
  const ex = await api.POST("/v1/sandboxes/{id}/exec", { params: { path: { id } }, body: { cmd: "ls" } });
  if (ex.data) assertType<Equal<typeof ex.data, ExecResult>>(true);

  // The stream: asked for with Accept, read as bytes.
  const stream = await raw.POST("/v1/sandboxes/{id}/run_code", {
    params: { path: { id } },
    body: { code: "print(1)" },
    headers: { Accept: "application/x-ndjson" },
    parseAs: "stream",
  });
  const body: ReadableStream<Uint8Array> | null | undefined = stream.data;
  void body;

  // fork: every field optional.
  const fork = await api.POST("/v1/sandboxes/{id}/fork", { params: { path: { id } }, body: {} });
  if (fork.data) {
    const children: string[] = fork.data.children;
    void children;
  }

  // list: the status and metadata filters are parameters.
  await api.GET("/v1/sandboxes", { params: { query: { status: "running", metadata: { project: "demo" } } } });
  // @ts-expect-error not a status
  await api.GET("/v1/sandboxes", { params: { query: { status: "bogus" } } });

  // mkdir: parents optional.
  await api.POST("/v1/sandboxes/{id}/files/mkdir", { params: { path: { id } }, body: { path: "/root/d" } });
}
