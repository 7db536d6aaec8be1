// Starts `specula serve` on 127.0.0.1 with a free port for the tests in this folder and stops it with
// SIGTERM. CTest passes the binary and the source tree: SPECULA_BIN, SPECULA_SOURCE_DIR.
import { spawn } from "node:child_process";
import { once } from "node:events";
import path from "node:path";
import { fileURLToPath } from "node:url";

export const sourceDir = process.env.SPECULA_SOURCE_DIR ?? path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");
const bin = process.env.SPECULA_BIN ?? path.join(sourceDir, "build/bin/specula");

// Resolves when /health answers 200 (the model is loaded); rejects after `timeoutMs`.
export async function startServer(args = ["configs/default.yaml", "--parallel", "2"], timeoutMs = 60000) {
  const child = spawn(bin, ["serve", ...args, "--host", "127.0.0.1", "--port", "0"],
                      { cwd: sourceDir, stdio: ["ignore", "pipe", "pipe"] });
  let stderr = "";
  child.stderr.on("data", (d) => { stderr += d; });
  const url = await new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`no listening line from ${bin} within ${timeoutMs} ms: ${stderr}`)), timeoutMs);
    child.stdout.on("data", (d) => {
      out += d;
      const m = out.match(/listening on (http:\/\/[^\s]+)/);
      if (m) { clearTimeout(timer); resolve(m[1]); }
    });
    child.on("exit", (code) => { clearTimeout(timer); reject(new Error(`${bin} exited with ${code}: ${stderr}`)); });
    child.on("error", (e) => { clearTimeout(timer); reject(new Error(`cannot start ${bin}: ${e.message}`)); });
  });
  child.stdout.resume();
  for (const end = Date.now() + timeoutMs; ;) {
    const r = await fetch(`${url}/health`).catch(() => null);
    if (r?.status === 200) break;
    if (Date.now() > end) throw new Error(`${url}/health did not turn 200 within ${timeoutMs} ms: ${stderr}`);
    await new Promise((r) => setTimeout(r, 50));
  }
  return {
    url,
    // SIGTERM, then the exit status (the server exits 0 after a graceful shutdown).
    async stop() {
      if (child.exitCode !== null) return child.exitCode;
      child.kill("SIGTERM");
      const [code] = await once(child, "exit");
      return code;
    },
    stderr: () => stderr,
  };
}
