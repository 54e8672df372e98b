/**
 * The tool list as Markdown, from what the server answers `tools/list` (names, descriptions and
 * JSON Schemas): docs/agents.md carries it between markers, and a test renders it from the server
 * again and fails when the two differ.
 */

/** A tool as `tools/list` answers it. */
export interface ListedTool {
  readonly name: string;
  readonly title?: string | undefined;
  readonly description?: string | undefined;
  readonly inputSchema: JsonSchema;
}

/** The parts of a JSON Schema the list shows. */
export interface JsonSchema {
  readonly type?: string | string[];
  readonly description?: string;
  readonly properties?: Readonly<Record<string, JsonSchema>>;
  readonly required?: readonly string[];
  readonly items?: JsonSchema;
  readonly anyOf?: readonly JsonSchema[];
  readonly enum?: readonly unknown[];
  readonly const?: unknown;
  readonly pattern?: string;
  readonly minimum?: number;
  readonly maximum?: number;
  readonly minItems?: number;
  readonly additionalProperties?: unknown;
}

/** The Markdown of `tools`: one section per tool, its arguments in a table; the event types once, after them. */
export function renderToolList(tools: readonly ListedTool[]): string {
  const out: string[] = [];
  let events: JsonSchema | undefined;
  for (const tool of tools) {
    out.push(`### \`${tool.name}\`${tool.title === undefined ? "" : `: ${tool.title}`}`, "", tool.description ?? "", "");
    const properties = Object.entries(tool.inputSchema.properties ?? {});
    if (properties.length === 0) {
      out.push("No arguments.", "");
      continue;
    }
    const required = new Set(tool.inputSchema.required ?? []);
    out.push("| argument | type | | what |", "|---|---|---|---|");
    for (const [name, schema] of properties) {
      if (schema.items?.anyOf !== undefined) events ??= schema.items;
      out.push(`| \`${name}\` | ${typeOf(schema)} | ${required.has(name) ? "required" : ""} | ${cell(schema.description ?? "")} |`);
    }
    out.push("");
  }
  if (events?.anyOf !== undefined) {
    out.push("### Event types", "", "What `events` takes: an object with a `type` and that type's keys; any other key is kept as given.", "");
    out.push("| `type` | what it does | its typed keys |", "|---|---|---|");
    for (const variant of events.anyOf) {
      const type = variant.properties?.type;
      const keys = Object.entries(variant.properties ?? {})
        .filter(([key]) => key !== "type")
        .map(([key, schema]) => `\`${key}\` (${typeOf(schema)})`)
        .join(", ");
      const name = type?.const === undefined ? "any other" : `\`${String(type.const)}\``;
      out.push(`| ${name} | ${cell(variant.description ?? "")} | ${keys || "any"} |`);
    }
    out.push("");
  }
  return out.join("\n");
}

/** A schema's type in a few words. */
function typeOf(schema: JsonSchema): string {
  if (schema.enum !== undefined) return schema.enum.map((value) => `\`${JSON.stringify(value)}\``).join(" \\| ");
  if (schema.anyOf !== undefined) return "event";
  const type = Array.isArray(schema.type) ? schema.type.join(" or ") : (schema.type ?? "any JSON");
  if (type === "array") return schema.items?.anyOf !== undefined ? "array of events" : `array of ${typeOf(schema.items ?? {})}`;
  const bounds =
    schema.minimum !== undefined && schema.maximum !== undefined
      ? ` ${schema.minimum}–${schema.maximum}`
      : schema.minimum !== undefined
        ? ` ≥ ${schema.minimum}`
        : schema.maximum !== undefined
          ? ` ≤ ${schema.maximum}`
          : "";
  return `${type}${bounds}`;
}

function cell(text: string): string {
  return text.replace(/\|/g, "\\|").replace(/\s*\n\s*/g, " ");
}
