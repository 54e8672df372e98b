/** How a relative lock path and the directory it is relative to make the path sent, on every platform. */

/** `file` under `cwd` (`file` itself when absolute): joined, not normalised, as `absoluteLockPath` says why. */
export function joinLockPath(file: string, cwd: string): string {
  if (file.startsWith("/")) return file;
  return cwd.endsWith("/") ? `${cwd}${file}` : `${cwd}/${file}`;
}
