/** `berth up`: both services in the foreground, in one process; Ctrl-C stops both. */
import { EXIT, type Command } from "../command.js";
import { renderHelp } from "../help.js";

const HELP = renderHelp({
  usage: ["berth up [flags]"],
  about:
    "Starts both services in this process, with their state in --state-dir (default ./.berth): sessions on " +
    "127.0.0.1:7301, budget on 127.0.0.1:7302. Every flag has a BERTH_* variable (listed below with its default); " +
    "a JSON file of settings may give the rest (--config). The log is on stdout, one line per RPC: readable on a terminal, " +
    "JSON lines (pino) otherwise (--log-format chooses). With --ui, the live page too (berth ui --help).",
  notes:
    "SIGINT (Ctrl-C) or SIGTERM stops both services gracefully: new calls are refused, open streams end, the " +
    "journals are flushed. A second signal exits at once.",
  exitCodes: [
    [String(EXIT.ok), "stopped by SIGINT or SIGTERM after a clean shutdown"],
    [String(EXIT.failed), "could not start (the state directory is in use by another service, a port is taken) or the shutdown failed"],
    [String(EXIT.usage), "unknown flag or a bad value"],
    ["130", "a second signal cut the shutdown short"],
  ],
  examples: [
    "berth up",
    "berth up --state-dir /var/lib/berth --sessions-port 0 --budget-port 0",
    "berth up --sessions-socket /run/user/1000/berth-sessions.sock --budget-socket /run/user/1000/berth-budget.sock",
    "BERTH_TOKEN_FILE=~/.config/berth/token berth up --log-level warn",
    "berth up --memory 8G --cpu 4 --max-queue 50",
    "berth up --ui    # and the live page at http://127.0.0.1:7300/",
  ],
});

/** `berth up`. */
export const upCommand: Command = {
  name: "up",
  help: HELP,
  // The flags are the services' settings: runServices lists them (after this help) and parses them.
  handlesHelp: true,
  async run(argv) {
    // Before the services are loaded: V8 reads some of these flags only until its first full collection.
    // biome-ignore lint/style/noRestrictedImports: `berth up` is the one command that is a daemon: it runs the services on the common server
    const { tuneHeapForDaemon } = await import("@berth/shared/server/heap-tuning");
    tuneHeapForDaemon();
    // Loaded here, not at the top: the other commands are clients and should start fast.
    const [{ sessionsService }, { budgetService }, { runServices }, { pageCompanion }] = await Promise.all([
      import("@berth/sessions/server/service"),
      import("@berth/budget/server/service"),
      // biome-ignore lint/style/noRestrictedImports: the common server the services run on in this process
      import("@berth/shared/server/index"),
      import("@berth/ui/page-companion"),
    ]);
    const servers = await runServices([sessionsService, budgetService], {
      argv,
      command: "berth up",
      usage: HELP,
      companion: pageCompanion,
      exit(code) {
        // A bad flag or value: say where the flags are, as every other command does.
        if (code === EXIT.usage) process.stderr.write("Run 'berth up --help' for its flags and examples.\n");
        process.exit(code);
      },
    });
    // Serving: the process now lives until a signal; the signal handlers decide the exit code.
    return servers ? "serving" : EXIT.failed;
  },
};
