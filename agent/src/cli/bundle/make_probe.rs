//! Making a bundle's probe file (`laya-edge bundle`): the float model's logits for every
//! question of the probe requests, written in the form [`crate::engine::probe_file`] reads back.
//!
//! Each graph is judged on its own rows (`engine::probe`), so each needs enough of them: the
//! maker's requests are taken in order while they add rows to a graph that has fewer than
//! [`MAX_ROWS_PER_GRAPH`], then a graph left with fewer than [`MIN_ROWS_PER_GRAPH`] is filled
//! from the built-in requests, each laid out with `max_len` at that graph's length (their long
//! states are cut to it, so they reach any graph however the tokenizer counts). A graph still
//! short of rows is an error: a probe that leaves a graph unjudged would pass it unseen.

use std::collections::HashSet;
use std::path::Path;

use laya_topics::json::{self, Style};
use laya_topics::{Map, Value};

use crate::backend::Backend;
use crate::bundle::HostBundle;
use crate::engine::probe::{MIN_ROWS_PER_GRAPH, graph_name, probed_graphs, split};
use crate::engine::probe_file::rows_of;
use crate::prompt::Row;

fn floats(v: &[f32]) -> Value {
    Value::Array(v.iter().map(|x| Value::Float(f64::from(*x))).collect())
}

/// How many rows a probe takes for one graph at most: enough to see a few percent of flipped
/// decisions, few enough to run on every new worker (a request's other rows may go past it).
pub const MAX_ROWS_PER_GRAPH: usize = 32;

/// One graph's share of a probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphRows {
    /// The graph's sequence length (`None`: a backend without graphs, every row).
    pub seq_len: Option<usize>,
    pub rows: usize,
    /// How many of them came from the built-in requests to fill the graph.
    pub built_in: usize,
}

impl std::fmt::Display for GraphRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {} rows", graph_name(self.seq_len), self.rows)?;
        if self.built_in > 0 {
            write!(f, " ({} from the built-in requests)", self.built_in)?;
        }
        Ok(())
    }
}

/// A probe file's text and how its rows split over the graphs.
#[derive(Debug, Clone)]
pub struct Made {
    pub text: String,
    pub rows: usize,
    pub split: Vec<GraphRows>,
}

/// The probe file being written.
struct Writer<'a> {
    bundle: &'a HostBundle,
    backend: &'a mut dyn Backend,
    graphs: Vec<Option<usize>>,
    split: Vec<GraphRows>,
    seen: HashSet<Vec<u32>>,
    text: String,
    rows: usize,
}

impl Writer<'_> {
    /// The graph index of each of `rows`.
    fn graphs_of(&self, rows: &[(String, Row)]) -> Vec<Option<usize>> {
        let rows: Vec<Row> = rows.iter().map(|(_, r)| r.clone()).collect();
        split(probed_graphs(&self.bundle.capacity).as_deref(), &rows).1
    }

    /// Lays `request` out and, if `wanted` says one of its new rows is needed, answers it on the
    /// float model and writes it; `built_in` counts its rows as filling.
    fn offer(
        &mut self,
        request: &Value,
        wanted: impl Fn(usize, &GraphRows) -> bool,
        built_in: bool,
    ) -> Result<(), String> {
        let rows = rows_of(self.bundle, request, Path::new("probe requests")).map_err(|e| e.to_string())?;
        let of = self.graphs_of(&rows);
        let needed = rows
            .iter()
            .zip(&of)
            .any(|((_, r), g)| g.is_some_and(|g| wanted(g, &self.split[g])) && !self.seen.contains(&r.input_ids));
        if !needed {
            return Ok(());
        }
        let refs: Vec<&Row> = rows.iter().map(|(_, r)| r).collect();
        let outputs = self.backend.run(&refs).map_err(|e| e.to_string())?;
        let mut m = Map::new();
        for (((qid, row), out), g) in rows.iter().zip(&outputs).zip(&of) {
            let mut r = Map::new();
            r.insert(
                "input_ids".into(),
                Value::Array(row.input_ids.iter().map(|&i| Value::int(i64::from(i))).collect()),
            );
            r.insert("logits".into(), floats(&out.logits));
            r.insert("act_logits".into(), floats(&out.act_logits));
            m.insert(qid.clone(), Value::Object(r));
            self.seen.insert(row.input_ids.clone());
            if let Some(g) = g {
                self.split[*g].rows += 1;
                self.split[*g].built_in += usize::from(built_in);
            }
        }
        self.rows += rows.len();
        let mut line = Map::new();
        line.insert("request".into(), request.clone());
        line.insert("rows".into(), Value::Object(m));
        self.text.push_str(&json::to_string(&Value::Object(line), Style::COMPACT));
        self.text.push('\n');
        Ok(())
    }
}

/// Runs `requests` on `backend` (the CPU reference when a bundle is assembled), in order while
/// they add rows to a graph with fewer than [`MAX_ROWS_PER_GRAPH`], then fills each graph with
/// fewer than [`MIN_ROWS_PER_GRAPH`] from `built_in` (laid out at that graph's length). Errs if
/// a graph is still short of rows.
pub fn make(
    bundle: &HostBundle,
    backend: &mut dyn Backend,
    requests: &[Value],
    built_in: &[Value],
) -> Result<Made, String> {
    let (graphs, _) = split(probed_graphs(&bundle.capacity).as_deref(), &[]);
    let split = graphs.iter().map(|&seq_len| GraphRows { seq_len, rows: 0, built_in: 0 }).collect();
    let mut w = Writer { bundle, backend, graphs, split, seen: HashSet::new(), text: String::new(), rows: 0 };
    for request in requests {
        w.offer(request, |_, g| g.rows < MAX_ROWS_PER_GRAPH, false)?;
    }
    for gi in 0..w.graphs.len() {
        if w.split[gi].rows >= MIN_ROWS_PER_GRAPH {
            continue;
        }
        for request in built_in {
            if w.split[gi].rows >= MAX_ROWS_PER_GRAPH {
                break;
            }
            let mut request = request.clone();
            if let (Some(l), Value::Object(m)) = (w.graphs[gi], &mut request) {
                m.insert("max_len".into(), Value::int(l as i64));
            }
            w.offer(&request, |g, rows| g == gi && rows.rows < MAX_ROWS_PER_GRAPH, true)?;
        }
    }
    if w.rows == 0 {
        return Err("none of the probe requests has a question this model can answer".into());
    }
    let short: Vec<String> = w
        .split
        .iter()
        .filter(|g| g.rows < MIN_ROWS_PER_GRAPH)
        .map(|g| format!("{} has {}", graph_name(g.seq_len), g.rows))
        .collect();
    if !short.is_empty() {
        return Err(format!(
            "{} probe rows, fewer than the {MIN_ROWS_PER_GRAPH} each graph is judged on, even with the built-in requests; give --probe requests whose states are long enough for every graph",
            short.join(", ")
        ));
    }
    Ok(Made { text: w.text, rows: w.rows, split: w.split })
}
