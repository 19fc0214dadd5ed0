// Where things are, from this package's folder.
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(fileURLToPath(new URL('..', import.meta.url)));
export const RESULTS = resolve(ROOT, 'bench/results');
// Where cargo put the CLI: $CARGO_TARGET_DIR (relative to the repository root, as cargo takes it
// when run there), else target/.
export const KESTREL = resolve(ROOT, process.env.CARGO_TARGET_DIR ?? 'target', 'release/kestrel');
