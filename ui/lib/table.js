// Sorting and filtering the calls tables (Live and History): which column
// a header sorts by, the order a click cycles through, and the model and
// route filter of Live. Pure: the views keep the choice and draw it.
//
// Absent numbers (a call still waiting has no TTFT, a burst has no rate)
// always sort after present ones, whichever the direction: a dash is "not
// known", never "zero" or "infinite".

/** What each sortable column compares: a number, or text. */
const KEYS = {
  started: { kind: "text", of: (c) => c.started_at },
  model: { kind: "text", of: (c) => c.model },
  route: { kind: "text", of: (c) => c.route },
  client: { kind: "text", of: (c) => c.client },
  api: { kind: "text", of: (c) => c.api },
  phase: { kind: "text", of: (c) => c.speed?.phase },
  status: { kind: "text", of: (c) => c.status },
  ttft: { kind: "number", of: (c) => c.speed?.time_to_first_token_ms },
  rate: { kind: "number", of: (c) => c.speed?.output_tokens_per_second },
  tokens: { kind: "number", of: (c) => c.speed?.output_tokens },
};

/** The columns a header may sort by. */
export const SORTABLE = Object.freeze(Object.keys(KEYS));

/** A sort choice as stored: `{key, dir}` with a known key, else null (the table's own order). */
export function parseSort(value) {
  if (!value || typeof value !== "object") return null;
  if (!KEYS[value.key] || (value.dir !== "asc" && value.dir !== "desc")) return null;
  return { key: value.key, dir: value.dir };
}

/**
 * The choice after a click on `key`'s header: a new column starts with its
 * natural direction (numbers from the highest, text from A), a second click
 * reverses it, a third returns to the table's own order (null).
 */
export function nextSort(current, key) {
  if (!KEYS[key]) return current;
  const first = KEYS[key].kind === "number" ? "desc" : "asc";
  if (!current || current.key !== key) return { key, dir: first };
  if (current.dir === first) return { key, dir: first === "asc" ? "desc" : "asc" };
  return null;
}

function present(kind, value) {
  if (kind === "number") return typeof value === "number" && Number.isFinite(value);
  return typeof value === "string" && value !== "";
}

/**
 * `calls` sorted by `sort` (a copy; the input order breaks ties, so equal
 * rows keep the table's own order); `calls` itself when `sort` is null.
 */
export function sortCalls(calls, sort) {
  const choice = parseSort(sort);
  if (!choice) return calls;
  const { kind, of } = KEYS[choice.key];
  const sign = choice.dir === "asc" ? 1 : -1;
  return calls
    .map((call, index) => ({ call, index, value: of(call) }))
    .sort((a, b) => {
      const pa = present(kind, a.value);
      const pb = present(kind, b.value);
      if (pa !== pb) return pa ? -1 : 1;
      if (pa) {
        const diff =
          kind === "number" ? a.value - b.value : a.value.localeCompare(b.value, "en", { numeric: true, sensitivity: "base" });
        if (diff !== 0) return sign * diff;
      }
      return a.index - b.index;
    })
    .map((x) => x.call);
}

/** The calls that match the Live filter `{model, route}` (an empty field matches all). */
export function filterCalls(calls, { model = "", route = "" } = {}) {
  if (!model && !route) return calls;
  return calls.filter((c) => (!model || c.model === model) && (!route || c.route === route));
}

/**
 * The filter's choices: the models and routes of `calls`, sorted, plus the
 * current choice even when no call has it any more (so a pick never
 * vanishes from under the user while its calls scroll out).
 */
export function filterOptions(calls, chosen = {}) {
  const models = new Set();
  const routes = new Set();
  for (const c of calls) {
    if (c.model) models.add(c.model);
    if (c.route) routes.add(c.route);
  }
  if (chosen.model) models.add(chosen.model);
  if (chosen.route) routes.add(chosen.route);
  const sorted = (set) => [...set].sort((a, b) => a.localeCompare(b, "en", { numeric: true }));
  return { models: sorted(models), routes: sorted(routes) };
}
