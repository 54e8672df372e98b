/** Starts the page: where the services are, the token, then the panels. */
import { render } from "preact";
import { App } from "./app.js";
import { initialToken, loadConfig } from "./settings.js";

const root = document.getElementById("app")!;
try {
  const config = await loadConfig();
  root.textContent = "";
  render(<App config={config} token={initialToken()} />, root);
} catch (error) {
  root.textContent = `berth's page could not start: ${error instanceof Error ? error.message : String(error)}`;
}
