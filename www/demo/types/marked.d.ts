// The part of marked that markdown.js uses, for the type-check (www/tsconfig.pages.json sends
// 'marked' here): the package is installed into demo/node_modules only by ./build.sh's demo
// build, after the type-check, and this agrees with its own declarations (`parse` with
// `async: false` answers a string).
export declare const marked: {
  /** `src` rendered to HTML at once. */
  parse(src: string, options: { async: false; gfm?: boolean }): string;
};
