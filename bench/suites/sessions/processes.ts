/** Child processes the sessions suite runs besides the service: started, timed, stopped. */
import * as fs from "node:fs";
import { type ChildProcess, spawn } from "node:child_process";

/** A process this suite starts itself (the bare reference server). */
export interface StartedProcess {
  url: string;
  cpuMs(): number;
  stop(): Promise<void>;
}

/** Starts `node <script> <args>` and waits for the `"url":"…"` it prints. */
export async function startScript(script: string, args: string[]): Promise<StartedProcess> {
  const child = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "inherit"] });
  return attach(child);
}

/** Waits for the child to print its URL; stopping it sends SIGTERM and waits for the exit. */
async function attach(child: ChildProcess): Promise<StartedProcess> {
  const url = await new Promise<string>((resolve, reject) => {
    let buffered = "";
    const timer = setTimeout(() => reject(new Error("the process did not print its URL within 15 s")), 15_000);
    child.once("exit", (code) => reject(new Error(`the process exited with ${code} before listening`)));
    child.stdout!.on("data", (chunk: Buffer) => {
      buffered += chunk.toString("utf8");
      const match = /"url":"(http:\/\/[^"]+)"/.exec(buffered);
      if (match) {
        clearTimeout(timer);
        child.stdout!.removeAllListeners("data");
        child.stdout!.resume();
        resolve(match[1]!);
      }
    });
  });
  const pid = child.pid!;
  return {
    url,
    cpuMs: () => processCpuMs(pid),
    async stop() {
      const exited = new Promise((resolve) => child.once("exit", resolve));
      child.kill("SIGTERM");
      await exited;
    },
  };
}

function processCpuMs(pid: number): number {
  const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // USER_HZ is 100 on Linux
}
