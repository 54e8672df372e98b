/**
 * A time series of the machine as uPlot draws it: the last minutes, redrawn (setData) when a
 * sample arrives. The numbers beside it say the same in words; the canvas is hidden from
 * assistive technology.
 */
import { useEffect, useRef } from "preact/hooks";
import uPlot from "uplot";

export interface Series {
  readonly label: string;
  readonly values: readonly (number | null)[];
  readonly color: string;
}

interface MachineChartProps {
  readonly title: string;
  readonly times: readonly number[];
  readonly series: readonly Series[];
  readonly unit: string;
  /** The top of the y axis (100 for a percentage); undefined: fits the data. */
  readonly max?: number | undefined;
  readonly version: number;
}

const HEIGHT = 160;

export function MachineChart({ title, times, series, unit, max, version }: MachineChartProps) {
  const holder = useRef<HTMLDivElement>(null);
  const chart = useRef<uPlot | undefined>(undefined);
  const labels = series.map((s) => s.label).join("|");

  useEffect(() => {
    const element = holder.current;
    if (element === null) return;
    let made: (() => void) | undefined;
    // Made when the page has a moment: while it loads, the lists it waits for come first.
    const idle = requestIdleCallback(() => (made = makeChart(element)), { timeout: 1000 });
    return () => {
      cancelIdleCallback(idle);
      made?.();
    };
  }, [labels, unit, max]);

  function makeChart(element: HTMLDivElement): () => void {
    const plot = new uPlot(
      {
        width: Math.max(200, element.clientWidth),
        height: HEIGHT,
        legend: { show: true, live: false },
        cursor: { show: false },
        scales: { x: { time: true }, y: max === undefined ? { range: (_u, _min, dataMax) => [0, Math.max(1, dataMax * 1.1)] } : { range: [0, max] } },
        axes: [{}, { values: (_u, ticks) => ticks.map((tick) => `${Number(tick.toFixed(1))}${unit}`), size: 60 }],
        series: [{}, ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, spanGaps: false }))],
      },
      [times.map((ms) => ms / 1000), ...series.map((s) => s.values)] as unknown as uPlot.AlignedData,
      element,
    );
    chart.current = plot;
    const resize = new ResizeObserver(() => plot.setSize({ width: Math.max(200, element.clientWidth), height: HEIGHT }));
    resize.observe(element);
    return () => {
      resize.disconnect();
      plot.destroy();
      chart.current = undefined;
    };
  }

  useEffect(() => {
    chart.current?.setData([times.map((ms) => ms / 1000), ...series.map((s) => s.values)] as unknown as uPlot.AlignedData);
  }, [version, labels]);

  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <div ref={holder} aria-hidden="true" />
    </figure>
  );
}
