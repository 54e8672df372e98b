/**
 * A Node built-in module loaded when one of its members is first used, for the bundled command.
 *
 * Why: Connect's Node transports import `node:http2` and `node:https` at the top, and loading them
 * (with TLS and crypto behind https) is a tenth of a one-RPC command's start-up, though a command
 * that calls over plain HTTP/1.1 never uses either. The build (scripts/bundle.mjs) puts this in
 * place of those two namespace imports in Connect's code only; every use there is a member read
 * inside a function (`http2.connect(…)`, `https.request(…)`), which this forwards.
 */
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

/** The namespace of the built-in `name` (`node:http2`), loaded on the first read of a member. */
export function lazyBuiltin<T extends object>(name: string): T {
  let loaded: T | undefined;
  const load = (): T => (loaded ??= require(name) as T);
  return new Proxy(Object.create(null) as T, {
    get: (_, key) => Reflect.get(load(), key),
    has: (_, key) => Reflect.has(load(), key),
    ownKeys: () => Reflect.ownKeys(load()),
    getOwnPropertyDescriptor: (_, key) => {
      const descriptor = Reflect.getOwnPropertyDescriptor(load(), key);
      // A proxy may only report configurable properties its (empty) target lacks.
      return descriptor === undefined ? undefined : { ...descriptor, configurable: true };
    },
  });
}
