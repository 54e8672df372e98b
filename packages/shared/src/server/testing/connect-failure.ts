import { ConnectError } from "@connectrpc/connect";

/** The ConnectError a call that must fail rejects with; a call that succeeds fails the test. */
export async function connectFailure(call: Promise<unknown>): Promise<ConnectError> {
  try {
    await call;
  } catch (error) {
    return ConnectError.from(error);
  }
  throw new Error("expected the call to fail, but it succeeded");
}
