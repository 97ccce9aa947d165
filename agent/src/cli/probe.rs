//! `laya-edge probe --model BUNDLE --backend X`: runs the bundle's probe on a backend and prints
//! how closely it answers like the float model (the figures the agent publishes in telemetry
//! and in `probe_failed` events). Exits with failure when the bundle's thresholds are not met.

use std::path::Path;

use crate::bundle::HostBundle;
use crate::config::Config;
use crate::engine::probe_file as probe;
use crate::prompt::Row;

/// `probe`'s flags, as `predict`'s: the configuration file, the bundle, the backend, the threads.
pub type Args = super::BackendArgs;

pub fn run(config: Config) -> Result<(), String> {
    let bundle =
        HostBundle::load_verified_as(Path::new(&config.model.dir), config.model.laya).map_err(|e| e.to_string())?;
    let probe = probe::of_bundle(&bundle)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("{} has no probe: assemble it with `laya-edge bundle`", config.model.dir.display()))?;
    let mut backend = super::backend_for(&config, &bundle, false)?;
    let rows: Vec<&Row> = probe.rows.iter().collect();
    let outputs = backend.run(&rows).map_err(|e| format!("the {} backend failed on the probe: {e}", backend.name()))?;
    let report = probe.judge(&outputs);
    println!("{} on {}: {report}", backend.name(), config.model.dir.display());
    if report.passed {
        println!(
            "passed (thresholds: argmax >= {}, clear decisions >= {}, mean cosine >= {})",
            probe.thresholds.min_agreement, probe.thresholds.min_clear_agreement, probe.thresholds.min_cosine
        );
        Ok(())
    } else {
        Err(format!("probe failed: {}", report.verdict))
    }
}
