import { BerthError } from "../errors.js";

/** The BerthError `promise` rejects with; anything else it does (resolving, another error) fails the test. */
export async function berthRefusal(promise: Promise<unknown>): Promise<BerthError> {
  try {
    await promise;
  } catch (error) {
    if (error instanceof BerthError) return error;
    throw error;
  }
  throw new Error("expected a refusal (a BerthError), but the call succeeded");
}
