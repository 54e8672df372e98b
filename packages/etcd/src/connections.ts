/**
 * One HTTP/2 connection per etcd member (see grpc-transport.ts), and which member the
 * client talks to now. Any member serves every request (followers forward writes to the leader),
 * so the client keeps to one until it fails, then moves to the next: a member that is down, cut
 * off from the quorum or stopped (HTTP/2 pings find one that is paused) is left for another.
 */
import { createClient, type Client } from "@connectrpc/connect";
import { Http2SessionManager } from "@connectrpc/connect-node";
import type { SecureClientSessionOptions } from "node:http2";
import { createEtcdTransport } from "./grpc-transport.js";
import { Auth, KV, Lease, Maintenance, Watch } from "./gen/etcd/etcdserver/etcdserverpb/rpc_pb.js";

/** TLS towards etcd (`https://` endpoints): Node's own options, passed through. */
export type EtcdTlsOptions = Pick<SecureClientSessionOptions, "ca" | "cert" | "key" | "servername" | "rejectUnauthorized" | "passphrase" | "pfx">;

export interface EtcdConnectionOptions {
  /** Client URLs of the members, `http://host:2379` or `https://…`. */
  readonly endpoints: readonly string[];
  readonly tls?: EtcdTlsOptions;
  /** etcd's user and password, when etcd has auth enabled. */
  readonly auth?: { readonly username: string; readonly password: string };
  /** HTTP/2 ping on every connection this often (default 5 s)… */
  readonly pingIntervalMs?: number;
  /** …and a connection whose ping is not answered this long is dropped (default 5 s). */
  readonly pingTimeoutMs?: number;
  /** Deadline of each unary call (default 5 s). */
  readonly requestTimeoutMs?: number;
}

/** One member's connection and the etcd services over it. */
export interface Endpoint {
  readonly url: string;
  readonly kv: Client<typeof KV>;
  readonly lease: Client<typeof Lease>;
  readonly watch: Client<typeof Watch>;
  readonly maintenance: Client<typeof Maintenance>;
  readonly auth: Client<typeof Auth>;
}

interface EndpointState extends Endpoint {
  readonly manager: Http2SessionManager;
}

export class Connections {
  readonly requestTimeoutMs: number;
  private readonly endpoints: EndpointState[];
  private index = 0;
  private token: Promise<string> | undefined;
  private closed = false;

  constructor(private readonly options: EtcdConnectionOptions) {
    if (options.endpoints.length === 0) throw new Error("etcd: at least one endpoint is needed");
    this.requestTimeoutMs = options.requestTimeoutMs ?? 5_000;
    this.endpoints = options.endpoints.map((url) => {
      const parsed = new URL(url);
      if (parsed.protocol !== "http:" && parsed.protocol !== "https:") throw new Error(`etcd endpoint ${url}: must be http:// or https://`);
      const manager = new Http2SessionManager(
        url,
        { pingIntervalMs: options.pingIntervalMs ?? 5_000, pingTimeoutMs: options.pingTimeoutMs ?? 5_000 },
        parsed.protocol === "https:" ? { ...options.tls } : {},
      );
      const transport = createEtcdTransport(url, manager);
      return {
        url,
        manager,
        kv: createClient(KV, transport),
        lease: createClient(Lease, transport),
        watch: createClient(Watch, transport),
        maintenance: createClient(Maintenance, transport),
        auth: createClient(Auth, transport),
      };
    });
  }

  /** The member to talk to now. */
  current(): Endpoint {
    if (this.closed) throw new Error("etcd client is closed");
    return this.endpoints[this.index]!;
  }

  /** How many members the client knows (how many to try before giving up). */
  get size(): number {
    return this.endpoints.length;
  }

  /** `endpoint` failed: later calls go to the next member (unless another call moved on already). */
  failed(endpoint: Endpoint): void {
    if (this.endpoints[this.index] === endpoint) this.index = (this.index + 1) % this.endpoints.length;
  }

  /** Headers every call carries: etcd's auth token when auth is configured. */
  async headers(endpoint: Endpoint): Promise<Record<string, string> | undefined> {
    const auth = this.options.auth;
    if (!auth) return undefined;
    this.token ??= endpoint.auth.authenticate({ name: auth.username, password: auth.password }, { timeoutMs: this.requestTimeoutMs }).then((r) => r.token);
    const pending = this.token;
    try {
      return { token: await pending };
    } catch (error) {
      if (this.token === pending) this.token = undefined;
      throw error;
    }
  }

  /** The token was refused (expired, or etcd restarted with simple tokens): the next call authenticates again. */
  dropToken(): void {
    this.token = undefined;
  }

  close(): void {
    this.closed = true;
    for (const endpoint of this.endpoints) endpoint.manager.abort();
  }
}
