//! The dashboard's drawings, as inline SVG written by hand (no script needed to see them): a
//! DAG's graph, a model's fitted curve over its samples, a job's instances on a timeline per
//! agent. Each has a `<title>` and a `<desc>` in words, and the page shows the same facts in a
//! table beside it.

use std::fmt::Write as _;

use sonic_core::dag::Dag;

use super::html::{bytes, esc, num, secs};

/// How one edge of the graph is drawn: its label and, when known, its data-passing method
/// (which sets its stroke: `remote` dashed, `direct` solid, `vm-storage` thick).
#[derive(Debug, Clone)]
pub struct EdgeLabel {
    pub text: String,
    pub method: Option<String>,
}

/// Each function's layer: the longest path from a source (functions are in topological order).
fn layers(dag: &Dag) -> Vec<usize> {
    let mut depth = vec![0usize; dag.functions.len()];
    for i in 0..dag.functions.len() {
        for e in dag.edges.iter().filter(|e| e.to == i) {
            depth[i] = depth[i].max(depth[e.from] + 1);
        }
    }
    depth
}

const NODE_W: f64 = 150.0;
const NODE_H: f64 = 46.0;
const COL_GAP: f64 = 40.0;
const ROW_GAP: f64 = 84.0;

fn method_style(method: Option<&str>) -> (&'static str, &'static str, f64) {
    // (color, dash array, width): distinct in shape as well as in color.
    match method {
        Some("remote") => ("#8a4b00", "7 5", 2.0),
        Some("direct") => ("#0b57d0", "", 2.0),
        Some("vm-storage") => ("#0a5a2a", "", 4.5),
        _ => ("#52606d", "", 1.6),
    }
}

/// Where a function of a job stands, drawn on its node (in words too: its title and a mark).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Not started (or, in a failed job, never run).
    Pending,
    Running,
    /// Its instances succeeded.
    Done,
    /// Its failure failed the job.
    Failed,
}

impl NodeState {
    /// Its word, its fill and its border.
    fn look(self) -> (&'static str, &'static str, &'static str) {
        match self {
            NodeState::Pending => ("pending", "#f0f4f8", "#334e68"),
            NodeState::Running => ("running", "#e6efff", "#0b3c8a"),
            NodeState::Done => ("done", "#e3f5e9", "#0a5a2a"),
            NodeState::Failed => ("failed", "#fde8e8", "#8a1c1c"),
        }
    }
}

/// The DAG drawn top to bottom: a box per function (its name and instances), an arrow per edge
/// with its label. `id` makes the element ids unique on the page. With `states` (a job's page),
/// each node is colored by where its function stands, and says so.
pub fn dag_graph(
    id: &str,
    dag: &Dag,
    edges: &[EdgeLabel],
    nodes_note: &[String],
    states: &[NodeState],
) -> String {
    let depth = layers(dag);
    let rows = depth.iter().copied().max().map_or(0, |d| d + 1);
    let mut per_row: Vec<Vec<usize>> = vec![Vec::new(); rows];
    for (i, d) in depth.iter().enumerate() {
        per_row[*d].push(i);
    }
    let widest = per_row.iter().map(Vec::len).max().unwrap_or(1).max(1) as f64;
    let width = widest * NODE_W + (widest + 1.0) * COL_GAP;
    let height =
        ROW_GAP * 0.5 + rows as f64 * NODE_H + (rows as f64 - 1.0).max(0.0) * ROW_GAP * 0.75 + 16.0;
    let mut pos = vec![(0.0, 0.0); dag.functions.len()];
    for (r, row) in per_row.iter().enumerate() {
        let n = row.len() as f64;
        let span = n * NODE_W + (n - 1.0).max(0.0) * COL_GAP;
        let x0 = (width - span) / 2.0;
        for (k, &i) in row.iter().enumerate() {
            let x = x0 + k as f64 * (NODE_W + COL_GAP);
            let y = ROW_GAP * 0.5 + r as f64 * (NODE_H + ROW_GAP * 0.75);
            pos[i] = (x, y);
        }
    }
    let mut desc = Vec::new();
    for (k, e) in dag.edges.iter().enumerate() {
        let label = edges.get(k).map_or("", |l| l.text.as_str());
        desc.push(format!(
            "{} to {} ({label})",
            dag.functions[e.from].name, dag.functions[e.to].name
        ));
    }
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"dag\" viewBox=\"0 0 {width:.0} {height:.0}\" width=\"{width:.0}\" role=\"img\" aria-labelledby=\"{id}-t {id}-d\">\
         <title id=\"{id}-t\">The DAG {}: {} functions, {} edges</title><desc id=\"{id}-d\">{}</desc>\
         <defs><marker id=\"{id}-arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"11\" markerHeight=\"11\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#334e68\"/></marker></defs>",
        esc(&dag.name),
        dag.functions.len(),
        dag.edges.len(),
        esc(&desc.join("; "))
    );
    for (k, e) in dag.edges.iter().enumerate() {
        let (x1, y1) = pos[e.from];
        let (x2, y2) = pos[e.to];
        let (sx, sy) = (x1 + NODE_W / 2.0, y1 + NODE_H);
        let (tx, ty) = (x2 + NODE_W / 2.0, y2 - 2.0);
        let dy = (ty - sy).abs().max(20.0);
        let label = edges.get(k);
        let method = label.and_then(|l| l.method.as_deref());
        let (color, dash, w) = method_style(method);
        let _ = write!(
            out,
            "<path class=\"edge\" data-method=\"{}\" d=\"M{sx:.1},{sy:.1} C{sx:.1},{:.1} {tx:.1},{:.1} {tx:.1},{ty:.1}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"{w}\" stroke-dasharray=\"{dash}\" marker-end=\"url(#{id}-arrow)\"/>",
            esc(method.unwrap_or("")),
            sy + dy / 2.0,
            ty - dy / 2.0
        );
        if let Some(l) = label.filter(|l| !l.text.is_empty()) {
            let (mx, my) = ((sx + tx) / 2.0, (sy + ty) / 2.0);
            let w = 7.2 * l.text.chars().count() as f64 + 12.0;
            let _ = write!(
                out,
                "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{w:.1}\" height=\"20\" rx=\"4\" fill=\"#fff\" stroke=\"{color}\"/>\
                 <text x=\"{mx:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" fill=\"#1a1a1a\">{}</text>",
                mx - w / 2.0,
                my - 10.0,
                my + 4.0,
                esc(&l.text)
            );
        }
    }
    for (i, f) in dag.functions.iter().enumerate() {
        let (x, y) = pos[i];
        let state = states.get(i).copied();
        let (word, fill, stroke) = state.map_or(("", "#f0f4f8", "#334e68"), NodeState::look);
        let note = match (nodes_note.get(i).map_or("", String::as_str), state) {
            ("", Some(_)) => word.to_owned(),
            (n, Some(_)) => format!("{n} · {word}"),
            (n, None) => n.to_owned(),
        };
        let _ = write!(
            out,
            "<g class=\"node\" data-state=\"{word}\"><title>{}{}</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{NODE_W}\" height=\"{NODE_H}\" rx=\"6\" fill=\"{fill}\" stroke=\"{stroke}\" stroke-width=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"14\" font-weight=\"600\" text-anchor=\"middle\" fill=\"#102a43\">{}</text>\
             <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#334e68\">{}</text></g>",
            esc(&f.name),
            if word.is_empty() {
                String::new()
            } else {
                format!(": {word}")
            },
            if state.is_some_and(|s| s != NodeState::Pending) {
                2.5
            } else {
                1.5
            },
            x + NODE_W / 2.0,
            if note.is_empty() { y + 28.0 } else { y + 19.0 },
            esc(&f.name),
            x + NODE_W / 2.0,
            y + 36.0,
            esc(&note)
        );
    }
    out.push_str("</svg>");
    out
}

/// A model's samples (dots) and its fitted curve (line) against the input size.
pub fn model_chart(
    id: &str,
    title: &str,
    unit: &str,
    samples: &[(f64, f64)],
    curve: &dyn Fn(f64) -> Option<f64>,
) -> String {
    let (w, h) = (320.0, 190.0);
    let (left, right, top, bottom) = (52.0, 12.0, 12.0, 36.0);
    let max_x = samples.iter().map(|s| s.0).fold(0.0, f64::max).max(1.0) * 1.1;
    let xs: Vec<f64> = (0..=40).map(|k| max_x * k as f64 / 40.0).collect();
    let line: Vec<(f64, f64)> = xs
        .iter()
        .filter_map(|&x| curve(x).filter(|y| y.is_finite()).map(|y| (x, y)))
        .collect();
    let max_y = samples
        .iter()
        .map(|s| s.1)
        .chain(line.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let px = |x: f64| left + (x / max_x) * (w - left - right);
    let py = |y: f64| h - bottom - (y.max(0.0) / max_y) * (h - top - bottom);
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h}\" width=\"{w}\" role=\"img\" aria-labelledby=\"{id}-t\">\
         <title id=\"{id}-t\">{}: {} samples and the fitted curve, input size 0 to {}</title>\
         <line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#52606d\"/>\
         <line x1=\"{left}\" y1=\"{top}\" x2=\"{left}\" y2=\"{:.1}\" stroke=\"#52606d\"/>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#334e68\">input size, 0 to {}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"start\" fill=\"#334e68\">{}</text>\
         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" text-anchor=\"end\" fill=\"#334e68\">0</text>",
        esc(title),
        samples.len(),
        bytes(max_x),
        h - bottom,
        w - right,
        h - bottom,
        h - bottom,
        (left + w - right) / 2.0,
        h - 8.0,
        bytes(max_x),
        left + 4.0,
        top + 8.0,
        esc(&format!("{} {unit}", num(max_y))),
        left - 4.0,
        h - bottom,
    );
    if line.len() > 1 {
        let pts: Vec<String> = line
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = write!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"#0b57d0\" stroke-width=\"2\"/>",
            pts.join(" ")
        );
    }
    for &(x, y) in samples {
        let _ = write!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3.5\" fill=\"#fff\" stroke=\"#8a1c1c\" stroke-width=\"1.8\"><title>x = {}, y = {}</title></circle>",
            px(x),
            py(y),
            num(x),
            num(y)
        );
    }
    out.push_str("</svg>");
    out
}

/// One instance on the timeline.
#[derive(Debug, Clone)]
pub struct Bar {
    pub agent: String,
    pub start: f64,
    pub end: f64,
    pub label: String,
    pub cold: bool,
    /// An attempt that failed (drawn red, said in its title).
    pub failed: bool,
}

/// Per bar, its lane within its agent's row (instances that overlap in time get lanes of their
/// own), and how many lanes each agent needs.
fn lanes(agents: &[String], bars: &[Bar]) -> (Vec<usize>, Vec<usize>) {
    let mut order: Vec<usize> = (0..bars.len()).collect();
    order.sort_by(|&a, &b| bars[a].start.total_cmp(&bars[b].start));
    let mut lane = vec![0; bars.len()];
    // Per agent, when each lane is free again.
    let mut free: Vec<Vec<f64>> = vec![Vec::new(); agents.len()];
    for i in order {
        let Some(r) = agents.iter().position(|a| a == &bars[i].agent) else {
            continue;
        };
        let slot = free[r].iter().position(|&t| t <= bars[i].start);
        let k = slot.unwrap_or(free[r].len());
        if k == free[r].len() {
            free[r].push(0.0);
        }
        free[r][k] = bars[i].end;
        lane[i] = k;
    }
    (lane, free.iter().map(|f| f.len().max(1)).collect())
}

/// Instances as bars on one row per agent (a lane per instance running at the same time), from
/// the job's start.
pub fn timeline(id: &str, agents: &[String], bars: &[Bar]) -> String {
    let (w, lane_h, left, top) = (760.0, 24.0, 120.0, 8.0);
    let total = bars.iter().map(|b| b.end).fold(0.0, f64::max).max(1e-3);
    let (lane, per_agent) = lanes(agents, bars);
    let row_top: Vec<f64> = per_agent
        .iter()
        .scan(top, |y, n| {
            let at = *y;
            *y += *n as f64 * lane_h + 8.0;
            Some(at)
        })
        .collect();
    let rows_end = top
        + per_agent
            .iter()
            .map(|n| *n as f64 * lane_h + 8.0)
            .sum::<f64>();
    let h = rows_end + 22.0;
    let px = |t: f64| left + (t / total) * (w - left - 30.0);
    let mut out = String::new();
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {w} {h:.0}\" width=\"{w}\" role=\"img\" aria-labelledby=\"{id}-t\">\
         <title id=\"{id}-t\">Instances on a timeline by agent, over {} (dark: cold start; light: hot)</title>",
        secs(total)
    );
    for (r, a) in agents.iter().enumerate() {
        let y = row_top[r];
        let rh = per_agent[r] as f64 * lane_h + 8.0;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\" fill=\"#1a1a1a\">{}</text>\
             <line x1=\"{left}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#d9e2ec\"/>",
            left - 6.0,
            y + lane_h / 2.0 + 8.0,
            esc(a),
            y + rh,
            w - 10.0,
            y + rh
        );
    }
    let row = lane_h + 4.0;
    for (i, b) in bars.iter().enumerate() {
        let Some(r) = agents.iter().position(|a| a == &b.agent) else {
            continue;
        };
        let y = row_top[r] + 4.0 + lane[i] as f64 * lane_h;
        let x = px(b.start);
        let bw = (px(b.end) - x).max(2.0);
        let (fill, text) = if b.failed {
            ("#b42318", "#fff")
        } else if b.cold {
            ("#334e68", "#fff")
        } else {
            ("#bcccdc", "#102a43")
        };
        let _ = write!(
            out,
            "<g><title>{}: {} to {} ({})</title><rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bw:.1}\" height=\"{:.1}\" rx=\"3\" fill=\"{fill}\" stroke=\"#102a43\"/>",
            esc(&b.label),
            secs(b.start),
            secs(b.end),
            if b.failed {
                "failed"
            } else if b.cold {
                "cold"
            } else {
                "hot"
            },
            row - 8.0
        );
        if bw > 7.0 * b.label.chars().count() as f64 + 6.0 {
            let _ = write!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"11\" fill=\"{text}\">{}</text>",
                x + 4.0,
                y + row / 2.0 + 1.0,
                esc(&b.label)
            );
        }
        out.push_str("</g>");
    }
    let axis_y = rows_end + 14.0;
    for k in 0..=4 {
        let t = total * k as f64 / 4.0;
        let _ = write!(
            out,
            "<text x=\"{:.1}\" y=\"{axis_y:.1}\" font-size=\"11\" text-anchor=\"middle\" fill=\"#334e68\">{}</text>",
            px(t),
            secs(t)
        );
    }
    out.push_str("</svg>");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const FAN: &str = r#"
name: fan
functions:
  - { name: gen, image: i, command: [x] }
  - { name: mid, image: i, command: [x], instances: 2 }
  - { name: sink, image: i, command: [x] }
edges:
  - { from: gen, to: mid, kind: broadcast }
  - { from: mid, to: sink, kind: gather }
"#;

    #[test]
    fn the_graph_names_every_function_and_edge() {
        let dag = Dag::from_yaml("fan.yaml", FAN).expect("dag");
        let labels = vec![
            EdgeLabel {
                text: "direct".into(),
                method: Some("direct".into()),
            },
            EdgeLabel {
                text: "remote".into(),
                method: Some("remote".into()),
            },
        ];
        let svg = dag_graph("g", &dag, &labels, &[], &[]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        for f in ["gen", "mid", "sink"] {
            assert!(svg.contains(&format!(">{f}</text>")), "{f}");
        }
        assert_eq!(svg.matches("class=\"edge\"").count(), 2);
        assert!(svg.contains("data-method=\"remote\""));
        assert!(svg.contains("gen to mid (direct)"));
        assert_eq!(layers(&dag), vec![0, 1, 2]);
    }

    #[test]
    fn charts_and_timelines_draw_what_they_get() {
        let c = model_chart(
            "m",
            "gen.cold_s",
            "s",
            &[(1000.0, 1.0), (2000.0, 2.0)],
            &|x| Some(x / 1000.0),
        );
        assert_eq!(c.matches("<circle").count(), 2);
        assert!(c.contains("<polyline"));
        let t = timeline(
            "t",
            &["a-1".into(), "a-2".into()],
            &[
                Bar {
                    failed: false,
                    agent: "a-1".into(),
                    start: 0.0,
                    end: 1.0,
                    label: "gen[0]".into(),
                    cold: true,
                },
                Bar {
                    failed: false,
                    agent: "a-2".into(),
                    start: 1.0,
                    end: 2.0,
                    label: "mid[1]".into(),
                    cold: false,
                },
            ],
        );
        assert_eq!(t.matches("<rect").count(), 2);
        assert!(t.contains("gen[0]: 0 ms to 1.00 s (cold)"));
        // Two instances at once on one agent: two lanes.
        let same = |start: f64, end: f64| Bar {
            failed: false,
            agent: "a-1".into(),
            start,
            end,
            label: "mid".into(),
            cold: false,
        };
        let (lane, per) = lanes(
            &["a-1".into()],
            &[same(0.0, 2.0), same(1.0, 3.0), same(2.5, 4.0)],
        );
        assert_eq!((lane, per), (vec![0, 1, 0], vec![2]));
    }
}
