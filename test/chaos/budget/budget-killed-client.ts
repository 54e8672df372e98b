/**
 * A budget client that the budget chaos suite kills with SIGKILL, to model a client that vanishes
 * without closing anything: no Release, no stream end, only the kernel tearing its socket down.
 *
 * Usage: `node budget-killed-client.js URL LABEL MEMORY_BYTES CPU`
 *
 * It opens an Admit stream for one start of MEMORY_BYTES / CPU, and once admitted reports that start
 * as running under its own pid (`Started{pid: process.pid}`), so the running tally holds an entry
 * that must go when this process does. A full queue or an exhausted wait is retried after a short
 * pause. It prints one JSON line per step on stdout (`queued`, `admitted`, `started` with the
 * entry's id, `retrying`, `refused` with the code) and then holds the stream until it is killed. It exits by itself only when its parent goes (stdin closes) or after
 * two minutes, so a crashed suite leaves nothing behind.
 */
import { BudgetService } from "@berth/api/berth/budget/v1/budget_service_pb";
import type { AdmitRequestSchema } from "@berth/api/berth/budget/v1/budget_service_pb";
import { NeedItemKind } from "@berth/api/berth/budget/v1/budget_pb";
import type { MessageInitShape } from "@bufbuild/protobuf";
import { Code, ConnectError, createClient } from "@connectrpc/connect";
import { createGrpcTransport } from "@connectrpc/connect-node";

type AdmitRequestInit = MessageInitShape<typeof AdmitRequestSchema>;

const [url, label, memoryArg, cpuArg] = process.argv.slice(2);
if (url === undefined || label === undefined || memoryArg === undefined || cpuArg === undefined) {
  process.stderr.write("usage: budget-killed-client URL LABEL MEMORY_BYTES CPU\n");
  process.exit(2);
}
const cost = { memoryBytes: BigInt(memoryArg), cpu: Number(cpuArg) };

const say = (event: Record<string, unknown>) => process.stdout.write(`${JSON.stringify(event)}\n`);

// The requests the stream sends: the need now, Started once admitted; never ended by us.
const startRequest: AdmitRequestInit = {
  kind: { case: "start", value: { owner: label, need: { items: [{ kind: NeedItemKind.START, name: label, costSource: { case: "cost", value: cost } }] } } },
};
const pending: AdmitRequestInit[] = [startRequest];
let wake: (() => void) | undefined;
const send = (request: AdmitRequestInit) => {
  pending.push(request);
  wake?.();
};
async function* requests(): AsyncGenerator<AdmitRequestInit> {
  for (;;) {
    while (pending.length === 0) await new Promise<void>((resolve) => (wake = resolve));
    wake = undefined;
    yield pending.shift()!;
  }
}

process.stdin.on("end", () => process.exit(0));
process.stdin.resume();
setTimeout(() => process.exit(0), 120_000).unref();

const client = createClient(BudgetService, createGrpcTransport({ baseUrl: url }));
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
// A full queue or an exhausted wait is retried after a pause, as a client would: the point is to get
// into the queue or past it before the kill.
for (;;) {
  try {
    for await (const response of client.admit(requests())) {
      switch (response.kind.case) {
        case "queued":
          say({ event: "queued", position: response.kind.value.position });
          break;
        case "admitted":
          say({ event: "admitted", reservation: response.kind.value.reservation?.id });
          send({ kind: { case: "started", value: { name: label, costSource: { case: "cost", value: cost }, pid: process.pid } } });
          break;
        case "updated":
          say({ event: "started", running: response.kind.value.running?.id });
          break;
        default:
          break;
      }
    }
    say({ event: "ended" });
    break;
  } catch (error) {
    const failure = ConnectError.from(error);
    if (failure.code !== Code.ResourceExhausted) {
      say({ event: "refused", code: failure.code, message: failure.rawMessage });
      break;
    }
    say({ event: "retrying", message: failure.rawMessage });
    await sleep(500 + Math.random() * 1500);
    pending.length = 0;
    pending.push(startRequest);
  }
}
// Held until killed (or the parent goes): the point is to die without closing.
setInterval(() => {}, 60_000);
