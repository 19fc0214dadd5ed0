// The files a module of the package loads, read from its source by es-module-lexer (the lexer
// Vite uses), so that a path in a comment or a string never counts: static imports and
// re-exports (type-only ones too, in .d.ts files: a TypeScript user's compiler loads those),
// import() of a literal, and `new URL('<file>', import.meta.url)`, the way the package names
// its worker and the wasm-bindgen glue names its .wasm. A reference this reading cannot follow
// (import() of an expression, `new URL` of one) is an error rather than a silent pass.
import { init, parse } from 'es-module-lexer';
import { posix } from 'node:path';

await init();

/** `new URL('<literal>', ` right before an `import.meta` (then `.url`): group 2 is the literal. */
const NEW_URL_LITERAL = /new\s+URL\(\s*(['"])([^'"\\]+)\1\s*,\s*$/;
/** `new URL(<anything but a literal>, ` right before an `import.meta`. */
const NEW_URL_OTHER = /new\s+URL\(\s*[^,()]*,\s*$/;
/** How far back from `import.meta` a `new URL(` may start (one specifier and some spaces). */
const NEW_URL_REACH = 300;

/**
 * The references in `source` (the module at `path`, for messages), as
 * `{ specifier, kind }`: kind 'import' (static, re-export, literal import()) resolves as a module
 * specifier does; 'url' (`new URL(..., import.meta.url)`) as a relative URL.
 */
export function moduleReferences(source, path) {
  const [imports] = parse(source, path);
  const references = [];
  for (const entry of imports) {
    if (entry.type === 'import-meta') {
      if (!source.startsWith('.url', entry.end)) continue; // import.meta.env and the like
      const before = source.slice(Math.max(0, entry.importStart - NEW_URL_REACH), entry.importStart);
      const literal = NEW_URL_LITERAL.exec(before);
      if (literal) references.push({ specifier: literal[2], kind: 'url' });
      else if (NEW_URL_OTHER.test(before)) throw new Error(`${path}: a new URL(…, import.meta.url) of an expression, which this check cannot follow`);
      continue;
    }
    if (entry.specifier === undefined || (entry.type === 'dynamic' && entry.glob)) {
      throw new Error(`${path}: an import() of an expression (${source.slice(entry.importStart, entry.importEnd)}), which this check cannot follow`);
    }
    references.push({ specifier: entry.specifier, kind: 'import' });
  }
  return references;
}

/**
 * Where `reference` (from moduleReferences) of the module at package path `from` points:
 * `{ file }`, a path inside the package ('pkg/kestrel_wasm.js'); `{ dependency }`, a bare
 * module specifier's package name; or `{ outside }`, an absolute path, a URL with a scheme, or
 * a path that climbs out of the package.
 */
export function resolveReference(from, { specifier, kind }) {
  if (/^[a-z][a-z0-9+.-]*:/i.test(specifier) || specifier.startsWith('/')) return { outside: specifier };
  const relative = kind === 'url' || specifier.startsWith('./') || specifier.startsWith('../');
  if (!relative) {
    // '@scope/name/sub' and 'name/sub' name the packages '@scope/name' and 'name'.
    const parts = specifier.split('/');
    return { dependency: specifier.startsWith('@') ? parts.slice(0, 2).join('/') : parts[0] };
  }
  const file = posix.normalize(posix.join(posix.dirname(from), specifier.split(/[?#]/)[0]));
  return file.startsWith('../') ? { outside: specifier } : { file };
}
