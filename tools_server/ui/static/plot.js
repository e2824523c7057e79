// A session's context use: input tokens per answered request against the model's window, the lines the
// proxy acts on, and a vertical marker for every window after the first and every compaction event.
// Markers come from the journal's windows as they are: a new strategy shows up with its own name.
import uPlot from "./vendor/uPlot.esm.js";
import { el, time } from "./api.js";

const LINE_COLORS = ["#c46b00", "#b3261e", "#1f7a3a", "#8a4fd1"];

function markerPlugin(markers) {
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        for (const m of markers) {
          const x = u.valToPos(m.at, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = m.kind === "window" ? "#8a4fd1" : "#c46b00";
          ctx.setLineDash(m.kind === "window" ? [] : [4, 4]);
          ctx.lineWidth = 2;
          ctx.beginPath();
          ctx.moveTo(x, u.bbox.top);
          ctx.lineTo(x, u.bbox.top + u.bbox.height);
          ctx.stroke();
          ctx.fillStyle = ctx.strokeStyle;
          ctx.font = `${11 * devicePixelRatio}px system-ui`;
          const row = m.kind === "window" ? 1 : 2;  // a compaction and its window share a moment
          ctx.fillText(m.label, x + 4, u.bbox.top + 12 * row * devicePixelRatio);
        }
        ctx.restore();
      }],
    },
  };
}

export function renderPlot(container, plot) {
  const points = plot.points;
  const holder = el("div", { id: "plot", dataset: { points: points.length, markers: plot.markers.length,
    windowMarkers: plot.markers.filter((m) => m.kind === "window").length } });
  container.append(holder);
  if (!points.length) {
    holder.append(el("p", { class: "muted" }, "no answered requests with usage yet"));
    return holder;
  }
  const xs = points.map((p) => p.at);
  const lo = Math.min(...xs, ...plot.markers.map((m) => m.at));
  const hi = Math.max(...xs, ...plot.markers.map((m) => m.at));
  const pad = Math.max((hi - lo) * 0.05, 1);
  const series = [{}, { label: "input tokens", stroke: "#2f5fb3", width: 2, points: { show: true, size: 7 } }];
  const data = [xs, points.map((p) => p.input_tokens)];
  const flat = (v) => xs.map(() => v);
  if (plot.window) {
    series.push({ label: `window ${plot.window}`, stroke: "#66717d", dash: [2, 2], points: { show: false } });
    data.push(flat(plot.window));
  }
  plot.lines.forEach((line, i) => {
    series.push({ label: line.label, stroke: LINE_COLORS[i % LINE_COLORS.length], dash: [6, 4],
      points: { show: false } });
    data.push(flat(line.tokens));
  });
  const width = Math.max(Math.min(container.clientWidth - 20, 1100), 400);
  new uPlot({
    width, height: 280, series, plugins: [markerPlugin(plot.markers)],
    scales: { x: { time: true, range: [lo - pad, hi + pad] }, y: { range: (u, min, max) => [0, Math.max(max, 1) * 1.1] } },
    axes: [{}, { size: 70 }],
  }, data, holder);
  holder.append(el("div", { class: "marker-list" }, plot.markers.map((m) =>
    el("span", { class: `marker ${m.kind}` }, `${m.kind === "window" ? "▮" : "┆"} ${time(m.at)} ${m.label}`))));
  return holder;
}
