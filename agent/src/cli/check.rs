//! `laya-edge check --model DIR`: validates a model directory or bundle without running it:
//! the manifest, the checkpoint and tokenizer, the weights' header against the file and the
//! architecture, every file against its sha256, an RKNN graph's length against its own header,
//! the probe's layout. Every error names the file it is about.

use std::path::{Path, PathBuf};

use crate::bundle::{BundleError, HostBundle, MANIFEST, graph_file};
use crate::cli::bundle::assemble::files_under;
use crate::engine::probe_file as probe;

#[derive(clap::Args)]
pub struct Args {
    /// The bundle (or laya checkpoint) directory.
    #[arg(long)]
    model: PathBuf,
}

pub fn run(args: Args) -> Result<(), String> {
    let report = check(&args.model).map_err(|e| e.to_string())?;
    println!("{report}");
    Ok(())
}

/// What `laya-edge check --model DIR` found: the bundle loads, the checkpoint's weights load as
/// far as their header tells (`backend::cpu::CpuModel::check`: byte ranges inside the file, names and
/// shapes against the architecture), every file is what the manifest says, every graph file is
/// complete as far as its layout tells (`graph_file`), the probe lays out as recorded.
pub fn check(dir: &Path) -> Result<String, BundleError> {
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
    let probe = probe::of_bundle(&bundle)?;
    let unlisted: Vec<String> =
        files_under(dir).unwrap_or_default().into_iter().filter(|f| !m.files.iter().any(|(n, _)| n == f)).collect();
    let mut out = format!(
        "{}: {} bundle, {} graph(s), {} file(s) verified by sha256, probe {}",
        dir.display(),
        m.backend,
        m.graphs.len(),
        files,
        probe.map_or("none".to_owned(), |p| format!("{} rows", p.rows.len()))
    );
    if weights {
        out.push_str("; checkpoint weights checked");
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
