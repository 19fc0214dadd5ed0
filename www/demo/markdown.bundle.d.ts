// The types of markdown.bundle.js, which ./build.sh bundles from markdown.js (with marked and
// DOMPurify) after the type-check runs: the page imports the bundle, typed as its source.
export { renderMarkdown } from './markdown.js';
