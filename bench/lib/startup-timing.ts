/**
 * Start-up timing, as the command suites measure it: several start-ups (a command to its exit, a
 * server to its first answer, a bare `node -e 0` for reference) timed in rounds, each round running
 * each once in turn so that a noisy moment of the shared machine hits all of them alike.
 */
import { spawn } from "node:child_process";

/**
 * Times each start-up of `timers` (by name, in order) once a round, for one round more than
 * `rounds`: the first warms the file cache and is not counted. Resolves with the samples (ms) by name.
 */
export async function timeInRounds(timers: ReadonlyMap<string, () => Promise<number>>, rounds: number): Promise<Map<string, number[]>> {
  const samples = new Map<string, number[]>([...timers.keys()].map((name) => [name, []]));
  for (let round = 0; round <= rounds; round++) {
    for (const [name, time] of timers) {
      const ms = await time();
      if (round > 0) samples.get(name)!.push(ms);
    }
  }
  return samples;
}

/** Runs `node args` to its exit; resolves with the wall time in ms. Fails on a non-zero exit, with its stderr. */
export function timeToExit(node: string, args: readonly string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  return new Promise((resolve, reject) => {
    const started = performance.now();
    const child = spawn(node, args, { env, stdio: ["ignore", "ignore", "pipe"] });
    let stderr = "";
    child.stderr.setEncoding("utf8").on("data", (chunk: string) => (stderr += chunk));
    child.once("error", reject);
    child.once("exit", (code, signal) => {
      const ms = performance.now() - started;
      if (code === 0) resolve(ms);
      else reject(new Error(`${node} ${args.join(" ")} exited with ${code ?? signal}: ${stderr.trim()}`));
    });
  });
}

/** What `node args…` prints on stdout, once it exits (its stderr passes through). */
export function processOutput(node: string, args: readonly string[]): Promise<string> {
  return new Promise((resolve, reject) => {
    const child = spawn(node, args, { stdio: ["ignore", "pipe", "inherit"] });
    let out = "";
    child.stdout.setEncoding("utf8").on("data", (chunk: string) => (out += chunk));
    child.once("error", reject);
    child.once("exit", () => resolve(out));
  });
}
