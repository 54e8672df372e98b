/**
 * The budget service's pages under load (budget-requests.ts): its lists paged through while
 * entries are admitted, released and queued, none lost or repeated.
 * The service runs on a fixture machine (`--proc-root`), so nothing here depends on this box's
 * load.
 */
import { afterAll, describe, expect, it } from "vitest";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import { startBudget, until } from "./budget-e2e.js";
import type { NeedItemInit } from "./budget-requests.js";
import { stopAll } from "./harness.js";

afterAll(stopAll);

describe("budget service: pages under load", () => {
  /** A start of `cpu` cores and no memory: thousands of them fit the fixture's memory, the cpu budget decides. */
  const cores = (cpu: number): NeedItemInit => ({ kind: NeedItemKind.START, name: "w", costSource: { case: "cost", value: { memoryBytes: 0n, cpu } } });

  /**
   * Pages through a list with `list` while `churn` admits, drops and adds entries at the same time,
   * then checks: no entry appears twice, and every entry there from before the first page to after
   * the last (`stayed`) appears exactly once.
   */
  async function pageWhileChurning(
    list: (token: string) => Promise<{ names: string[]; next: string }>,
    churn: () => Promise<void>,
    present: () => Promise<Set<string>>,
  ) {
    const before = await present();
    let stop = false;
    const churning = (async () => {
      while (!stop) await churn();
    })();
    const seen: string[] = [];
    let pages = 0;
    let token = "";
    do {
      const page = await list(token);
      seen.push(...page.names);
      token = page.next;
      pages++;
    } while (token !== "");
    stop = true;
    await churning;
    const after = await present();
    const stayed = [...before].filter((name) => after.has(name));
    const counts = new Map<string, number>();
    for (const name of seen) counts.set(name, (counts.get(name) ?? 0) + 1);
    expect(
      [...counts].filter(([, n]) => n > 1),
      "entries repeated",
    ).toEqual([]);
    expect(
      stayed.filter((name) => !counts.has(name)),
      "entries lost",
    ).toEqual([]);
    expect(pages).toBeGreaterThan(10);
    return { seen, stayed };
  }

  it("ListReservations, ListRunning and ListQueue page through hundreds of entries while others are admitted, released and queued: none lost or repeated", async () => {
    /** Which entry the churn picks: spread over the list, the same in every run. */
    let picks = 0;
    const pick = (length: number) => (picks++ * 7919) % length;
    const budget = await startBudget({ args: ["--cpu=1000", "--max-queue=2000", "--lease-ttl=10m"] });
    const { client } = budget;
    let n = 0;

    // Reservations: 400, released and reserved afresh while paging 7 at a time.
    const reserved: string[] = [];
    for (let i = 0; i < 400; i++) reserved.push((await client.reserve({ owner: `r${n++}`, need: { items: [cores(1)] } })).reservation!.id);
    const names = async () => {
      const owners = new Set<string>();
      for (let token = "", first = true; first || token !== ""; first = false) {
        const page = await client.listReservations({ pageToken: token, pageSize: 1000 });
        for (const r of page.reservations) owners.add(r.owner);
        token = page.nextPageToken;
      }
      return owners;
    };
    const reservations = await pageWhileChurning(
      async (token) => {
        const page = await client.listReservations({ pageToken: token, pageSize: 7 });
        return { names: page.reservations.map((r) => r.owner), next: page.nextPageToken };
      },
      async () => {
        const gone = reserved.splice(pick(reserved.length), 1)[0]!;
        await client.release({ reservationId: gone });
        reserved.push((await client.reserve({ owner: `r${n++}`, need: { items: [cores(1)] } })).reservation!.id);
      },
      names,
    );
    expect(reservations.stayed.length).toBeGreaterThan(100);

    // The running tally: 400 entries, stopped and registered afresh while paging.
    const running: string[] = [];
    for (let i = 0; i < 400; i++)
      running.push((await client.registerRunning({ name: `s${n++}`, costSource: { case: "cost", value: { memoryBytes: 0n, cpu: 0 } } })).running!.id);
    const runningNames = async () => new Set((await client.listRunning({ pageSize: 1000 })).running.map((r) => r.name));
    await pageWhileChurning(
      async (token) => {
        const page = await client.listRunning({ pageToken: token, pageSize: 9 });
        return { names: page.running.map((r) => r.name), next: page.nextPageToken };
      },
      async () => {
        const gone = running.splice(pick(running.length), 1)[0]!;
        await client.stopRunning({ id: gone });
        running.push((await client.registerRunning({ name: `s${n++}`, costSource: { case: "cost", value: { memoryBytes: 0n, cpu: 0 } } })).running!.id);
      },
      runningNames,
    );

    // The queue: the cpu budget held but for what small holders release, 300 waiters; while paging,
    // a release admits the first waiter, a waiter's call ends, a newcomer joins.
    for (const id of reserved.splice(0)) await client.release({ reservationId: id });
    const small: string[] = [];
    await client.reserve({ owner: "holder", need: { items: [cores(1000 - 200)] } });
    for (let i = 0; i < 200; i++) small.push((await client.reserve({ owner: `small${i}`, need: { items: [cores(1)] } })).reservation!.id);
    const waiters = new Map<string, AbortController>();
    const waits: Array<Promise<unknown>> = [];
    const wait = (owner: string) => {
      const controller = new AbortController();
      waiters.set(owner, controller);
      waits.push(
        client.reserve({ owner, need: { items: [cores(1)] }, maxWait: { seconds: 600n, nanos: 0 } }, { signal: controller.signal }).catch(() => undefined),
      );
    };
    for (let i = 0; i < 300; i++) wait(`q${n++}`);
    expect(await until(async () => (await client.getState({ pageSize: 1 })).queueSize === 300, 30_000)).toBe(true);
    const queued = async () => {
      const owners = new Set<string>();
      for (let token = "", first = true; first || token !== ""; first = false) {
        const page = await client.listQueue({ pageToken: token, pageSize: 1000 });
        for (const q of page.queue) owners.add(q.owner);
        token = page.nextPageToken;
      }
      return owners;
    };
    let turn = 0;
    const queue = await pageWhileChurning(
      async (token) => {
        const page = await client.listQueue({ pageToken: token, pageSize: 5 });
        // Positions count from the first waiter as it is now: increasing within a page.
        const positions = page.queue.map((q) => q.position);
        expect(positions).toEqual([...positions].sort((a, b) => a - b));
        return { names: page.queue.map((q) => q.owner), next: page.nextPageToken };
      },
      async () => {
        switch (turn++ % 3) {
          case 0: {
            const id = small.pop();
            if (id !== undefined) await client.release({ reservationId: id });
            break;
          }
          case 1: {
            const [owner, controller] = [...waiters][pick(waiters.size)]!;
            waiters.delete(owner);
            controller.abort();
            break;
          }
          default:
            wait(`q${n++}`);
        }
        // Let the service see the change before the next one.
        await client.getState({ pageSize: 1 });
      },
      queued,
    );
    expect(queue.stayed.length).toBeGreaterThan(100);
    for (const controller of waiters.values()) controller.abort();
    await Promise.all(waits);
  }, 120_000);
});
