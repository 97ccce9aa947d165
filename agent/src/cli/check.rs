//! `laya-edge check --model DIR`: validates a model directory or bundle without running it:
//! the manifest, the checkpoint and tokenizer, the weights' header against the file and the
//! architecture, every file against its sha256, an RKNN graph's length against its own header,
//! a QNN graph's manifest entry against the binary (with `--qnn-system-lib`: sequence length, I/O,
//! tensors with their scale and offset), the probe's layout and its rows on every graph. Every
//! error names the file it is about.

use std::path::{Path, PathBuf};

use crate::bundle::{BundleError, HostBundle, MANIFEST, Manifest, graph_file};
use crate::cli::bundle::assemble::files_under;
use crate::engine::probe::{MIN_ROWS_PER_GRAPH, graph_name, probed_graphs, rows_per_graph};
use crate::engine::probe_file as probe;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle (or laya checkpoint) directory.
    #[arg(long)]
    model: PathBuf,
    /// libQnnSystem.so, to read a QNN bundle's context binaries and compare them with the
    /// manifest (default: qnn.system_lib of --config). Only their metadata is read.
    #[arg(long, value_name = "PATH")]
    qnn_system_lib: Option<PathBuf>,
    /// A configuration file, for qnn.system_lib.
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<(), String> {
    let config = crate::cli::load_config(args.config.as_deref())?;
    let system_lib = args.qnn_system_lib.or(config.qnn.system_lib);
    let report = check(&args.model, system_lib.as_deref()).map_err(|e| e.to_string())?;
    println!("{report}");
    Ok(())
}

/// What `laya-edge check --model DIR` found: the bundle loads, the checkpoint's weights load as
/// far as their header tells (`backend::cpu::CpuModel::check`: byte ranges inside the file, names and
/// shapes against the architecture), every file is what the manifest says, every graph file is
/// complete as far as its layout tells (`graph_file`), every QNN graph is what its manifest entry
/// says (with `qnn_system_lib`), the probe lays out as recorded and gives every graph
/// [`MIN_ROWS_PER_GRAPH`] rows.
pub fn check(dir: &Path, qnn_system_lib: Option<&Path>) -> Result<String, BundleError> {
    // As laya 0.4.15 reads it, the laya that knows every file a model directory may hold (a
    // calibration, a parallel layout): what 0.3.20 would ignore or refuse is checked too.
    let bundle = HostBundle::load_as(dir, laya_topics::wire::LayaVersion::V0_4_15)?;
    // The weights as the CPU model reads them (header, byte ranges, tensor names and shapes),
    // without reading a tensor: a plain checkpoint has no sha256 to catch a truncated file. In a
    // bundle, after the sha256 (which says more precisely what happened to a file it lists).
    let check_weights = |required: bool| match &bundle.checkpoint {
        Some(ckpt) if required || ckpt.join("model.safetensors").exists() => {
            crate::backend::cpu::CpuModel::check(ckpt, &bundle.config)
                .map(|()| true)
                .map_err(|e| BundleError::Checkpoint(e.to_string()))
        }
        _ => Ok(false),
    };
    let Some(m) = &bundle.manifest else {
        check_weights(true)?;
        return Ok(format!(
            "{}: a laya checkpoint, its model.safetensors header checked against the file and the architecture (no manifest: no sha256 to verify)",
            dir.display()
        ));
    };
    let files = m.verify_files(dir)?;
    let weights = check_weights(false)?;
    let mut size_only = Vec::new();
    for g in &m.graphs {
        if !g.file.is_file() {
            return Err(BundleError::Config {
                path: dir.join(MANIFEST),
                message: format!("graph {} does not exist", g.file.display()),
            });
        }
        if graph_file::check(&m.backend, &g.file)? == graph_file::Checked::SizeOnly {
            size_only.push(g.file.display().to_string());
        }
    }
    let qnn =
        if m.backend == "qnn" && !m.graphs.is_empty() { Some(qnn_binaries(&bundle, m, qnn_system_lib)?) } else { None };
    let probe = probe::of_bundle(&bundle)?;
    let split = match (&probe, &m.probe) {
        (Some(p), Some(spec)) => {
            let split = rows_per_graph(probed_graphs(&bundle.capacity).as_deref(), &p.rows);
            let short: Vec<String> = split
                .iter()
                .filter(|(_, n)| *n < MIN_ROWS_PER_GRAPH)
                .map(|(g, n)| format!("{} has {n}", graph_name(*g)))
                .collect();
            if !short.is_empty() {
                return Err(BundleError::Probe {
                    path: spec.file.clone(),
                    message: format!(
                        "{} probe rows, fewer than the {MIN_ROWS_PER_GRAPH} each graph is judged on: a graph without enough rows of its own length passes unseen; assemble the bundle again (`laya-edge bundle` fills every graph)",
                        short.join(", ")
                    ),
                });
            }
            let parts: Vec<String> = split.iter().map(|(g, n)| format!("{}: {n}", graph_name(*g))).collect();
            format!("{} rows ({})", p.rows.len(), parts.join(", "))
        }
        _ => "none".to_owned(),
    };
    let unlisted: Vec<String> =
        files_under(dir).unwrap_or_default().into_iter().filter(|f| !m.files.iter().any(|(n, _)| n == f)).collect();
    let mut out = format!(
        "{}: {} bundle, {} graph(s), {} file(s) verified by sha256, probe {split}",
        dir.display(),
        m.backend,
        m.graphs.len(),
        files,
    );
    if weights {
        out.push_str("; checkpoint weights checked");
    }
    if let Some(q) = qnn {
        out.push_str("; ");
        out.push_str(&q);
    }
    if m.files.is_empty() {
        out.push_str("; the manifest lists no sha256 (not assembled by laya-edge bundle)");
        if !size_only.is_empty() {
            out.push_str(&format!("; graphs whose completeness only their runtime can tell: {size_only:?}"));
        }
    } else if !unlisted.is_empty() {
        out.push_str(&format!("; files not in the manifest (not checked): {unlisted:?}"));
    }
    for g in m.graphs.iter().filter(|g| !m.usable(g)) {
        out.push_str(&format!("; {} is min-max calibrated above 128 tokens and will not be used", g.file.display()));
    }
    Ok(out)
}

/// A QNN bundle's binaries against its manifest: each graph's entry as `laya-edge bundle` would
/// write it from the binary (read through libQnnSystem, metadata only), compared with the entry
/// the manifest has. What the sentence in the report says, or the first graph that contradicts.
#[cfg(feature = "qnn")]
fn qnn_binaries(bundle: &HostBundle, m: &Manifest, system_lib: Option<&Path>) -> Result<String, BundleError> {
    use crate::cli::bundle::assemble::{contradictions, qnn_entry};
    let Some(lib) = system_lib else {
        return Ok("QNN binaries not compared with the manifest (pass --qnn-system-lib)".into());
    };
    let manifest = bundle.dir.join(MANIFEST);
    let system = crate::backend::npu::qnn::load_system(lib)
        .map_err(|e| BundleError::Config { path: lib.to_owned(), message: e.to_string() })?;
    let hidden = match &bundle.checkpoint {
        Some(ckpt) => crate::backend::cpu::config::EncoderConfig::load(&ckpt.join("encoder").join("config.json"))
            .map(|c| c.hidden_size)
            .map_err(|e| BundleError::Checkpoint(e.to_string()))?,
        None => return Ok("QNN binaries not compared with the manifest (the bundle has no checkpoint)".into()),
    };
    for g in &m.graphs {
        let (binary, _) = qnn_entry(&g.file, &system, hidden)
            .map_err(|message| BundleError::Graph { path: g.file.clone(), message })?;
        let wrong = contradictions(&g.raw, &binary);
        if !wrong.is_empty() {
            return Err(BundleError::Config {
                path: manifest,
                message: format!(
                    "graph {}: the manifest contradicts the binary: {}",
                    g.file.display(),
                    wrong.join("; ")
                ),
            });
        }
    }
    Ok(format!("{} QNN binaries match the manifest (sequence length, I/O, tensors, scale and offset)", m.graphs.len()))
}

#[cfg(not(feature = "qnn"))]
fn qnn_binaries(_: &HostBundle, _: &Manifest, _: Option<&Path>) -> Result<String, BundleError> {
    Ok("QNN binaries not compared with the manifest (this laya-edge was built without the qnn feature)".into())
}
