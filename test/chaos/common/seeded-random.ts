/** The reliability suites' one pseudo-random source: the shared one, so a suite and a benchmark draw alike. */
export { seededRandom } from "@berth/shared/testing/seeded-random";
