// Where things are, from this package's folder.
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(fileURLToPath(new URL('..', import.meta.url)));
export const RESULTS = resolve(ROOT, 'bench/results');
// The CLI: $KESTREL_BIN (`./build.sh test`'s smoke passes the dev build), else the release build
// where cargo put it: $CARGO_TARGET_DIR (relative to the repository root, as cargo takes it when
// run there), else target/.
export const KESTREL = process.env.KESTREL_BIN
  ? resolve(process.env.KESTREL_BIN)
  : resolve(ROOT, process.env.CARGO_TARGET_DIR ?? 'target', 'release/kestrel');
