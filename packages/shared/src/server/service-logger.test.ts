import { mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import * as path from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { pino, type Logger } from "pino";
import { commonServerConfig, loadConfig, type LogFormat } from "../config.js";
import { createServiceLogger, logFormatFor } from "./service-logger.js";

const dirs: string[] = [];
afterEach(() => {
  for (const dir of dirs.splice(0)) rmSync(dir, { recursive: true, force: true });
});

/**
 * A file standing in for stdout, `isTTY` as given. `read` reads what the logger wrote: a pretty
 * log is written synchronously; a JSON log's asynchronous destination is ended (which writes what
 * it holds and closes the file) first.
 */
function fakeOutput(isTTY: boolean) {
  const dir = mkdtempSync(path.join(tmpdir(), "berth-log-"));
  dirs.push(dir);
  const file = path.join(dir, "out");
  const fd = openSync(file, "w");
  return {
    output: { fd, isTTY },
    async read(logger: Logger, format: LogFormat): Promise<string> {
      if (format === "json") {
        const destination = (logger as unknown as Record<symbol, NodeJS.EventEmitter & { end(): void }>)[pino.symbols.streamSym]!;
        await new Promise((resolve) => {
          destination.once("close", resolve);
          destination.end();
        });
      }
      return readFileSync(file, "utf8");
    },
  };
}

/** A loader of pino-pretty that counts its loads. */
function countingLoader() {
  const loader = { loads: 0, load: () => (loader.loads++, import("pino-pretty")) };
  return loader;
}

describe("the service logger", () => {
  it("on a terminal writes readable lines (pino-pretty), loaded then and only then", async () => {
    const { output, read } = fakeOutput(true);
    const pretty = countingLoader();
    const { logger, format } = await createServiceLogger({ level: "info", output, env: { NO_COLOR: "1" }, loadPretty: pretty.load });
    expect(format).toBe("pretty");
    expect(pretty.loads).toBe(1);
    logger.info({ method: "/berth.locks.v1.LockService/Hold", code: "ok" }, "rpc");
    const text = await read(logger, format);
    expect(text).toMatch(/^\[\d\d:\d\d:\d\d\.\d{3}\] INFO: rpc \{"method":"\/berth\.locks\.v1\.LockService\/Hold","code":"ok"\}\n$/);
  });

  it("anywhere else (a pipe, a file) writes JSON lines, without loading pino-pretty", async () => {
    const { output, read } = fakeOutput(false);
    const pretty = countingLoader();
    const { logger, format } = await createServiceLogger({ level: "info", output, loadPretty: pretty.load });
    expect(format).toBe("json");
    logger.info({ code: "ok" }, "rpc");
    const lines = (await read(logger, format)).trim().split("\n");
    expect(lines.map((line) => JSON.parse(line) as unknown)).toEqual([expect.objectContaining({ level: 30, msg: "rpc", code: "ok", pid: process.pid })]);
    expect(pretty.loads).toBe(0);
  });

  it("takes BERTH_LOG_FORMAT (or --log-format) over the terminal's guess, either way", async () => {
    const format = (argv: string[], env: NodeJS.ProcessEnv) => loadConfig(commonServerConfig(), { argv, env }).values.logFormat;
    expect(format([], {})).toBeUndefined();
    expect(format([], { BERTH_LOG_FORMAT: "json" })).toBe("json");
    expect(format(["--log-format", "pretty"], { BERTH_LOG_FORMAT: "json" })).toBe("pretty");
    expect(() => format([], { BERTH_LOG_FORMAT: "fancy" })).toThrow(/BERTH_LOG_FORMAT.*must be one of json, pretty, got "fancy"/);

    expect(logFormatFor(undefined, { isTTY: true })).toBe("pretty");
    expect(logFormatFor(undefined, { isTTY: false })).toBe("json");
    expect(logFormatFor(undefined, {})).toBe("json");

    const onTerminal = fakeOutput(true);
    const pretty = countingLoader();
    const json = await createServiceLogger({ level: "info", format: "json", output: onTerminal.output, loadPretty: pretty.load });
    expect(json.format).toBe("json");
    json.logger.info("plain");
    expect(JSON.parse(await onTerminal.read(json.logger, json.format))).toMatchObject({ msg: "plain" });
    expect(pretty.loads).toBe(0);

    const piped = fakeOutput(false);
    const forced = await createServiceLogger({ level: "info", format: "pretty", output: piped.output, loadPretty: pretty.load });
    expect(forced.format).toBe("pretty");
    forced.logger.warn("readable");
    // Pretty in a pipe, but no colour escapes: colours are for a terminal.
    expect(await piped.read(forced.logger, forced.format)).toMatch(/^\[[\d:.]+\] WARN: readable\n$/);
    expect(pretty.loads).toBe(1);
  });
});
