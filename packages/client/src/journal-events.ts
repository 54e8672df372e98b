/**
 * The journal event codec, as the client offers it: the sessions service encodes its journal with
 * the same module (`@berth/wire/journal-events`), so what a client appends is what the journal holds.
 */
export {
  appendableEvent,
  eventToJournal,
  InvalidEventError,
  isTypedEventType,
  journalToEvent,
  KIND_RULES,
  MAX_OTHER_TYPE_LENGTH,
  TYPED_EVENT_TYPES,
  typedEventShapes,
  type FieldKind,
  type TypedEventShape,
} from "@berth/wire/journal-events";
