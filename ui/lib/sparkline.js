// The per-call rate sparkline as SVG polyline points. Pure.

/**
 * Points ("x,y x,y ...") for `values` drawn in a `width` x `height` box
 * with `pad` pixels inside the edges. The y scale runs from 0 (not from
 * the smallest value: a rate that wobbles between 40 and 41 tok/s should
 * look flat, not like a saw) to 110% of the largest value (headroom keeps a
 * steady rate off the top edge). Fewer than two values draw nothing ("").
 */
export function sparklinePoints(values, width, height, pad = 1) {
  const finite = values.filter((v) => Number.isFinite(v) && v >= 0);
  if (finite.length < 2) return "";
  const max = Math.max(...finite);
  const w = width - 2 * pad;
  const h = height - 2 * pad;
  const step = w / (finite.length - 1);
  return finite
    .map((v, i) => {
      const x = pad + i * step;
      const y = max > 0 ? pad + h - (v / (max * 1.1)) * h : pad + h;
      return `${round(x)},${round(y)}`;
    })
    .join(" ");
}

function round(n) {
  return Math.round(n * 10) / 10;
}
