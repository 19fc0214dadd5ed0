// The part of DOMPurify that markdown.js uses, for the type-check (www/tsconfig.pages.json sends
// 'dompurify' here): the package is installed into demo/node_modules only by ./build.sh's demo
// build, after the type-check, and this agrees with its own declarations (`sanitize(dirty,
// cfg?): string`).
declare const DOMPurify: {
  /** `dirty` without whatever could run or reach out on its own. */
  sanitize(dirty: string): string;
};
export default DOMPurify;
