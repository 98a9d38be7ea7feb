// A tiny ramify stand-in on node:http: each test installs a handler and inspects recorded requests.
import http from "node:http";

export async function startStub(handler) {
  const requests = [];
  const server = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = Buffer.concat(chunks);
    const url = new URL(req.url, "http://stub");
    const rec = { method: req.method, path: url.pathname, query: url.searchParams, headers: req.headers, body, url: req.url };
    requests.push(rec);
    try {
      await stub.handler(rec, res, req);
    } catch (e) {
      if (!res.headersSent) sendJson(res, 500, { error: `stub: ${e.message}` });
      else res.destroy();
    }
  });
  const stub = {
    handler,
    requests,
    server,
    url: "",
    async close() {
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  };
  await new Promise((r) => server.listen(0, "127.0.0.1", r));
  stub.url = `http://127.0.0.1:${server.address().port}`;
  return stub;
}

export function sendJson(res, status, obj, headers = {}) {
  const data = obj === undefined ? "" : JSON.stringify(obj);
  res.writeHead(status, { "Content-Type": "application/json", ...headers });
  res.end(data);
}

export function json(rec) {
  return rec.body.length ? JSON.parse(rec.body.toString("utf8")) : undefined;
}

export const ID = "sbx_0123456789abcdef0123456789abcdef";
export const ID2 = "sbx_fedcba9876543210fedcba9876543210";
export const ID3 = "sbx_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

export function info(id = ID, status = "running", extra = {}) {
  return { id, status, ip: "10.0.0.2", cwd: "/root", metadata: {}, ...extra };
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
