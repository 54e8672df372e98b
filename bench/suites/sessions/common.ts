import * as fs from "node:fs";
import * as path from "node:path";
import { tmpdir } from "node:os";
import * as grpc from "@grpc/grpc-js";
import { grpcServiceClient, target } from "../../lib/grpc-clients.js";
import type { BenchServer } from "../../lib/server.js";

/** The suite's options: the flags of `npm run bench -- sessions` (parsed in sessions.ts). */
export interface Options {
  /** Length of each closed-loop measurement. */
  seconds: number;
  /** Length of the 100-watcher run. */
  watchSeconds: number;
  watchers: number;
  eventsPerSecond: number;
  /** The second, lower rate of the watcher figures. */
  lowEventsPerSecond: number;
  idleWatchers: number;
  only: Set<string> | undefined;
}

const SessionServiceClient = grpcServiceClient("berth/sessions/v1/session_service.proto", "berth.sessions.v1.SessionService");

export function sessionClient(url: string, options: grpc.ChannelOptions = {}): grpc.Client {
  return new SessionServiceClient(target(url), grpc.credentials.createInsecure(), options);
}

/** Wall-clock milliseconds with sub-millisecond resolution (bench process only). */
export function nowMs(): number {
  return performance.timeOrigin + performance.now();
}

/** A small event as a grpc-js request field (proto-loader's object form). */
export function phaseEvent(phase: string, at?: number) {
  return { agentPhase: { phase, durationMs: 12, ...(at !== undefined ? { at } : {}) } };
}

/**
 * A realistic cycle of journal events (as the seed's journal holds them) that keeps the snapshot's
 * size bounded however many times it repeats: no detector waivers, whose list only grows.
 */
function journalCycle(i: number): Array<Record<string, unknown>> {
  return [
    {
      type: "generate",
      pageUrl: "http://localhost:5173/pricing",
      count: 3,
      screenshotPath: `/tmp/shots/${i % 50}.png`,
      prompt: "calmer hero, more air",
      token: `lease-${i}`,
    },
    { type: "agent_phase", phase: "plan", durationMs: 850 },
    { type: "variant_plan", plan: { variants: ["muted", "bold", "split"] } },
    { type: "agent_phase", phase: "generate", at: 1740823202500 + i, durationMs: 4100 },
    { type: "checkpoint", reason: "variants_progress", revision: 2 * i + 1, arrivedVariants: 1, phase: "generating" },
    { type: "variants_ready", file: "src/pages/Pricing.tsx", previewFile: ".impeccable/preview.html", previewMode: "iframe", arrivedVariants: 3 },
    { type: "variant_mounted", variant: 1 },
    { type: "variant_mounted", variant: 2 },
    { type: "checkpoint", owner: "tab-a", revision: 2 * i + 2, visibleVariant: 2, paramValues: { hue: i % 7, mode: "dark" } },
    { type: "agent_done", durationMs: 5200 },
  ];
}

export function journalEvents(count: number): Array<Record<string, unknown>> {
  const out: Array<Record<string, unknown>> = [];
  for (let i = 0; out.length < count; i++) out.push(...journalCycle(i));
  return out.slice(0, count);
}

export function median(values: number[]): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.floor((sorted.length - 1) / 2)] ?? NaN;
}

export function round(value: number, digits = 3): number {
  const f = 10 ** digits;
  return Math.round(value * f) / f;
}

export function tempDir(name: string): string {
  return fs.mkdtempSync(path.join(tmpdir(), `berth-bench-${name}-`));
}

/** Server CPU (ms) used while `work` runs. */
export async function withServerCpu<T>(server: BenchServer, work: () => Promise<T>): Promise<{ result: T; cpuMs: number }> {
  const before = server.cpuMs();
  const result = await work();
  return { result, cpuMs: server.cpuMs() - before };
}
