/**
 * What the protos say that the generated code does not carry: the comment of each message, field
 * and enum value, and each service's table of error reasons with what to do about each. Read from
 * `proto-docs.json`, which scripts/proto-docs.mjs generates from `proto/berth` (`npm run generate`;
 * proto-docs.test.ts fails when it is stale).
 */
import docs from "./proto-docs.json" with { type: "json" };

const COMMENTS: Readonly<Record<string, string>> = docs.comments;
const ERRORS: Readonly<Record<string, Readonly<Record<string, string>>>> = docs.errors;

/**
 * The comment of a proto element by its full name (`berth.sessions.v1.AgentPhaseEvent.phase`),
 * its lines joined into one paragraph. Throws for an element without one: a schema built from the
 * protos must not lose its descriptions silently when a name changes.
 */
export function protoComment(fullName: string): string {
  const text = COMMENTS[fullName];
  if (text === undefined) throw new Error(`proto-docs: no comment for ${fullName} (run npm run generate)`);
  return text.replace(/\s*\n\s*/g, " ");
}

/** What to do about `reason`, as the error table of the service of `domain` (`berth.locks`) says; undefined when it is not listed. */
export function errorAdvice(domain: string, reason: string): string | undefined {
  return ERRORS[domain]?.[reason];
}
