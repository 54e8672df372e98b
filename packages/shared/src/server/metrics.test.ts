import { describe, expect, it } from "vitest";
import { ManualClock } from "../clock.js";
import { ServerMetrics, type GaugeSample } from "./metrics.js";

describe("ServerMetrics", () => {
  it("renders counters and a cumulative histogram per method", () => {
    const clock = new ManualClock(1_000_000);
    const metrics = new ServerMetrics("sessions", clock);
    metrics.recordRpc("/a.B/C", "ok", 0.0005);
    metrics.recordRpc("/a.B/C", "ok", 0.02);
    metrics.recordRpc("/a.B/C", "not_found", 100);
    clock.advance(2_500);
    // A step of the wall clock is no time spent serving.
    clock.stepWall(-3_600_000);
    const text = metrics.render();
    expect(text).toContain('berth_rpc_requests_total{method="/a.B/C",code="ok"} 2');
    expect(text).toContain('berth_rpc_requests_total{method="/a.B/C",code="not_found"} 1');
    expect(text).toContain('berth_rpc_duration_seconds_bucket{method="/a.B/C",le="0.001"} 1');
    expect(text).toContain('berth_rpc_duration_seconds_bucket{method="/a.B/C",le="0.025"} 2');
    expect(text).toContain('berth_rpc_duration_seconds_bucket{method="/a.B/C",le="60"} 2');
    expect(text).toContain('berth_rpc_duration_seconds_bucket{method="/a.B/C",le="+Inf"} 3');
    expect(text).toContain('berth_rpc_duration_seconds_count{method="/a.B/C"} 3');
    expect(text).toContain("berth_uptime_seconds 2.5");
    expect(text).toContain('berth_server_info{name="sessions"} 1');
    expect(text.endsWith("\n")).toBe(true);
    // Every sample line is `name{labels} value` or `name value`.
    for (const line of text.trim().split("\n")) {
      if (!line.startsWith("#")) expect(line).toMatch(/^[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})? (-?[0-9.e+-]+|NaN|[+-]Inf)$/);
    }
  });

  it("reads registered gauges at scrape time, escapes labels, skips a failing reader", () => {
    const metrics = new ServerMetrics("budget");
    let queued = 1;
    metrics.registerGauge("berth_budget_queue_length", "Requests waiting.", () => queued);
    metrics.registerGauge("berth_budget_gate", "Per gate.", (): GaugeSample[] => [
      { labels: { gate: 'me"m\\ory\n' }, value: Infinity },
      { labels: { gate: "cpu", "bad-name": "x" }, value: NaN },
    ]);
    const remove = metrics.registerGauge("berth_budget_broken", "Throws.", () => {
      throw new Error("boom");
    });
    queued = 7;
    const text = metrics.render();
    expect(text).toContain("# TYPE berth_budget_queue_length gauge\nberth_budget_queue_length 7");
    expect(text).toContain('berth_budget_gate{gate="me\\"m\\\\ory\\n"} +Inf');
    expect(text).toContain('berth_budget_gate{gate="cpu"} NaN');
    expect(text).not.toContain("berth_budget_broken");
    remove();
    expect(() => metrics.registerGauge("berth_budget_broken", "again", () => 0)).not.toThrow();
  });

  it("refuses invalid and duplicate names", () => {
    const metrics = new ServerMetrics("x");
    expect(() => metrics.registerGauge("bad-name", "", () => 0)).toThrow(/not a valid/);
    metrics.registerGauge("berth_x_one", "", () => 0);
    expect(() => metrics.registerGauge("berth_x_one", "", () => 0)).toThrow(/already/);
    expect(() => metrics.registerGauge("berth_rpc_requests_total", "", () => 0)).toThrow(/already/);
  });
});
