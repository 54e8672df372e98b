/**
 * Paging through the lists the budget keeps in arrival order (the queue, the reservations, the
 * running tally). Each item has a number that follows arrival, so a page picks up where the last
 * ended whoever left meanwhile: nobody is repeated, and a newcomer appears on a later page.
 */

/** One page of a list kept in arrival order. */
export interface Page<T> {
  items: T[];
  /** The number of the page's last item when more follow (where the next page starts); undefined on the last page. */
  next?: number | undefined;
}

/**
 * Up to `limit` of `source` (in arrival order) numbered after `after` (from the first when
 * undefined), each as `view` shows it.
 */
export function pageAfter<S, T>(
  source: Iterable<S>,
  seqOf: (item: S) => number,
  view: (item: S, seq: number) => T,
  after: number | undefined,
  limit: number,
): Page<T> {
  const items: T[] = [];
  let lastSeq: number | undefined;
  for (const item of source) {
    const seq = seqOf(item);
    if (after !== undefined && seq <= after) continue;
    if (items.length >= limit) return { items, next: lastSeq };
    items.push(view(item, seq));
    lastSeq = seq;
  }
  return { items };
}
