// The demo shows a reply's Markdown rendered: bold, lists and fenced code (keeping its language
// class), through the renderer and sanitizer bundled with the page (www/demo/markdown.js), and
// nothing in a reply runs: an answer is text from outside, and a model can be made to write HTML.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { startServer } from '../../www/serve.mjs';
import { launch, openTestPage } from './harness.mjs';

const ANSWER = [
  'Kestrels are **small falcons**.',
  '',
  '- they hover',
  '- they eat voles',
  '',
  '```js',
  'const bird = "kestrel";',
  '```',
  '',
  '<img src="x" onerror="window.pwned = true"> <script>window.pwned = true</script>',
  '[a link](javascript:window.pwned=true)',
].join('\n');

test('the demo renders a reply as Markdown and runs nothing in it', async () => {
  const server = await startServer();
  const browser = await launch({ webgpu: false });
  try {
    const page = await openTestPage(browser.context, server.url);
    const r = await page.evaluate(async (answer) => {
      const { renderMarkdown } = await import('/www/demo/markdown.bundle.js');
      const out = document.createElement('div');
      out.className = 'msg assistant';
      out.innerHTML = renderMarkdown(answer);
      document.body.append(out);
      // An image's error handler would run once its load fails: give it the time to.
      await new Promise((done) => setTimeout(done, 500));
      return {
        bold: out.querySelector('strong')?.textContent,
        items: [...out.querySelectorAll('ul > li')].map((li) => li.textContent),
        code: out.querySelector('pre > code')?.className,
        codeText: out.querySelector('pre > code')?.textContent,
        handlers: [...out.querySelectorAll('*')].flatMap((el) => [...el.attributes].map((a) => a.name)).filter((name) => name.startsWith('on')),
        scripts: out.querySelectorAll('script').length,
        hrefs: [...out.querySelectorAll('a')].map((a) => a.getAttribute('href')),
        pwned: window.pwned ?? false,
      };
    }, ANSWER);
    assert.equal(r.bold, 'small falcons');
    assert.deepEqual(r.items, ['they hover', 'they eat voles']);
    assert.equal(r.code, 'language-js');
    assert.equal(r.codeText, 'const bird = "kestrel";\n');
    assert.deepEqual(r.handlers, [], 'no event handler attribute survives');
    assert.equal(r.scripts, 0);
    assert.ok(r.hrefs.every((href) => !href || !/^javascript:/i.test(href)), JSON.stringify(r.hrefs));
    assert.equal(r.pwned, false, 'nothing in the reply ran');
  } finally {
    await browser.close();
    await server.close();
  }
});
