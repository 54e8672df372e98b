/** A table of rows with a caption for assistive technology and a header row of column names. */
import type { ComponentChildren } from "preact";

export function DataTable({
  caption,
  columns,
  children,
}: {
  readonly caption: string;
  readonly columns: readonly string[];
  readonly children: ComponentChildren;
}) {
  return (
    <table>
      <caption class="visually-hidden">{caption}</caption>
      <thead>
        <tr>
          {columns.map((column) => (
            <th key={column} scope="col">
              {column}
            </th>
          ))}
        </tr>
      </thead>
      <tbody>{children}</tbody>
    </table>
  );
}
