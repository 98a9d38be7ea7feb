// Installing the package from its path, as a user would from a checkout (`npm install ./sdk/typescript`), with no
// dist/ built: npm must build it (the prepare script) so that importing the package works.
import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { cpSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");

test("npm install <path> of an unbuilt checkout builds the package and it imports", (t) => {
  const tmp = mkdtempSync(join(tmpdir(), "ramify-ts-install-"));
  t.after(() => rmSync(tmp, { recursive: true, force: true }));
  // A clean copy of the sources: what a fresh checkout has (no dist/, no node_modules/).
  const src = join(tmp, "ramify");
  for (const f of ["package.json", "package-lock.json", "tsconfig.json", "README.md", "src", "scripts"]) {
    cpSync(join(pkgDir, f), join(src, f), { recursive: true });
  }
  const proj = join(tmp, "app");
  mkdirSync(proj);
  writeFileSync(join(proj, "package.json"), JSON.stringify({ name: "app", version: "1.0.0", type: "module" }));
  execFileSync("npm", ["install", "--prefer-offline", "--no-audit", "--no-fund", src], {
    cwd: proj,
    stdio: ["ignore", "ignore", "pipe"],
  });
  assert.ok(existsSync(join(src, "dist", "index.js")), "prepare did not build dist/");
  const out = execFileSync(
    process.execPath,
    ["--input-type=module", "-e", 'import { Sandbox, VERSION } from "ramify"; console.log(typeof Sandbox.create, VERSION);'],
    { cwd: proj, encoding: "utf8" },
  );
  const pkg = JSON.parse(readFileSync(join(src, "package.json"), "utf8"));
  assert.equal(out.trim(), `function ${pkg.version}`);
});
