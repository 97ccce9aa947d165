//! `laya-edge probe --model BUNDLE --backend X`: runs the bundle's probe on a backend and prints
//! how closely it answers like the float model, over every row and per graph (the figures the
//! agent publishes in telemetry and in `probe_failed` events). Exits with failure when a graph
//! falls below the bundle's thresholds.

use std::path::Path;

use crate::bundle::HostBundle;
use crate::config::Config;
use crate::engine::probe::{MIN_ROWS_PER_GRAPH, graph_name, probed_graphs};
use crate::engine::probe_file as probe;
use crate::prompt::Row;

/// `probe`'s flags, as `predict`'s: the configuration file, the bundle, the backend, the threads.
pub type Args = super::BackendArgs;

pub fn run(config: Config) -> Result<(), String> {
    let bundle =
        HostBundle::load_verified_as(Path::new(&config.model.dir), config.model.laya).map_err(|e| e.to_string())?;
    let mut probe = probe::of_bundle(&bundle)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} has no probe: assemble it with `laya-edge bundle`", config.model.dir.display()))?;
    // The CPU in a quantised mode (`--cpu-weights int8`) is its own path, held to the agreement
    // it is refused at start below.
    if crate::engine::fidelity::gated(&config) && config.engine.backend == crate::config::BackendKind::Cpu {
        probe.thresholds = probe.thresholds.quantised();
    }
    let mut backend = super::backend_for(&config, &bundle, false)?;
    let rows: Vec<&Row> = probe.rows.iter().collect();
    let outputs =
        backend.backend().run(&rows).map_err(|e| format!("the {} backend failed on the probe: {e}", backend.name()))?;
    let report = probe.judge(&outputs, probed_graphs(&bundle.capacity).as_deref());
    println!("{} on {}: {}", backend.name(), config.model.dir.display(), report.figures);
    for g in report.graphs.iter().filter(|g| g.seq_len.is_some()) {
        let outcome = match (g.figures.rows, g.passed) {
            (0, _) => String::new(),
            (_, true) => ": passed".to_owned(),
            (_, false) => format!(": FAILED ({})", g.verdict),
        };
        println!("  {g}{outcome}");
        if (1..MIN_ROWS_PER_GRAPH).contains(&g.figures.rows) {
            println!(
                "  {}: only {} probe rows, fewer than the {MIN_ROWS_PER_GRAPH} a graph is judged on reliably: assemble the bundle again",
                graph_name(g.seq_len),
                g.figures.rows
            );
        }
    }
    let t = &probe.thresholds;
    if report.passed {
        println!(
            "passed on every graph (thresholds: argmax >= {}, clear decisions >= {}, mean cosine >= {}, mean |dp| <= {})",
            t.min_agreement, t.min_clear_agreement, t.min_cosine, t.max_mean_dp
        );
        Ok(())
    } else {
        Err(format!("probe failed: {}", report.verdict))
    }
}
