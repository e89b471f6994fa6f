// Small DOM helpers shared by the views. Text always goes in through
// textContent: model names and routes come from requests, never markup.

/** `h("td", {class: "num", title: "..."}, "text", child)`. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

/** Sets text only when it changed, so unchanged cells don't repaint. */
export function setText(el, text) {
  if (el.textContent !== text) el.textContent = text;
}

/**
 * Copies `text`. The async clipboard needs a secure context (localhost
 * counts); the hidden-textarea fallback covers the rest.
 */
export async function copyText(text) {
  if (navigator.clipboard?.writeText) {
    try {
      await navigator.clipboard.writeText(text);
      return true;
    } catch {
      // fall through
    }
  }
  const area = h("textarea", { class: "offscreen", readonly: true });
  area.value = text;
  document.body.append(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch {
    ok = false;
  }
  area.remove();
  return ok;
}

/** A "Copy" button for `text` that says whether it worked. */
export function copyButton(text, label = "Copy") {
  const button = h("button", { type: "button", class: "copy small", title: `Copy ${text}`, "data-copy": text }, label);
  button.addEventListener("click", async () => {
    const ok = await copyText(text);
    button.textContent = ok ? "Copied" : "Copy failed";
    button.classList.toggle("done", ok);
    setTimeout(() => {
      button.textContent = label;
      button.classList.remove("done");
    }, 1500);
  });
  return button;
}

/** A value to paste (monospace) with its copy button. */
export function copyable(text) {
  return h("span", { class: "copyable" }, h("code", {}, text), copyButton(text));
}
