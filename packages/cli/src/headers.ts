/**
 * The Fetch API's `Headers`, as much of it as the RPC runtime uses, for the bundled command only.
 *
 * Why: Node defines the global `Headers` lazily, and the first use loads all of undici (its fetch
 * implementation); Connect makes a `Headers` for every call, so a one-RPC command paid a sixth of
 * its start-up for a map of strings. The build (scripts/bundle.mjs) puts this class in place of
 * the global in the bundled code only; the global is left alone, and `@berth/client` used as a
 * library keeps Node's. `headers.test.ts` checks it against Node's own.
 */

type Init = Iterable<readonly [string, string]> | Record<string, string> | { forEach(f: (value: string, name: string) => void): void };

// RFC 9110 field names (tokens) and values (no NUL, CR or LF), as the Fetch standard checks them.
const NAME = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
const BAD_VALUE = /[\0\r\n]/;

function normalizeName(name: string): string {
  const text = String(name);
  if (!NAME.test(text)) throw new TypeError(`Headers: invalid header name '${text}'`);
  return text.toLowerCase();
}

function normalizeValue(value: string): string {
  // Leading and trailing HTTP whitespace (tab, space, CR, LF) is removed, as the standard says.
  const text = String(value).replace(/^[\t\n\r ]+|[\t\n\r ]+$/g, "");
  if (BAD_VALUE.test(text)) throw new TypeError(`Headers: invalid header value '${text}'`);
  return text;
}

export class Headers {
  // Each name (lower case) with its values in order; `get` joins them, as the standard does.
  readonly #fields = new Map<string, string[]>();

  constructor(init?: Init | null) {
    if (init === undefined || init === null) return;
    if (typeof (init as { forEach?: unknown }).forEach === "function" && !Array.isArray(init)) {
      (init as { forEach(f: (value: string, name: string) => void): void }).forEach((value, name) => this.append(name, value));
    } else if (typeof (init as Iterable<unknown>)[Symbol.iterator] === "function") {
      for (const pair of init as Iterable<readonly string[]>) {
        if (pair.length !== 2) throw new TypeError("Headers: each header of an init list is a [name, value] pair");
        this.append(pair[0]!, pair[1]!);
      }
    } else {
      for (const [name, value] of Object.entries(init as Record<string, string>)) this.append(name, value);
    }
  }

  append(name: string, value: string): void {
    const key = normalizeName(name);
    const text = normalizeValue(value);
    const values = this.#fields.get(key);
    if (values === undefined) this.#fields.set(key, [text]);
    else values.push(text);
  }

  set(name: string, value: string): void {
    this.#fields.set(normalizeName(name), [normalizeValue(value)]);
  }

  get(name: string): string | null {
    return this.#fields.get(normalizeName(name))?.join(", ") ?? null;
  }

  getSetCookie(): string[] {
    return [...(this.#fields.get("set-cookie") ?? [])];
  }

  has(name: string): boolean {
    return this.#fields.has(normalizeName(name));
  }

  delete(name: string): void {
    this.#fields.delete(normalizeName(name));
  }

  forEach(callback: (value: string, name: string, headers: Headers) => void, thisArg?: unknown): void {
    for (const [name, value] of this.entries()) callback.call(thisArg, value, name, this);
  }

  /** Sorted by name, a name's values joined, but `set-cookie`'s each on its own: the standard's order. */
  *entries(): IterableIterator<[string, string]> {
    for (const name of [...this.#fields.keys()].sort()) {
      const values = this.#fields.get(name)!;
      if (name === "set-cookie") for (const value of values) yield [name, value];
      else yield [name, values.join(", ")];
    }
  }

  *keys(): IterableIterator<string> {
    for (const [name] of this.entries()) yield name;
  }

  *values(): IterableIterator<string> {
    for (const [, value] of this.entries()) yield value;
  }

  [Symbol.iterator](): IterableIterator<[string, string]> {
    return this.entries();
  }

  get [Symbol.toStringTag](): string {
    return "Headers";
  }
}
