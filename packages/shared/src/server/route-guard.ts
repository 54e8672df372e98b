/**
 * What every RPC route does around Connect's handler, on every protocol:
 *
 * - the bearer token is checked before the body is read, so a caller without it is refused
 *   UNAUTHENTICATED (TOKEN_MISSING, TOKEN_INVALID) whatever it sent, and learns nothing of the
 *   schema from decode errors;
 * - a body Connect stops reading early is read on to the end of what the client is still sending
 *   before the answer goes out (`request-drain.ts`), so that the client sees the answer;
 * - the errors Connect writes itself, before any interceptor runs (a unary request that does not
 *   decode, a message over the limit, an unknown encoding), are completed like every other error:
 *   berth's code and ErrorInfo reason (`request-errors.ts`), written again in the same framing
 *   (`wire-forms.ts`).
 *
 * A request whose content type names no protocol berth speaks is left to Connect (HTTP 415).
 */
import type { ConnectError } from "@connectrpc/connect";
import { codeToString } from "@connectrpc/connect/protocol-connect";
import type { UniversalHandler, UniversalServerRequest, UniversalServerResponse } from "@connectrpc/connect/protocol";
import type { Logger } from "../logger.js";
import { createTokenCheck, UNAUTHENTICATED_SERVICES } from "./auth.js";
import { berthErrorToConnect, errorDomainOf, toConnectError } from "./connect-errors.js";
import { callStateKey } from "./logging.js";
import { drainingBody } from "./request-drain.js";
import { malformedRequest } from "./request-errors.js";
import { completeErrors, errorResponse, wireFormatOf } from "./wire-forms.js";

export interface RouteGuardOptions {
  /** When set, every service but health needs `authorization: Bearer <token>`. */
  readonly token?: string;
  readonly logger?: Logger;
}

function isByteStream(body: UniversalServerRequest["body"]): body is AsyncIterable<Uint8Array> {
  return typeof body === "object" && body !== null && Symbol.asyncIterator in body;
}

/** Returns a factory that guards each route of a router (see the module's comment). */
export function createRouteGuard(options: RouteGuardOptions): (handler: UniversalHandler) => UniversalHandler {
  const checkToken = options.token === undefined ? undefined : createTokenCheck(options.token);
  return (handler) => {
    const kind = handler.method.methodKind;
    const singleRequest = kind === "unary" || kind === "server_streaming";
    const domain = errorDomainOf(handler.requestPath);
    const tokenCheck = UNAUTHENTICATED_SERVICES.has(handler.service.typeName) ? undefined : checkToken;

    const guarded = async (request: UniversalServerRequest): Promise<UniversalServerResponse> => {
      const format = wireFormatOf(request, kind !== "unary");
      if (format === undefined) return handler(request);
      // The code an error answered here goes out with, for the log line of a call no interceptor saw.
      const state = request.contextValues?.get(callStateKey);
      const refused = (error: ConnectError): ConnectError => {
        if (state !== undefined) state.refusedWith = codeToString(error.code);
        return error;
      };
      const complete = (error: ConnectError) => refused(toConnectError(error, options.logger, handler.requestPath));
      const body = isByteStream(request.body) ? drainingBody(request.body, { wholeBody: singleRequest }) : undefined;
      const refusal = tokenCheck?.(request.header.get("authorization"));
      if (refusal !== undefined) {
        await body?.settle();
        return errorResponse(format, refused(berthErrorToConnect(refusal, domain)));
      }
      let response: UniversalServerResponse;
      try {
        response = await handler(body === undefined ? request : { ...request, body: body.body });
      } catch (error) {
        // Connect percent-encodes a gRPC message with encodeURIComponent, which throws on a lone
        // surrogate: a JSON request holding one in a field of the wrong type is quoted in its
        // decode error, and Connect fails to write it. Only a decode error, before any interceptor
        // (later ones are cleaned by the error interceptor), can fail so.
        if (!(error instanceof URIError)) throw error;
        response = errorResponse(format, refused(berthErrorToConnect(malformedRequest("a JSON string in it is not valid Unicode"), domain)));
      }
      // A refusal that came before the body was read (its declared length over the limit).
      if (singleRequest) await body?.settle();
      return completeErrors(response, format, complete);
    };
    return Object.assign(guarded, {
      protocolNames: handler.protocolNames,
      service: handler.service,
      method: handler.method,
      requestPath: handler.requestPath,
      allowedMethods: handler.allowedMethods,
      supportedContentType: handler.supportedContentType,
    });
  };
}
