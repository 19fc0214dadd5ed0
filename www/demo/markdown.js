// A reply's Markdown as the demo shows it: marked renders it (GitHub's flavour; a fenced block's
// code keeps its `language-*` class), and DOMPurify removes whatever could run or reach out on its
// own (scripts, event handlers, `javascript:` URLs): a model's answer is text from outside. Bundled
// with both into markdown.bundle.js by ./build.sh (`build_demo`), which the page imports.
import DOMPurify from 'dompurify';
import { marked } from 'marked';

/**
 * The HTML of `markdown`, safe to assign to `innerHTML`.
 * @param {string} markdown
 * @returns {string}
 */
export function renderMarkdown(markdown) {
  return DOMPurify.sanitize(marked.parse(markdown, { async: false, gfm: true }));
}
