// Sortable table headers: a header with `data-sort` sorts its table by that
// column (lib/table.js says how); a click (or Enter) cycles the direction,
// and `aria-sort` shows the choice, so the arrow is drawn by the CSS and
// read out by screen readers.

import { nextSort, parseSort } from "../lib/table.js";

/**
 * Wires the `th[data-sort]` of `thead`. `initial` is the stored choice;
 * `onChange(sort)` is called with the new one (null: the table's own order).
 * Returns `{get()}`.
 */
export function mountSortHeaders(thead, { initial = null, onChange } = {}) {
  let sort = parseSort(initial);
  const headers = [...thead.querySelectorAll("th[data-sort]")];

  function mark() {
    for (const th of headers) {
      const on = sort?.key === th.dataset.sort;
      th.setAttribute("aria-sort", on ? (sort.dir === "asc" ? "ascending" : "descending") : "none");
    }
  }

  for (const th of headers) {
    th.tabIndex = 0;
    th.classList.add("sortable");
    th.title = th.title ? `${th.title}. Click to sort` : "Click to sort";
    const choose = () => {
      sort = nextSort(sort, th.dataset.sort);
      mark();
      onChange?.(sort);
    };
    th.addEventListener("click", choose);
    th.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        choose();
      }
    });
  }
  mark();
  return { get: () => sort };
}

/** A stored sort choice, or null (unreadable storage is no choice). */
export function loadSort(storage, key) {
  try {
    return parseSort(JSON.parse(storage.getItem(key) ?? "null"));
  } catch {
    return null;
  }
}

export function saveSort(storage, key, sort) {
  try {
    storage.setItem(key, JSON.stringify(sort));
  } catch {
    // A window without storage still sorts; it just forgets.
  }
}
