/**
 * Every property test of a run draws from one seed (vitest.config.ts sets `BERTH_FC_SEED`): the
 * same commit runs the same cases each time, so a CI failure reproduces, while each new commit
 * explores cases no earlier one tried. A failure's message names the seed; `BERTH_FC_SEED=N npm
 * test` replays it.
 */
import fc from "fast-check";

const seed = Number(process.env.BERTH_FC_SEED);
if (Number.isSafeInteger(seed)) fc.configureGlobal({ seed });
