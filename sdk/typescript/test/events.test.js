// The event stream against a real server (scripts/test-ts starts one); skipped without RAMIFY_API_URL and
// RAMIFY_API_KEY, the fork part without RAMIFY_TEST_FORK=1.
import { test, describe } from "node:test";
import assert from "node:assert/strict";
import { Sandbox, events, AuthError, InvalidRequest } from "../dist/index.js";

const HAVE_SERVER = Boolean(process.env.RAMIFY_API_URL && process.env.RAMIFY_API_KEY);
const SKIP = HAVE_SERVER ? false : "set RAMIFY_API_URL and RAMIFY_API_KEY (scripts/test-ts does)";
const FORK = HAVE_SERVER && process.env.RAMIFY_TEST_FORK === "1" ? false : SKIP || "set RAMIFY_TEST_FORK=1";

/** The first event of it that satisfies pred (other tests' events may be in the stream). */
async function until(it, pred) {
  for (let i = 0; i < 500; i++) {
    const { value, done } = await it.next();
    assert.ok(!done, "the stream ended");
    if (pred(value)) return value;
  }
  throw new Error("no matching event");
}

describe("integration: events", () => {
  test("follow a fork family, then resume after an id", { skip: FORK }, async () => {
    const sb = await Sandbox.create({ metadata: { suite: "ts-sdk-events" } });
    const kids = [];
    const family = sb.info.family_id;
    // After an id the server never gave: a missed event, then the history (nothing can slip past).
    const it = events({ family, after: 1 });
    try {
      const first = await until(it, () => true);
      assert.equal(first.type, "missed");
      assert.equal(first.id, undefined);
      const created = await until(it, (e) => e.type === "created");
      assert.equal(created.sandbox, sb.id);
      kids.push(...(await sb.fork({ n: 2 })));
      const forked = await until(it, (e) => e.type === "forked");
      assert.equal(forked.sandbox, sb.id);
      assert.deepEqual(forked.children, kids.map((k) => k.id));
      assert.ok(forked.id > created.id);
      await kids[1].close();
      const destroyed = await until(it, (e) => e.type === "destroyed");
      assert.equal(destroyed.sandbox, kids[1].id);
      assert.equal(destroyed.reason, "deleted");

      const again = events({ family, after: created.id });
      try {
        assert.equal((await again.next()).value.id, forked.id);
        assert.equal((await again.next()).value.id, destroyed.id);
      } finally {
        await again.return();
      }
    } finally {
      await it.return();
      for (const k of kids) await k.close();
      await sb.close();
    }
  });

  test("an abort signal ends the iterator", { skip: SKIP }, async () => {
    const ac = new AbortController();
    const it = events({ signal: ac.signal });
    const pending = it.next(); // waits for an event that will not come
    ac.abort();
    assert.equal((await pending).done, true);
  });

  test("a bad filter or key throws", { skip: SKIP }, async () => {
    await assert.rejects(events({ sandbox: "not-an-id" }).next(), InvalidRequest);
    await assert.rejects(events({ apiKey: "wrong" }).next(), AuthError);
  });
});
