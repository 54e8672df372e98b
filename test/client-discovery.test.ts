/**
 * The discovery table (docs/clients.md) as the berth command resolves it: the cases every other
 * client's test checks that client against (python.test.ts, go.test.ts) are the CLI's behaviour.
 */
import { afterAll, describe, it } from "vitest";
import { cliResolution, discoveryCases, expectResolutions } from "./discovery.js";
import { makeTempDir, stopAll } from "./harness.js";

describe("finding the services: the berth command", () => {
  afterAll(stopAll);

  it("resolves every row of the table (URL, socket, host and port, defaults; token, token files)", () => {
    // The berth command takes no explicit token (a token file only): those rows are the others'.
    const cases = discoveryCases(makeTempDir("berth-discovery-")).filter((c) => c.token === undefined);
    expectResolutions(cases, cases.map(cliResolution));
  });
});
