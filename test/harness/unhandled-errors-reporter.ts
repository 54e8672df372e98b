/**
 * A vitest reporter for CI: writes the run's unhandled errors (an error thrown or a promise rejected
 * after its test ended, a worker that failed to stop) to the file `BERTH_UNHANDLED_ERRORS_FILE`
 * names, one JSON line each. vitest fails such a run although every test passed, and its JSON report
 * does not list them, so without this the tail of a CI log would say "0 failed" beside a failed run.
 */
import { appendFileSync, writeFileSync } from "node:fs";
import type { Reporter, SerializedError, TestModule } from "vitest/node";

type Origin = { VITEST_TEST_PATH?: unknown; VITEST_TEST_NAME?: unknown; type?: unknown };

export default class UnhandledErrorsReporter implements Reporter {
  private readonly file = process.env.BERTH_UNHANDLED_ERRORS_FILE;

  onInit(): void {
    if (this.file) writeFileSync(this.file, "");
  }

  onTestRunEnd(_modules: ReadonlyArray<TestModule>, errors: ReadonlyArray<SerializedError>): void {
    if (!this.file) return;
    for (const error of errors) {
      const origin = error as SerializedError & Origin;
      const line = {
        type: typeof origin.type === "string" ? origin.type : "Unhandled Error",
        message: String(error.message ?? error).split("\n")[0],
        file: typeof origin.VITEST_TEST_PATH === "string" ? origin.VITEST_TEST_PATH : undefined,
        test: typeof origin.VITEST_TEST_NAME === "string" ? origin.VITEST_TEST_NAME : undefined,
        stack: String(error.stack ?? "")
          .split("\n")
          .slice(0, 6)
          .join("\n"),
      };
      appendFileSync(this.file, `${JSON.stringify(line)}\n`);
    }
  }
}
