/** The need of a budget command as the client's need items: a build item (when declared), then the start item. */
import { build, start, type NeedItemInit } from "@berth/client/budget";
import type { DeclaredNeed } from "./need-flags.js";

/** The items of `need`, for a thing called `name`. */
export function needItems(need: DeclaredNeed, name: string): NeedItemInit[] {
  return need.build === undefined ? [start(name, need.run)] : [build(name, need.build), start(name, need.run)];
}
