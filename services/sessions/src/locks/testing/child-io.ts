/** Synchronous helpers for child processes of the lock tests, which imitate the seed's blocking style. */
import * as fs from "node:fs";

/** Blocks the thread for `ms`. */
export function sleepSync(ms: number): void {
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
}

/** Reads one line from stdin synchronously; null at end of input. */
export function readLineSync(): string | null {
  const bytes: number[] = [];
  const buffer = Buffer.alloc(1);
  for (;;) {
    let n: number;
    try {
      n = fs.readSync(0, buffer, 0, 1, null);
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      if (code === "EAGAIN") {
        sleepSync(1);
        continue;
      }
      if (code === "EOF") n = 0;
      else throw error;
    }
    if (n === 0) return bytes.length ? Buffer.from(bytes).toString() : null;
    if (buffer[0] === 0x0a) return Buffer.from(bytes).toString();
    bytes.push(buffer[0]!);
  }
}

/** Writes one JSON line to stdout synchronously (the test reads events line by line). */
export function say(event: Record<string, unknown>): void {
  fs.writeSync(1, `${JSON.stringify(event)}\n`);
}
