/** Elections in memory (a test double of elector.ts): one holder per scope and name within the process. */
import { ElectionHeldError, type ElectionClaim, type Elector } from "../elector.js";
import { selfIdentity } from "../process-identity.js";

export function createMemoryElector(): Elector {
  const held = new Map<string, ElectionClaim>();
  return {
    acquire(scope, name, options = {}) {
      const where = `memory:${scope}/${name}`;
      const holder = held.get(where);
      if (holder !== undefined) return Promise.reject(new ElectionHeldError(scope, where, holder));
      const claim: ElectionClaim = { ...selfIdentity(), at: new Date().toISOString(), service: options.service ?? name };
      held.set(where, claim);
      let holding = true;
      return Promise.resolve({
        claim,
        path: where,
        release() {
          if (!holding) return;
          holding = false;
          held.delete(where);
        },
      });
    },
  };
}
