// Syntax highlighting of the rule language for the console's editor: a tokenizer that knows
// the language's keywords, strings, numbers, durations and comments, drawing DOM nodes (never
// HTML strings), and marking the lines the checker reported and the place of each error.
"use strict";

const VIGIL_KEYWORDS = new Set((
  "after ahead and as between by contains contiguity define emit endswith env every false " +
  "first from gap having hopping id in include is last lateness list match matches metric " +
  "next no not notify null or partials past pattern query rule secret select session " +
  "severity skip sliding startswith stream tags throttle time to true tumbling unit url " +
  "webhook where window within string int float bool timestamp"
).split(" "));

const VIGIL_TOKEN = /(#[^\n]*)|("(?:[^"\\\n]|\\.)*"?)|(\b\d+(?:\.\d+)?(?:ms|s|m|h|d)?\b)|([A-Za-z_][A-Za-z0-9_]*)|([<>!=]=?|[{}()\[\],.*+?|:-])/g;

function vigilTokens(text) {
  const out = [];
  let at = 0;
  for (const m of text.matchAll(VIGIL_TOKEN)) {
    if (m.index > at) out.push(["", text.slice(at, m.index)]);
    let kind = "";
    if (m[1]) kind = "comment";
    else if (m[2]) kind = "string";
    else if (m[3]) kind = "number";
    else if (m[4]) kind = VIGIL_KEYWORDS.has(m[4].toLowerCase()) ? "keyword" : "";
    else if (m[5]) kind = "operator";
    out.push([kind, m[0]]);
    at = m.index + m[0].length;
  }
  if (at < text.length) out.push(["", text.slice(at)]);
  return out;
}

// Draw `text` into `pre`, one span per line. `bad` maps a 1-based line number to the first
// error reported there, {message, column}: the line carries the class line-error and the
// message as its title, and the token at the error's column (1-based) the class at-error —
// past the end of the line, a marked blank there.
function vigilHighlight(pre, text, bad) {
  pre.replaceChildren();
  const lines = text.split("\n");
  lines.forEach((line, i) => {
    const span = document.createElement("span");
    span.className = "line";
    span.dataset.line = String(i + 1);
    const error = bad.get(i + 1);
    if (error !== undefined) {
      span.classList.add("line-error");
      span.title = error.message;
    }
    const column = error !== undefined && error.column ? error.column - 1 : -1;
    let offset = 0;
    let marked = false;
    for (const [kind, piece] of vigilTokens(line)) {
      const here = column >= offset && column < offset + piece.length;
      offset += piece.length;
      if (!kind && !here) { span.append(piece); continue; }
      const tok = document.createElement("span");
      tok.className = kind ? "tok-" + kind : "";
      if (here) { tok.classList.add("at-error"); marked = true; }
      tok.textContent = piece;
      span.append(tok);
    }
    if (column >= 0 && !marked) {
      const end = document.createElement("span");
      end.className = "at-error at-end";
      end.textContent = " ";
      span.append(end);
    }
    pre.append(span);
    if (i < lines.length - 1) pre.append("\n");
  });
  pre.append("\n");  // room for the caret on a last empty line
}
