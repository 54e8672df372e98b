/**
 * The etcd store's defaults the settings quote: apart from the store's code, which loads only
 * with `--store etcd`.
 */

/** The etcd lease TTL by default: how long after its instance stops renewing a lock frees. */
export const DEFAULT_ETCD_LEASE_TTL_SECONDS = 10;

/** etcd's default `--max-request-bytes` (1.5 MiB). */
export const ETCD_DEFAULT_MAX_REQUEST_BYTES = 1.5 * 1024 * 1024;
