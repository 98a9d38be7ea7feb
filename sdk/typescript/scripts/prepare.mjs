// npm's prepare script: builds dist/ when the package is installed from a path or a git checkout
// (`npm install ./sdk/typescript`), where no dist/ is committed. npm installs a path dependency as a link without
// its devDependencies, so TypeScript may be missing here: install exactly what package-lock.json pins first
// (ignoring scripts, so this does not recurse), then compile.
import { execFileSync } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const pkgDir = join(dirname(fileURLToPath(import.meta.url)), "..");
const require = createRequire(join(pkgDir, "package.json"));
const npm = process.platform === "win32" ? "npm.cmd" : "npm";

function tscPath() {
  try {
    return require.resolve("typescript/bin/tsc");
  } catch {
    return null;
  }
}

let tsc = tscPath();
if (!tsc) {
  execFileSync(npm, ["ci", "--ignore-scripts", "--include=dev", "--no-audit", "--no-fund", "--prefer-offline"], {
    cwd: pkgDir,
    stdio: ["ignore", "inherit", "inherit"],
  });
  tsc = tscPath();
  if (!tsc) throw new Error("prepare: typescript is still missing after npm ci");
}
execFileSync(process.execPath, [tsc, "-p", "tsconfig.json"], { cwd: pkgDir, stdio: "inherit" });
