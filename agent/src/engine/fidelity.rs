//! The quantised CPU modes' gate (issue #43): `[cpu] weights = "int8"` or `"bf16"` is its own
//! probe path (`cpu-int8`, `cpu-bf16`), judged like the NPU backends against the float model,
//! and a model whose probe it fails is refused at start instead of served with other answers.
//!
//! Why at start, in the agent: a quantised CPU computes the same floats on every run, so the
//! verdict on the probe rows cannot change while the model is served; a worker that failed it
//! would only be restarted into the same failure. The gate loads the model in the mode, runs the
//! probe rows and judges them with `engine::probe`'s figures: the bundle's probe (rows and the
//! float logits recorded when it was assembled), or, for a checkpoint without one, the built-in
//! probe requests against the f32 model run here first. Its thresholds are the bundle's made
//! [`Thresholds::quantised`] (the judging, like every probe's, is `engine::probe`'s).
//!
//! Why in the engine and not beside the CPU backend: it lays out probe requests (`pipeline`,
//! `probe_file`) and judges them (`probe`), which sit above the backends; `serve` (with every
//! reload) and `predict` call it before a worker is started.

use std::path::Path;

use super::probe::{Probe, Report, Thresholds};
use super::probe_file;
use crate::backend::cpu::{self, CpuBackend, backend_name};
use crate::backend::{Backend, SetupError};
use crate::bundle::HostBundle;
use crate::config::{BackendKind, Config, CpuWeights, Fallback};
use crate::prompt::Row;

/// Whether a worker of `config` runs the CPU model in a quantised mode (as the backend or as its
/// fallback): then [`check`] judges the mode at start.
pub fn gated(config: &Config) -> bool {
    let cpu = config.engine.backend == BackendKind::Cpu || config.engine.fallback == Fallback::Cpu;
    cpu && config.cpu.weights != CpuWeights::F32
}

/// Runs `config`'s quantised CPU mode on the probe of `bundle` and refuses it if it fails
/// ([`SetupError::Fidelity`]); nothing for f32 or a configuration whose workers run no CPU model.
/// Returns the report it judged, if any.
pub fn check(config: &Config, bundle: &HostBundle) -> Result<Option<Report>, SetupError> {
    if !gated(config) {
        return Ok(None);
    }
    let mode = config.cpu.weights;
    // Refused by name before anything is loaded (bf16 on a CPU without it).
    cpu::check_weights(mode).map_err(|message| SetupError::Fidelity { mode: backend_name(mode), message })?;
    let Some(ckpt) = bundle.checkpoint.as_deref() else { return Ok(None) };
    let report = judge(ckpt, bundle, mode)?;
    if report.passed {
        tracing::info!(mode = backend_name(mode), figures = %report.figures, "the quantised CPU mode passed its probe");
        Ok(Some(report))
    } else {
        Err(SetupError::Fidelity {
            mode: backend_name(mode),
            message: format!(
                "it answers unlike the f32 model on the probe: {} ({}); serve f32 ([cpu] weights = \"f32\")",
                report.verdict, report.figures
            ),
        })
    }
}

/// The probe's report on the checkpoint `ckpt` of `bundle` in `mode`.
pub fn judge(ckpt: &Path, bundle: &HostBundle, mode: CpuWeights) -> Result<Report, SetupError> {
    let probe = match probe_file::of_bundle(bundle).map_err(|e| SetupError::Probe(e.to_string()))? {
        Some(p) => Probe { thresholds: p.thresholds.quantised(), ..p },
        None => {
            // No recorded logits: the built-in requests, answered by the f32 model here.
            let origin = Path::new("built-in probe requests");
            let mut rows = Vec::new();
            for request in probe_file::parse_requests(probe_file::DEFAULT_REQUESTS, origin)
                .map_err(|e| SetupError::Probe(e.to_string()))?
            {
                rows.extend(
                    probe_file::rows_of(bundle, &request, origin)
                        .map_err(|e| SetupError::Probe(e.to_string()))?
                        .into_iter()
                        .map(|(_, row)| row),
                );
            }
            let expected = run(&mut CpuBackend::load(ckpt, &bundle.config)?, &rows)?;
            Probe { rows, expected, thresholds: Thresholds::default().quantised() }
        }
    };
    let outputs = run(&mut CpuBackend::load_with(ckpt, &bundle.config, mode)?, &probe.rows)?;
    crate::platform::heap::release_freed();
    Ok(probe.judge(&outputs, None))
}

fn run(backend: &mut CpuBackend, rows: &[Row]) -> Result<Vec<crate::backend::RowResult>, SetupError> {
    let refs: Vec<&Row> = rows.iter().collect();
    backend
        .run(&refs)
        .map_err(|e| SetupError::Probe(format!("the {} backend failed on the probe: {e}", backend.name())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::probe::QUANTISED_MIN_AGREEMENT;

    fn fixture_models() -> Vec<std::path::PathBuf> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models");
        let mut models: Vec<_> = std::fs::read_dir(&root)
            .expect("fixture models")
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.join("model.safetensors").exists())
            .collect();
        models.sort();
        models.push(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo"));
        models
    }

    /// The figures of int8 against f32 on the built-in probe requests (60 rows each; the models
    /// are small: d = 32, 64, 128 and 64), measured 2026-12-05 with `Wqkv` in f32 and the other
    /// three dense products int8 (`encoder::qkv_mode`): bpe-small argmax 60/60, mean |dp| 0.0062,
    /// cosine 1.0000; bpe-t5 60/60, 0.0176, 0.9990; the demo 60/60 (clear decisions 59/59),
    /// 0.0073, 0.9998: these three pass. wp-t4 58/60, 0.0238, 0.9989 is refused (at 60 rows the
    /// gate's 0.99 allows no flip; its flipped rows are near ties, f32 margins 0.02 and 0.04,
    /// and no scheme measured kept them with int8 weights per channel). With all four products
    /// int8 (before) the demo and bpe-t5 flipped one row each and were refused. Held here: the
    /// verdicts, and the figures' order.
    #[test]
    fn int8_passes_its_probe_on_the_demo_bpe_small_and_bpe_t5_and_is_refused_on_wp_t4_where_it_flips() {
        for dir in fixture_models() {
            let bundle = HostBundle::load(&dir).expect("model");
            let report = judge(&dir, &bundle, CpuWeights::Int8).expect("judged");
            eprintln!("{}: cpu-int8 {}", dir.display(), report.figures);
            let f = &report.figures;
            assert_eq!(
                report.passed,
                f.agreement() >= QUANTISED_MIN_AGREEMENT && f.clear_agreement() >= QUANTISED_MIN_AGREEMENT
            );
            // Quantisation noise, not a broken product: the bundle defaults' cosine and |dp| hold.
            assert!(f.mean_cosine >= 0.998 && f.mean_dp <= 0.03, "{}: {f}", dir.display());
            assert!(f.rows >= 50 && f.agree + 3 >= f.rows, "{}: {f}", dir.display());
            let refused = dir.ends_with("wp-t4");
            assert_eq!(report.passed, !refused, "{}: {} ({f})", dir.display(), report.verdict);
        }
    }

    #[test]
    fn bf16_answers_like_f32_where_the_cpu_has_it_and_is_refused_by_name_where_it_has_not() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
        let bundle = HostBundle::load(&dir).expect("model");
        let mut config = Config::default();
        config.cpu.weights = CpuWeights::Bf16;
        match cpu::check_weights(CpuWeights::Bf16) {
            Ok(()) => {
                let report = judge(&dir, &bundle, CpuWeights::Bf16).expect("judged");
                eprintln!("demo: cpu-bf16 {}", report.figures);
                assert!(report.passed, "{} ({})", report.verdict, report.figures);
            }
            Err(why) => {
                let err = check(&config, &bundle).expect_err("refused");
                assert!(err.to_string().contains("cpu-bf16") && err.to_string().contains(&why), "{err}");
            }
        }
    }

    #[test]
    fn the_gate_judges_only_quantised_cpu_workers() {
        let mut config = Config::default();
        assert!(!gated(&config), "f32 is the reference");
        config.cpu.weights = CpuWeights::Int8;
        assert!(gated(&config));
        config.engine.backend = BackendKind::Qnn;
        assert!(!gated(&config), "no CPU worker");
        config.engine.fallback = Fallback::Cpu;
        assert!(gated(&config), "the CPU fallback runs the mode");
    }
}
