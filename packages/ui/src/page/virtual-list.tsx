/**
 * A list that renders only the rows in view (a busy box has thousands of sessions or queued
 * requests): @tanstack/virtual-core's windowing, with rows of one fixed height.
 */
import { elementScroll, observeElementOffset, observeElementRect, Virtualizer } from "@tanstack/virtual-core";
import type { ComponentChildren } from "preact";
import { useLayoutEffect, useMemo, useRef, useState } from "preact/hooks";

interface VirtualListProps<T> {
  readonly items: readonly T[];
  readonly rowHeight: number;
  /** The list's height in px when it holds many rows (it shrinks to fit fewer). */
  readonly maxHeight: number;
  readonly label: string;
  readonly rowKey: (item: T) => string;
  readonly render: (item: T, index: number) => ComponentChildren;
}

export function VirtualList<T>({ items, rowHeight, maxHeight, label, rowKey, render }: VirtualListProps<T>) {
  const scroller = useRef<HTMLElement>(null);
  const [, setRenders] = useState(0);
  const rerender = () => setRenders((n) => n + 1);
  const virtualizer = useMemo(
    () =>
      new Virtualizer<HTMLElement, Element>({
        count: 0,
        getScrollElement: () => scroller.current,
        estimateSize: () => rowHeight,
        scrollToFn: elementScroll,
        observeElementRect,
        observeElementOffset,
        onChange: () => rerender(),
        overscan: 8,
        initialRect: { width: 0, height: maxHeight },
      }),
    [rowHeight, maxHeight],
  );
  virtualizer.setOptions({ ...virtualizer.options, count: items.length, getItemKey: (index) => rowKey(items[index]!) });
  useLayoutEffect(() => virtualizer._didMount(), [virtualizer]);
  useLayoutEffect(() => virtualizer._willUpdate());
  const height = Math.min(maxHeight, Math.max(rowHeight, items.length * rowHeight));
  return (
    // biome-ignore lint/a11y/noNoninteractiveTabindex: a scrolled region must be reachable by keyboard to be scrolled by it
    <section ref={scroller} class="virtual-list" style={{ height: `${height}px` }} tabIndex={0} aria-label={label}>
      <ul class="virtual-items" style={{ height: `${virtualizer.getTotalSize()}px` }} aria-label={label}>
        {virtualizer.getVirtualItems().map((row) => (
          <li
            key={row.key}
            aria-setsize={items.length}
            aria-posinset={row.index + 1}
            class="virtual-row"
            style={{ height: `${rowHeight}px`, transform: `translateY(${row.start}px)` }}
          >
            {render(items[row.index]!, row.index)}
          </li>
        ))}
      </ul>
    </section>
  );
}
