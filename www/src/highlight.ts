/**
 * A tiny JavaScript colorizer for read-only code: comments, strings, template literals,
 * numbers, keywords, literals. Builds spans with text nodes, never HTML from the code.
 */
const KEYWORDS = new Set(
  'async await break case catch class const continue default delete do else export extends finally for function if import in instanceof let new of return static super switch this throw try typeof var void while yield'.split(' '),
);
const LITERALS = new Set(['true', 'false', 'null', 'undefined', 'NaN', 'Infinity']);

const TOKEN = /(\/\/[^\n]*|\/\*[\s\S]*?(?:\*\/|$))|("(?:[^"\\\n]|\\.)*"?|'(?:[^'\\\n]|\\.)*'?|`(?:[^`\\]|\\[\s\S])*`?)|(\b\d[\d_]*(?:\.\d+)?(?:[eE][+-]?\d+)?\b|\b0[xX][\da-fA-F]+\b)|([A-Za-z_$][\w$]*)/g;

export function highlightJs(code: string): DocumentFragment {
  const out = document.createDocumentFragment();
  let last = 0;
  const span = (cls: string, text: string) => {
    const s = document.createElement('span');
    s.className = cls;
    s.textContent = text;
    out.appendChild(s);
  };
  for (const m of code.matchAll(TOKEN)) {
    const at = m.index ?? 0;
    const [text, comment, string, number, word] = m;
    let cls: string | undefined;
    if (comment) cls = 'tok-comment';
    else if (string) cls = 'tok-string';
    else if (number) cls = 'tok-number';
    else if (word && KEYWORDS.has(word)) cls = 'tok-keyword';
    else if (word && LITERALS.has(word)) cls = 'tok-literal';
    if (!cls) continue;
    if (at > last) out.appendChild(document.createTextNode(code.slice(last, at)));
    span(cls, text);
    last = at + text.length;
  }
  if (last < code.length) out.appendChild(document.createTextNode(code.slice(last)));
  return out;
}
