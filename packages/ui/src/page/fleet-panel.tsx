/**
 * The fleet, on etcd: every budget instance's machine as it last published it (GetFleet). The
 * fleet has no watch (each instance republishes with its samples), so the view is read again
 * every two seconds. Without etcd there is no fleet (the page's server says so in its config: the
 * page does not ask the service for a refusal).
 */
import type { FleetMachine } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { Berth } from "@berth/client/web";
import { useEffect, useState } from "preact/hooks";
import { useNow } from "./changes.js";
import { DataTable } from "./data-table.js";
import { follow, type LinkState } from "./follow.js";
import { ago, bytes, cores, msOf } from "./format.js";

const READ_EVERY_MS = 2000;

export function FleetPanel({ berth, fleet }: { readonly berth: Berth; readonly fleet: boolean }) {
  const [machines, setMachines] = useState<readonly FleetMachine[] | undefined>(undefined);
  const [link, setLink] = useState<LinkState>({ kind: "connecting" });
  const now = useNow();
  useEffect(() => {
    if (!fleet) return;
    const stop = new AbortController();
    void follow(
      async (context) => {
        while (!context.signal.aborted) {
          const answer = await berth.budget.rpc.getFleet({}, { signal: context.signal });
          setMachines(answer.machines);
          context.live();
          await new Promise((resolve) => setTimeout(resolve, READ_EVERY_MS));
        }
      },
      setLink,
      stop.signal,
    );
    return () => stop.abort();
  }, [berth, fleet]);

  if (!fleet || link.kind === "unavailable") {
    return (
      <section class="panel fleet" aria-labelledby="fleet-title" id="fleet">
        <h2 id="fleet-title">Fleet</h2>
        <p class="empty">One machine: the fleet view needs the budget on etcd (--store etcd).</p>
      </section>
    );
  }
  return (
    <section class="panel fleet" aria-labelledby="fleet-title" id="fleet">
      <h2 id="fleet-title">
        Fleet <span class="count">{machines?.length ?? 0}</span>
      </h2>
      {machines === undefined || machines.length === 0 ? (
        <p class="empty">{machines === undefined ? "Reading…" : "No instance has published yet."}</p>
      ) : (
        <DataTable
          caption="Budget instances of the fleet"
          columns={["Machine", "Host, pid", "Available", "Room", "Queue", "Reservations", "Running", "Published"]}
        >
          {machines.map((machine) => (
            <tr key={machine.machine}>
              <th scope="row">
                {machine.machine}
                {machine.enabled ? "" : " (disabled)"}
              </th>
              <td>
                {machine.hostname}, {machine.pid}
              </td>
              <td>{bytes(machine.sample?.availableBytes)}</td>
              <td>
                {bytes(machine.room?.memoryBytes)}, {cores(machine.room?.cpu ?? 0)} cpu{machine.cpuBusy ? " (cpu busy)" : ""}
              </td>
              <td class="number">{machine.queueLength}</td>
              <td class="number">{machine.reservationCount}</td>
              <td class="number">{machine.runningCount}</td>
              <td>{ago(msOf(machine.publishTime), now)}</td>
            </tr>
          ))}
        </DataTable>
      )}
    </section>
  );
}
