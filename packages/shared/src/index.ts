export * from "./errors.js";
export * from "./clock.js";
export * from "./files.js";
export * from "./safe-id.js";
export * from "./process-identity.js";
export * from "./units.js";
export * from "./election.js";
export * from "./config.js";
