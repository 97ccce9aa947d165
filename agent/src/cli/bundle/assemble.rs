//! Assembling a bundle (`laya-edge bundle`): a laya checkpoint, the NPU graphs built from it,
//! a manifest that describes them from the graphs themselves, every file's sha256, and the
//! probe with the float model's answers.
//!
//! Nothing in the manifest is typed by hand: a QNN context binary's sequence length, tensor
//! names, data types and quantization come from the binary (read through libQnnSystem, the
//! only vendor library this touches, and only to read metadata); its calibration from the
//! description `tools/qnn` writes beside it (none: min-max, which the agent guards); an RKNN
//! graph's sequence length and marker slots from the description `tools/rknn` writes beside
//! it, else the RK3588 card's 512 and 64.

use std::path::{Path, PathBuf};

use laya_topics::json::{self, Style};
use laya_topics::wire::LayaVersion;
use laya_topics::{Map, Value};

use super::make_probe;
use crate::backend::Backend;
use crate::bundle::{AgentConfig, HostBundle, MANIFEST, digest, read_json};
use crate::engine::probe_file as probe;
use crate::prompt::OptionLayout;

/// What `laya-edge bundle` is asked to do.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    pub checkpoint: PathBuf,
    pub out: PathBuf,
    pub qnn: Vec<PathBuf>,
    pub rknn: Vec<PathBuf>,
    /// JSON-lines requests for the probe (else [`probe::DEFAULT_REQUESTS`]).
    pub probe_requests: Option<PathBuf>,
    /// Serve min-max graphs above 128 tokens anyway (the probe must then prove them).
    pub allow_minmax_above_128: bool,
    /// libQnnSystem.so, to read QNN binaries.
    pub qnn_system_lib: Option<PathBuf>,
    /// Runtime versions the graphs are known to work with (else what the graphs say).
    pub runtime_allowlist: Vec<String>,
}

/// What was written.
#[derive(Debug, Clone)]
pub struct Summary {
    pub backend: String,
    pub graphs: Vec<String>,
    pub files: usize,
    pub probe_rows: usize,
    /// How the probe's rows split over the graphs (each is judged on its own).
    pub probe_split: Vec<make_probe::GraphRows>,
    /// Graphs the agent will not use, and why.
    pub warnings: Vec<String>,
}

/// Copies a directory tree (files and directories only; symlinks are followed).
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    std::fs::create_dir_all(to).map_err(|e| format!("cannot create {}: {e}", to.display()))?;
    let entries = std::fs::read_dir(from).map_err(|e| format!("cannot read {}: {e}", from.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", from.display()))?;
        let (src, dst) = (entry.path(), to.join(entry.file_name()));
        if src.is_dir() {
            copy_tree(&src, &dst)?;
        } else {
            std::fs::copy(&src, &dst)
                .map_err(|e| format!("cannot copy {} to {}: {e}", src.display(), dst.display()))?;
        }
    }
    Ok(())
}

/// Every file under `dir` (relative, `/`-separated), sorted, except the manifest.
pub(crate) fn files_under(dir: &Path) -> Result<Vec<String>, String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) -> Result<(), String> {
        for entry in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
            let path = entry.map_err(|e| e.to_string())?.path();
            if path.is_dir() {
                walk(root, &path, out)?;
            } else if let Ok(rel) = path.strip_prefix(root) {
                let rel: Vec<String> = rel.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
                out.push(rel.join("/"));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.retain(|f| f != MANIFEST);
    out.sort();
    Ok(out)
}

/// The description a graph tool wrote beside `file`: a `.json` whose `files.context_binary`
/// names it (tools/qnn), else `<file stem>.json` (tools/rknn).
fn sidecar(file: &Path) -> Result<Option<(PathBuf, Value)>, String> {
    let (Some(dir), Some(name)) = (file.parent(), file.file_name().and_then(|n| n.to_str())) else { return Ok(None) };
    let stem = file.with_extension("json");
    if stem.is_file() {
        return read_json(&stem).map(|v| Some((stem, v))).map_err(|e| e.to_string());
    }
    let Ok(entries) = std::fs::read_dir(dir) else { return Ok(None) };
    let mut candidates: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    candidates.sort();
    for path in candidates {
        if let Ok(v) = read_json(&path)
            && v.get("files").and_then(|f| f.get("context_binary")).and_then(Value::as_str) == Some(name)
        {
            return Ok(Some((path, v)));
        }
    }
    Ok(None)
}

fn file_name(file: &Path) -> Result<String, String> {
    file.file_name()
        .and_then(|n| n.to_str())
        .map(str::to_owned)
        .ok_or_else(|| format!("{}: not a file name", file.display()))
}

/// A QNN graph's manifest entry, from the binary itself (and its build id). `check` compares a
/// manifest's entries with it ([`contradictions`]).
#[cfg(feature = "qnn")]
pub(crate) fn qnn_entry(
    file: &Path,
    system: &crate::backend::npu::qnn::abi::SystemFunctions,
    hidden: usize,
) -> Result<(Map, String), String> {
    use crate::backend::npu::qnn::binary::{self, Encoding};
    let bytes = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let meta = binary::read(system, &bytes).map_err(|e| format!("{}: {e}", file.display()))?;
    let g = &meta.graph;
    let logical = ["inputs_embeds", "gmask", "smask"];
    // A compiled name is the logical one, or it with a suffix (`inputs_embeds:0`).
    let find = |want: &str| -> Option<&binary::TensorMeta> {
        g.inputs.iter().find(|t| {
            t.name == want
                || t.name.strip_prefix(want).is_some_and(|rest| rest.starts_with(|c: char| !c.is_alphanumeric()))
        })
    };
    let mut names = Map::new();
    let mut tensors = Vec::new();
    let mut io = None;
    for want in logical {
        let t = find(want).ok_or_else(|| {
            let have: Vec<&str> = g.inputs.iter().map(|t| t.name.as_str()).collect();
            format!(
                "{}: the graph has no input {want} (its inputs: {have:?}); is it a laya encoder graph?",
                file.display()
            )
        })?;
        let flavour = match t.encoding {
            Encoding::Float32 | Encoding::Float16 => "float",
            Encoding::Ufixed16 { .. } => "ufixed16",
        };
        if *io.get_or_insert(flavour) != flavour {
            return Err(format!("{}: inputs mix float and ufixed16 I/O", file.display()));
        }
        if t.name != want {
            names.insert(want.into(), t.name.as_str().into());
        }
        tensors.push(tensor_value("input", want, t));
    }
    let [out] = g.outputs.as_slice() else {
        return Err(format!(
            "{}: the graph has {} outputs; a laya encoder graph has one (hidden)",
            file.display(),
            g.outputs.len()
        ));
    };
    if out.name != "hidden" {
        names.insert("hidden".into(), out.name.as_str().into());
    }
    tensors.push(tensor_value("output", "hidden", out));
    let dims = &find("inputs_embeds").map(|t| t.dims.clone()).unwrap_or_default();
    let [1, l, d] = dims.as_slice() else {
        return Err(format!("{}: inputs_embeds has dims {dims:?}, expected [1, L, hidden]", file.display()));
    };
    if *d as usize != hidden {
        return Err(format!(
            "{}: the graph's hidden size is {d} but the checkpoint's encoder has {hidden}: built from another checkpoint",
            file.display()
        ));
    }
    let mut m = Map::new();
    m.insert("seq_len".into(), Value::int(i64::from(*l)));
    m.insert("io".into(), io.unwrap_or("float").into());
    m.insert("graph_name".into(), g.name.as_str().into());
    m.insert("build_id".into(), meta.build_id.as_str().into());
    m.insert("soc".into(), meta.soc_version.as_deref().filter(|s| !s.is_empty()).map_or(Value::Null, Value::from));
    if !names.is_empty() {
        m.insert("tensor_names".into(), Value::Object(names));
    }
    m.insert("tensors".into(), Value::Array(tensors));
    Ok((m, meta.build_id.clone()))
}

#[cfg(feature = "qnn")]
fn tensor_value(role: &str, logical: &str, t: &crate::backend::npu::qnn::binary::TensorMeta) -> Value {
    use crate::backend::npu::qnn::binary::Encoding;
    let mut m = Map::new();
    m.insert("role".into(), role.into());
    m.insert("logical".into(), logical.into());
    m.insert("name".into(), t.name.as_str().into());
    m.insert("dims".into(), Value::Array(t.dims.iter().map(|&d| Value::int(i64::from(d))).collect()));
    let (dtype, scale, offset) = match t.encoding {
        Encoding::Float32 => ("float32", None, None),
        Encoding::Float16 => ("float16", None, None),
        Encoding::Ufixed16 { scale, offset } => ("ufixed16", Some(scale), Some(offset)),
    };
    m.insert("data_type".into(), dtype.into());
    m.insert("scale".into(), scale.map_or(Value::Null, |s| Value::Float(f64::from(s))));
    m.insert("offset".into(), offset.map_or(Value::Null, |o| Value::int(i64::from(o))));
    Value::Object(m)
}

/// Where a QNN graph's manifest entry (`manifest`) says something else than the entry made from
/// its binary (`binary`, [`qnn_entry`]): the graph's length, I/O flavour, name and build id, and
/// each tensor's name, dims, data type, scale and offset, in a sentence each. A key the manifest
/// does not have is not compared (a hand-written manifest may say less); one it has must agree.
/// Scales agree within a relative 1e-6 (both are the f32 the binary holds, written as a double).
pub fn contradictions(manifest: &Value, binary: &Map) -> Vec<String> {
    let mut wrong = Vec::new();
    let text = |v: &Value| json::to_string(v, Style::COMPACT);
    for key in ["seq_len", "io", "graph_name", "build_id"] {
        if let (Some(said), Some(is)) = (manifest.get(key), binary.get(key))
            && said != is
        {
            wrong.push(format!("{key} is {} in the manifest, {} in the binary", text(said), text(is)));
        }
    }
    let Some(said) = manifest.get("tensors").and_then(Value::as_array) else { return wrong };
    let is = binary.get("tensors").and_then(Value::as_array).unwrap_or_default();
    for t in said {
        let logical = t.get("logical").and_then(Value::as_str).unwrap_or_default();
        let Some(b) = is.iter().find(|b| b.get("logical").and_then(Value::as_str) == Some(logical)) else {
            wrong.push(format!("the manifest lists a tensor {} the binary does not have", text(t)));
            continue;
        };
        for key in ["name", "dims", "data_type", "scale", "offset"] {
            let (Some(x), Some(y)) = (t.get(key), b.get(key)) else { continue };
            let same = match (x.as_f64(), y.as_f64()) {
                (Some(x), Some(y)) if key == "scale" => (x - y).abs() <= 1e-6 * y.abs().max(f64::MIN_POSITIVE),
                (Some(x), Some(y)) => x == y,
                _ => x == y,
            };
            if !same {
                wrong.push(format!("{logical} {key} is {} in the manifest, {} in the binary", text(x), text(y)));
            }
        }
    }
    wrong
}

/// The QAIRT release in a build id (`v2.51.0.260929181845` -> `2.51.0`).
pub fn qairt_release(build_id: &str) -> Option<String> {
    let parts: Vec<&str> = build_id.trim_start_matches('v').split('.').take(3).collect();
    (parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit())))
        .then(|| parts.join("."))
}

#[cfg(feature = "qnn")]
fn qnn_graphs(plan: &Plan, hidden: usize, graphs_dir: &Path) -> Result<(Vec<Value>, Vec<String>), String> {
    let lib = plan.qnn_system_lib.as_deref().ok_or(
        "reading QNN context binaries needs libQnnSystem.so: pass --qnn-system-lib (or set qnn.system_lib in --config)",
    )?;
    let system = crate::backend::npu::qnn::load_system(lib).map_err(|e| e.to_string())?;
    let mut entries = Vec::new();
    let mut releases = Vec::new();
    for file in &plan.qnn {
        let (mut m, build_id) = qnn_entry(file, &system, hidden)?;
        let name = file_name(file)?;
        let side = sidecar(file)?;
        let calibration = side.as_ref().and_then(|(_, v)| v.get("calibration")).and_then(Value::as_str);
        m.insert("calibration".into(), calibration.map_or(Value::Null, Value::from));
        if let Some((_, v)) = &side {
            m.insert("mask_clip".into(), v.get("mask_clip").cloned().unwrap_or(Value::Null));
        }
        std::fs::copy(file, graphs_dir.join(&name)).map_err(|e| format!("cannot copy {}: {e}", file.display()))?;
        let mut entry = Map::new();
        entry.insert("file".into(), format!("graphs/{name}").into());
        for (k, v) in m {
            entry.insert(k, v);
        }
        entries.push(Value::Object(entry));
        if let Some(r) = qairt_release(&build_id)
            && !releases.contains(&r)
        {
            releases.push(r);
        }
    }
    Ok((entries, releases))
}

#[cfg(not(feature = "qnn"))]
fn qnn_graphs(_: &Plan, _: usize, _: &Path) -> Result<(Vec<Value>, Vec<String>), String> {
    Err("this laya-edge was built without the qnn feature: it cannot read QNN context binaries".into())
}

fn rknn_graphs(plan: &Plan, graphs_dir: &Path) -> Result<Vec<Value>, String> {
    let mut entries = Vec::new();
    for file in &plan.rknn {
        let name = file_name(file)?;
        let side = sidecar(file)?;
        let uint = |k: &str, default: i64| -> Result<i64, String> {
            match side.as_ref().and_then(|(_, v)| v.get(k)) {
                None => Ok(default),
                Some(v) => v.as_i64().filter(|v| *v > 0).ok_or_else(|| {
                    format!(
                        "{}: '{k}' must be a positive integer",
                        side.as_ref().map_or(file.clone(), |(p, _)| p.clone()).display()
                    )
                }),
            }
        };
        let mut m = Map::new();
        m.insert("file".into(), format!("graphs/{name}").into());
        m.insert("seq_len".into(), Value::int(uint("seq_len", 512)?));
        m.insert("marker_slots".into(), Value::int(uint("marker_slots", 64)?));
        if let Some((_, v)) = &side {
            for k in ["target", "dtype", "toolkit"] {
                if let Some(x) = v.get(k) {
                    m.insert(k.into(), x.clone());
                }
            }
        }
        std::fs::copy(file, graphs_dir.join(&name)).map_err(|e| format!("cannot copy {}: {e}", file.display()))?;
        entries.push(Value::Object(m));
    }
    Ok(entries)
}

fn write_manifest(out: &Path, manifest: &Map) -> Result<(), String> {
    let text = json::to_string(&Value::Object(manifest.clone()), Style::PYTHON);
    std::fs::write(out.join(MANIFEST), text + "\n")
        .map_err(|e| format!("cannot write {}: {e}", out.join(MANIFEST).display()))
}

/// Assembles the bundle `plan` describes, making the probe with `cpu` (the float model).
pub fn assemble(
    plan: &Plan,
    load_cpu: impl FnOnce(&HostBundle) -> Result<Box<dyn Backend>, String>,
) -> Result<Summary, String> {
    if !plan.qnn.is_empty() && !plan.rknn.is_empty() {
        return Err("a bundle holds graphs for one backend: give --qnn or --rknn, not both".into());
    }
    // A checkpoint laya can load, before anything is copied (as laya 0.4.15 reads it, which
    // knows every file and layout a checkpoint may have), and one the graphs can run.
    let checkpoint = AgentConfig::load_as(&plan.checkpoint, LayaVersion::V0_4_15).map_err(|e| e.to_string())?;
    let parallel = checkpoint.option_layout == OptionLayout::Parallel;
    if parallel && !(plan.qnn.is_empty() && plan.rknn.is_empty()) {
        return Err("this checkpoint lays its options out in parallel (option_layout 'parallel'): the NPU graphs take no position ids and no option mask, so they cannot run it; serve the checkpoint on the cpu backend with [model] laya = \"0.4.15\"".into());
    }
    let laya = if parallel { LayaVersion::V0_4_15 } else { LayaVersion::default() };
    if plan.out.exists() && std::fs::read_dir(&plan.out).map(|mut d| d.next().is_some()).unwrap_or(true) {
        return Err(format!("{} exists and is not empty: choose a new directory", plan.out.display()));
    }
    let built_in = probe::parse_requests(probe::DEFAULT_REQUESTS, Path::new("the default probe requests"))
        .map_err(|e| e.to_string())?;
    let requests = match &plan.probe_requests {
        Some(p) => {
            let text = std::fs::read_to_string(p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
            probe::parse_requests(&text, p).map_err(|e| e.to_string())?
        }
        None => built_in.clone(),
    };
    copy_tree(&plan.checkpoint, &plan.out.join("checkpoint"))?;
    let hidden = crate::backend::cpu::config::EncoderConfig::load(
        &plan.out.join("checkpoint").join("encoder").join("config.json"),
    )
    .map(|c| c.hidden_size)
    .map_err(|e| e.to_string())?;
    let graphs_dir = plan.out.join("graphs");
    let (backend, graphs, mut allowlist) = if !plan.qnn.is_empty() {
        std::fs::create_dir_all(&graphs_dir).map_err(|e| format!("cannot create {}: {e}", graphs_dir.display()))?;
        let (g, releases) = qnn_graphs(plan, hidden, &graphs_dir)?;
        ("qnn", g, releases)
    } else if !plan.rknn.is_empty() {
        std::fs::create_dir_all(&graphs_dir).map_err(|e| format!("cannot create {}: {e}", graphs_dir.display()))?;
        ("rknn", rknn_graphs(plan, &graphs_dir)?, vec!["2.3.2".to_owned()])
    } else {
        ("cpu", Vec::new(), Vec::new())
    };
    if !plan.runtime_allowlist.is_empty() {
        allowlist = plan.runtime_allowlist.clone();
    }
    let mut manifest = Map::new();
    manifest.insert("format".into(), Value::int(1));
    manifest.insert("backend".into(), backend.into());
    manifest.insert("checkpoint".into(), "checkpoint".into());
    manifest.insert("graphs".into(), Value::Array(graphs));
    manifest.insert("runtime_allowlist".into(), Value::Array(allowlist.iter().map(|s| s.as_str().into()).collect()));
    if plan.allow_minmax_above_128 {
        manifest.insert("allow_minmax_above_128".into(), Value::Bool(true));
    }
    write_manifest(&plan.out, &manifest)?;

    // The probe: laid out for this bundle (its graphs' capacity), answered by the float model.
    let bundle = HostBundle::load_as(&plan.out, laya).map_err(|e| e.to_string())?;
    let mut warnings = Vec::new();
    if let Some(m) = &bundle.manifest {
        for g in m.graphs.iter().filter(|g| !m.usable(g)) {
            warnings.push(format!(
                "{}: a min-max calibrated graph ({} tokens) without a mask clip is not used above 128 tokens (min-max over the raw masks collapses there); build it with tools/qnn (masks clipped) or sqnr calibration, or pass --allow-minmax-above-128 if the probe shows it holds",
                g.file.display(),
                g.seq_len
            ));
        }
    }
    let mut cpu = load_cpu(&bundle)?;
    let made = make_probe::make(&bundle, cpu.as_mut(), &requests, &built_in)?;
    std::fs::write(plan.out.join("probe.jsonl"), &made.text).map_err(|e| format!("cannot write the probe: {e}"))?;
    let mut p = Map::new();
    p.insert("file".into(), "probe.jsonl".into());
    let t = crate::engine::probe::Thresholds::default();
    p.insert("min_agreement".into(), Value::Float(t.min_agreement));
    p.insert("min_clear_agreement".into(), Value::Float(t.min_clear_agreement));
    p.insert("min_cosine".into(), Value::Float(t.min_cosine));
    p.insert("max_mean_dp".into(), Value::Float(t.max_mean_dp));
    manifest.insert("probe".into(), Value::Object(p));

    let names = files_under(&plan.out)?;
    let mut files = Map::new();
    for name in &names {
        let path = plan.out.join(name);
        let d = digest::sha256_file(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        files.insert(name.clone(), d.into());
    }
    manifest.insert("files".into(), Value::Object(files));
    write_manifest(&plan.out, &manifest)?;
    let graphs = bundle
        .manifest
        .as_ref()
        .map(|m| m.graphs.iter().map(|g| g.file.display().to_string()).collect())
        .unwrap_or_default();
    Ok(Summary {
        backend: backend.into(),
        graphs,
        files: names.len(),
        probe_rows: made.rows,
        probe_split: made.split,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json::ParseOptions;

    /// A manifest entry as `qnn_entry` writes one (the demo's 128-token u16io binary).
    fn entry() -> Value {
        json::parse_str(
            r#"{"file": "graphs/enc.bin", "seq_len": 128, "io": "ufixed16", "graph_name": "enc_L128", "build_id": "v2.51.0.260929181845",
                "tensors": [{"role": "input", "logical": "inputs_embeds", "name": "inputs_embeds", "dims": [1, 128, 64], "data_type": "ufixed16", "scale": 1.646630739e-05, "offset": -33392},
                            {"role": "output", "logical": "hidden", "name": "hidden", "dims": [1, 128, 64], "data_type": "ufixed16", "scale": 0.0001, "offset": -32768}]}"#,
            ParseOptions::default(),
        )
        .expect("json")
    }

    fn binary() -> Map {
        match entry() {
            Value::Object(mut m) => {
                m.shift_remove("file");
                m
            }
            _ => unreachable!(),
        }
    }

    fn edited(edit: impl FnOnce(&mut Value)) -> Value {
        let mut v = entry();
        edit(&mut v);
        v
    }

    fn tensor(v: &mut Value, i: usize) -> &mut Map {
        match v {
            Value::Object(m) => match m.get_mut("tensors") {
                Some(Value::Array(a)) => match &mut a[i] {
                    Value::Object(t) => t,
                    _ => unreachable!(),
                },
                _ => unreachable!(),
            },
            _ => unreachable!(),
        }
    }

    #[test]
    fn a_manifest_whose_scale_or_offset_contradicts_the_binary_is_named_by_tensor_and_field() {
        assert_eq!(contradictions(&entry(), &binary()), Vec::<String>::new(), "the binary's own entry");
        // An input scale 10x too small, and an offset with its sign flipped.
        let wrong = edited(|v| {
            tensor(v, 0).insert("scale".into(), Value::Float(1.646630739e-06));
            tensor(v, 1).insert("offset".into(), Value::int(32768));
        });
        assert_eq!(
            contradictions(&wrong, &binary()),
            [
                "inputs_embeds scale is 1.646630739e-06 in the manifest, 1.646630739e-05 in the binary",
                "hidden offset is 32768 in the manifest, -32768 in the binary"
            ]
        );
        let wrong = edited(|v| {
            if let Value::Object(m) = v {
                m.insert("seq_len".into(), Value::int(256));
            }
        });
        assert_eq!(contradictions(&wrong, &binary()), ["seq_len is 256 in the manifest, 128 in the binary"]);
        // The same f32 written with fewer digits is the same scale; what the manifest does not
        // say is not compared.
        let rounded = edited(|v| {
            tensor(v, 0).insert("scale".into(), Value::Float(1.6466307e-05));
            tensor(v, 1).shift_remove("offset");
        });
        assert_eq!(contradictions(&rounded, &binary()), Vec::<String>::new());
    }
}
