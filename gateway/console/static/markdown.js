// Markdown for finished answers, built from DOM nodes (textContent only): the
// model's text can never inject HTML. Headings, lists, fenced code, paragraphs,
// `code`, **bold**, *italic* and http(s) links; anything else stays text.
import { h } from "/static/dom.js";

const BLOCK_START = /^(```|#{1,6} |\s*([-*]|\d+\.) )/;

export function markdown(source) {
  const out = document.createDocumentFragment();
  const lines = source.split("\n");
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (line.startsWith("```")) {
      const lang = line.slice(3).trim();
      const code = [];
      for (i += 1; i < lines.length && !lines[i].startsWith("```"); i += 1) code.push(lines[i]);
      i += 1;
      out.append(h("pre", { class: "code", "data-lang": lang || null }, h("code", null, code.join("\n"))));
    } else if (/^#{1,6} /.test(line)) {
      const level = line.match(/^#+/)[0].length;
      out.append(inline(h(`h${Math.min(level + 2, 6)}`), line.slice(level + 1)));
      i += 1;
    } else if (/^\s*([-*]|\d+\.) /.test(line)) {
      const ordered = /^\s*\d+\./.test(line);
      const list = h(ordered ? "ol" : "ul");
      while (i < lines.length && /^\s*([-*]|\d+\.) /.test(lines[i])) {
        list.append(inline(h("li"), lines[i].replace(/^\s*([-*]|\d+\.) /, "")));
        i += 1;
      }
      out.append(list);
    } else if (line.trim() === "") {
      i += 1;
    } else {
      const para = [];
      while (i < lines.length && lines[i].trim() !== "" && !BLOCK_START.test(lines[i])) {
        para.push(lines[i]);
        i += 1;
      }
      out.append(inline(h("p"), para.join("\n")));
    }
  }
  return out;
}

function inline(parent, text) {
  const pattern = /`([^`]+)`|\*\*([^*]+)\*\*|\*([^*\s][^*]*)\*|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    parent.append(text.slice(last, m.index));
    if (m[1] !== undefined) parent.append(h("code", null, m[1]));
    else if (m[2] !== undefined) parent.append(h("strong", null, m[2]));
    else if (m[3] !== undefined) parent.append(h("em", null, m[3]));
    else parent.append(h("a", { href: m[5], rel: "noopener noreferrer", target: "_blank" }, m[4]));
    last = m.index + m[0].length;
  }
  parent.append(text.slice(last));
  return parent;
}
