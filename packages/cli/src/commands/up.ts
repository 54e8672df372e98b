/** `berth up`: both services in the foreground, in one process; Ctrl-C stops both. */
import type { Command } from "../command.js";

export const upCommand: Command = {
  name: "up",
  handlesHelp: true,
  usage: `berth up [flags]

Starts both services in this process, with state in --state-dir (default ./.berth):
sessions on 127.0.0.1:7301, budget on 127.0.0.1:7302. Every flag has a BERTH_* variable.

Examples:
  berth up
  berth up --state-dir /var/lib/berth --sessions-port 0 --budget-port 0
  BERTH_TOKEN_FILE=~/.config/berth/token berth up
  berth up --help        # every flag, its variable and its default`,
  async run(argv) {
    // Loaded here, not at the top: the other commands are clients and should start fast.
    const [{ sessionsService }, { budgetService }, { runServices }] = await Promise.all([
      import("@berth/sessions/server/service"),
      import("@berth/budget/server/service"),
      import("@berth/shared/server/index"),
    ]);
    const servers = await runServices([sessionsService, budgetService], { argv, command: "berth up", usage: upCommand.usage });
    // Serving: the process now lives until a signal; the signal handlers decide the exit code.
    return servers ? "serving" : 1;
  },
};
