/**
 * A TCP proxy in front of a service whose connections a test can cut, as a network that drops
 * them would: both sockets destroyed at once, no HTTP/2 GOAWAY, no RST_STREAM, no cancel. The
 * service sees its streams end without a reason, the way a lost connection ends them.
 */
import * as net from "node:net";
import { onStopAll } from "./processes.js";

/** A proxy listening on loopback. */
export interface CuttableProxy {
  /** The proxy's URL (`http://127.0.0.1:PORT`): clients connect here instead of the service. */
  readonly url: string;
  /** Destroys every connection through the proxy now; new ones are still forwarded. */
  cut(): void;
  close(): Promise<void>;
}

/** A proxy to the TCP service at `targetUrl` (`http://host:port`). Closed by `stopAll` too. */
export async function cuttableProxy(targetUrl: string): Promise<CuttableProxy> {
  const target = new URL(targetUrl);
  const sockets = new Set<net.Socket>();
  const server = net.createServer((client) => {
    const upstream = net.connect({ host: target.hostname, port: Number(target.port) });
    for (const socket of [client, upstream]) {
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      socket.on("error", () => {});
    }
    client.pipe(upstream);
    upstream.pipe(client);
    client.once("close", () => upstream.destroy());
    upstream.once("close", () => client.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as net.AddressInfo;
  const cut = () => {
    for (const socket of sockets) socket.destroy();
  };
  const close = () =>
    new Promise<void>((resolve) => {
      cut();
      server.close(() => resolve());
    });
  onStopAll(close);
  return { url: `http://127.0.0.1:${port}`, cut, close };
}
