/**
 * The browser side of a tool on berth: a page that follows one session and talks back to the agent.
 *
 * - It watches the session live (backlog, `caughtUp`, then each entry as it is appended) and renders
 *   what the agent published: its phase (`agent_phase`), the variants it made (`agent_done`), its
 *   error (`agent_error`), from the snapshot each entry produced.
 * - It keeps the last seq it rendered, and the lines it rendered, in localStorage per service and
 *   session: after a reload it shows them again and watches from the next seq, not from the start.
 * - It sends `checkpoint`s (what it shows: the phase, the variants, the visible one, under a revision
 *   one past the session's), each with an idempotency key kept until the service confirms it, so a
 *   click that retries a checkpoint whose answer was lost is not written twice.
 * - When the watch ends (the service restarted, the network went away) it shows it and watches again
 *   from the next seq, waiting longer after each failure, without a reload.
 *
 * The token comes from the URL's fragment (`#token=…`, which the browser never sends to a server) or
 * the form, and is kept for the tab only; the session and the service's URL from the query
 * (`?session=demo&sessions=http://…`).
 */
import { Code } from "@connectrpc/connect";
import {
  BerthClientError,
  eventToJournal,
  followAcrossRestarts,
  newRequestId,
  pageOwner,
  SessionsClient,
  tokenRefused,
  type JournalEvent,
  type SessionWatchEvent,
} from "@berth/client/web";

type Entry = Extract<SessionWatchEvent, { kind: "entry" }>["entry"];
type Snapshot = NonNullable<Extract<SessionWatchEvent, { kind: "caughtUp" }>["snapshot"]>;

/** What the page keeps of a session across reloads: the last seq it rendered and its lines up to it. */
interface Kept {
  lastSeq: string;
  lines: { seq: string; text: string }[];
}

/** How many journal lines the page keeps (and shows). */
const KEPT_LINES = 200;
/** The longest wait between two attempts to watch again. */
const MAX_RECONNECT_DELAY_MS = 5_000;
/** Where the tab keeps its token (sessionStorage). */
const TOKEN_KEY = "berth-example:token";

const element = <T extends HTMLElement>(id: string) => document.getElementById(id) as T;
const form = element<HTMLFormElement>("open");
const connection = element("connection");
const phase = element("phase");
const variants = element("variants");
const agentError = element("agent-error");
const checkpointButton = element<HTMLButtonElement>("checkpoint");
const checkpointStatus = element("checkpoint-status");
const log = element<HTMLOListElement>("log");

/** The session the page follows; replaced when the form opens another. */
let current: { readonly sessions: SessionsClient; readonly sessionId: string; readonly storageKey: string; readonly stop: AbortController } | undefined;
let kept: Kept = { lastSeq: "0", lines: [] };
let snapshot: Snapshot | undefined;
let visibleVariant: number | undefined;
/** The checkpoint sent and not yet confirmed: sent again as it is, under the same key. */
let pending: { readonly event: JournalEvent; readonly idempotencyKey: string } | undefined;

/** Who sends the checkpoints: this tab, the same across its reloads. */
const owner = `${pageOwner()} #${tabId()}`;

function tabId(): string {
  let id = sessionStorage.getItem("berth-example:tab");
  if (id === null) sessionStorage.setItem("berth-example:tab", (id = newRequestId().slice(0, 8)));
  return id;
}

function open(sessionsUrl: string, sessionId: string, token: string): void {
  current?.stop.abort();
  current = undefined;
  // The sessions client alone: a page that needs no locks or budget leaves their code out of its bundle.
  let sessions: SessionsClient;
  try {
    sessions = new SessionsClient({ url: sessionsUrl || undefined, token: token || undefined });
  } catch (error) {
    showConnection("stopped", `stopped: ${(error as Error).message}`); // a URL a page cannot call
    return;
  }
  const storageKey = `berth-example:${sessions.endpoint?.url}:${sessionId}`;
  current = { sessions, sessionId, storageKey, stop: new AbortController() };
  kept = readKept(storageKey);
  snapshot = undefined;
  visibleVariant = undefined;
  pending = undefined;
  log.replaceChildren(...kept.lines.map(lineElement));
  renderSnapshot();
  void follow(current);
}

/** Watches the session from the seq after the last one kept, again after every failure, until stopped. */
function follow(session: NonNullable<typeof current>): Promise<void> {
  return followAcrossRestarts(
    async ({ signal, live }) => {
      // Not the journal this page saw (the service's state was replaced): start again from its first entry, at once.
      while ((await watchFromKept(session, signal, live)) === "replaced") forget(session);
    },
    {
      signal: session.stop.signal,
      // After a failure, longer each time: 0.25 s, 0.5 s, 1 s… up to 5 s.
      maxDelayMs: MAX_RECONNECT_DELAY_MS,
      isFinal: finalRefusal,
      onState(state) {
        if (state.kind === "retrying") {
          showConnection("reconnecting", `reconnecting in ${(state.delayMs / 1000).toFixed(1)} s: ${state.error?.message ?? "the service ended the watch"}`);
        } else if (state.kind === "stopped") {
          if (state.error.reason === "SESSION_DELETED") forget(session);
          showConnection("stopped", `stopped: ${state.error.message}`);
        }
      },
    },
  );
}

/**
 * One watch of the session, from the seq after the last one kept, to its end; `replaced` at once
 * when the session ends before the seq this page saw.
 */
async function watchFromKept(session: NonNullable<typeof current>, signal: AbortSignal, live: () => void): Promise<"ended" | "replaced"> {
  const { sessions, sessionId } = session;
  const fromSeq = BigInt(kept.lastSeq) + 1n;
  showConnection("connecting", `connecting to ${sessionId} from seq ${fromSeq}…`);
  for await (const event of sessions.watch(sessionId, { fromSeq, includeSnapshot: true, signal })) {
    if (event.kind === "entry") {
      render(event.entry, event.snapshot);
    } else if (event.kind === "caughtUp") {
      if (event.lastSeq < fromSeq - 1n) return "replaced";
      if (event.snapshot !== undefined) renderSnapshot(event.snapshot);
      showConnection("live", `live: watching ${sessionId} from seq ${fromSeq}, caught up at seq ${event.lastSeq}`);
      live();
    }
  }
  return "ended";
}

/** A refusal that watching again cannot change: a wrong token or session id, a deleted session. */
function finalRefusal(error: BerthClientError): boolean {
  return tokenRefused(error) || [Code.InvalidArgument, Code.NotFound].includes(error.code);
}

function render(entry: Entry, after: Snapshot | undefined): void {
  // A watch resumed from the kept seq sends nothing older, but a page must never show a line twice.
  if (entry.seq <= BigInt(kept.lastSeq)) return;
  const line = { seq: String(entry.seq), text: describe(entry) };
  kept.lastSeq = line.seq;
  kept.lines = [...kept.lines, line].slice(-KEPT_LINES);
  if (current !== undefined) localStorage.setItem(current.storageKey, JSON.stringify(kept));
  log.append(lineElement(line));
  while (log.children.length > KEPT_LINES) log.firstElementChild?.remove();
  if (after !== undefined) renderSnapshot(after);
}

/** One journal line as a person reads it: what the agent published, or what a page reported. */
function describe(entry: Entry): string {
  const event = entry.event === undefined ? { type: entry.type } : eventToJournal(entry.event);
  const text = (key: string) => (event[key] === undefined ? "" : String(event[key]));
  switch (entry.type) {
    case "agent_phase":
      return `agent: ${text("phase")}${event.durationMs === undefined ? "" : ` (${text("durationMs")} ms)`}`;
    case "agent_done":
      return `agent done: ${text("arrivedVariants") || "?"} variants${event.previewFile === undefined ? "" : ` in ${text("previewFile")}`}`;
    case "agent_error":
      return `agent error: ${text("message") || "unknown agent error"}`;
    case "checkpoint":
      return `checkpoint ${text("revision")}: variant ${text("visibleVariant") || "none"} shown by ${text("owner")}`;
    default:
      return entry.type;
  }
}

function lineElement({ seq, text }: { seq: string; text: string }): HTMLLIElement {
  const item = document.createElement("li");
  item.dataset.seq = seq;
  item.textContent = `#${seq} ${text}`;
  return item;
}

/** The agent's state as the snapshot says: phase, variants (one button each: showing one reports it), error. */
function renderSnapshot(next?: Snapshot): void {
  snapshot = next;
  const s = snapshot;
  phase.textContent =
    s === undefined
      ? "nothing published yet"
      : `phase ${s.phase}${s.generationPhase === undefined ? "" : `, agent ${s.generationPhase}`}, variants ${s.arrivedVariants}${s.expectedVariants > 0 ? ` of ${s.expectedVariants}` : ""}`;
  // The page's own choice wins until its checkpoint lands; the session's, until the page makes one.
  if (visibleVariant === undefined && s?.visibleVariant !== undefined) visibleVariant = s.visibleVariant;
  const labels = Array.from({ length: s?.arrivedVariants ?? 0 }, (_, i) => `Variant ${i + 1}${s?.previewFile === undefined ? "" : ` of ${s.previewFile}`}`);
  // Made again only when they change, so that the button a keyboard is on keeps its focus.
  if (labels.join("\n") !== [...variants.children].map((button) => button.textContent).join("\n")) {
    variants.replaceChildren(
      ...labels.map((label, i) => {
        const button = document.createElement("button");
        button.type = "button";
        button.textContent = label;
        button.addEventListener("click", () => {
          visibleVariant = i + 1;
          renderSnapshot(snapshot);
          pending = undefined; // a new view to report, not a retry of the last one
          void checkpoint();
        });
        return button;
      }),
    );
  }
  for (const [i, button] of [...variants.children].entries()) button.setAttribute("aria-pressed", String(visibleVariant === i + 1));
  const failure = s?.phase === "agent_error" ? s.diagnostics.findLast((d) => d.error === "agent_error") : undefined;
  agentError.hidden = failure === undefined;
  agentError.textContent = failure === undefined ? "" : `agent error: ${String(failure.fields?.message ?? "unknown agent error")}`;
}

/**
 * Reports what the page shows. The pending checkpoint, if one was sent without an answer, is sent
 * again as it was, under its key: the service writes it once and answers a repeat with the first seq.
 */
async function checkpoint(): Promise<void> {
  if (current === undefined) return;
  pending ??= { event: checkpointEvent(), idempotencyKey: newRequestId() };
  const sending = pending;
  checkpointStatus.textContent = `sending checkpoint ${sending.event.revision}…`;
  try {
    const { seq, duplicate } = await current.sessions.append(current.sessionId, sending.event, { idempotencyKey: sending.idempotencyKey });
    if (pending === sending) pending = undefined;
    checkpointStatus.textContent = `checkpoint ${sending.event.revision} saved as #${seq}${duplicate ? " (a repeat: saved once)" : ""}`;
  } catch (error) {
    const { message } = BerthClientError.from(error);
    checkpointStatus.textContent = `checkpoint ${sending.event.revision} not confirmed (${message}): Send checkpoint sends it again, saved once`;
  }
}

/** The page's view as the reference's page reports it, one revision past the last browser checkpoint the session applied. */
function checkpointEvent(): JournalEvent {
  const revision = Number(snapshot?.browserCheckpointRevision ?? 0n) + 1;
  return {
    type: "checkpoint",
    owner,
    revision,
    ...(snapshot === undefined ? {} : { phase: snapshot.phase, arrivedVariants: snapshot.arrivedVariants }),
    ...(visibleVariant === undefined ? {} : { visibleVariant }),
  };
}

function showConnection(state: "connecting" | "live" | "reconnecting" | "stopped", text: string): void {
  connection.dataset.state = state;
  connection.textContent = text;
}

function readKept(storageKey: string): Kept {
  try {
    const parsed = JSON.parse(localStorage.getItem(storageKey) ?? "null") as Kept | null;
    if (parsed !== null && /^\d+$/.test(parsed.lastSeq) && Array.isArray(parsed.lines)) return parsed;
  } catch {
    // Not what this page wrote: start over.
  }
  return { lastSeq: "0", lines: [] };
}

function forget(session: NonNullable<typeof current>): void {
  localStorage.removeItem(session.storageKey);
  kept = { lastSeq: "0", lines: [] };
  log.replaceChildren();
}

form.addEventListener("submit", (event) => {
  event.preventDefault();
  const fields = new FormData(form);
  const [sessionsUrl, sessionId, token] = ["sessions", "session", "token"].map((name) => String(fields.get(name) ?? "").trim()) as [string, string, string];
  sessionStorage.setItem(TOKEN_KEY, token);
  const query = new URLSearchParams({ session: sessionId, ...(sessionsUrl === "" ? {} : { sessions: sessionsUrl }) });
  history.replaceState(null, "", `?${query}`);
  open(sessionsUrl, sessionId, token);
});
checkpointButton.addEventListener("click", () => void checkpoint());

// The token stays in this tab (sessionStorage, for its reloads), out of the address: a query string
// reaches servers and their logs, and an address is copied, shared and kept in the history.
const query = new URLSearchParams(location.search);
const fromFragment = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromFragment !== null) {
  sessionStorage.setItem(TOKEN_KEY, fromFragment);
  history.replaceState(null, "", location.pathname + location.search);
}
if (query.has("token"))
  showConnection("stopped", "a token in the query string is not used (it reaches servers and their logs): give it as #token=… or in the form");
const given = { sessions: query.get("sessions") ?? "", session: query.get("session") ?? "", token: sessionStorage.getItem(TOKEN_KEY) ?? "" };
for (const [name, value] of Object.entries(given)) (form.elements.namedItem(name) as HTMLInputElement).value = value;
if (given.session !== "" && !query.has("token")) open(given.sessions, given.session, given.token);
