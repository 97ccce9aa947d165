//! Model directories: what the host pipeline needs from them.
//!
//! Two kinds exist. A **laya checkpoint** is what `laya.Agent` loads: `rl_agent_config.json`,
//! `tokenizer/`, `encoder/config.json`, `model.safetensors`; laya-edge also reads an optional
//! `lang_temperatures.json` beside the config (laya takes per-language temperatures as a
//! constructor argument, a file is how a board gets them). An **NPU bundle** is a directory with
//! a `laya-bundle.json` manifest naming its backend, graph files, tokenizer, temperatures and
//! token budget, and optionally a checkpoint (for the CPU fallback and the host-side head).

pub mod digest;
pub mod graph_file;

use std::path::{Path, PathBuf};

use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use laya_topics::wire::LayaVersion;

use crate::decide::{TemperatureError, Temperatures};
use crate::prompt::tokenizer::SpecialTokenNames;
use crate::prompt::{Capacity, Limits, OptionLayout, RowShape, Tokenizer, TokenizerError};

/// The manifest file that marks an NPU bundle.
pub const MANIFEST: &str = "laya-bundle.json";

/// laya 0.4.15's calibration file in a checkpoint directory (read only under 0.4.15 semantics).
pub const CALIBRATION: &str = "calibration.json";

/// Why a model directory could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error(
        "model directory {0} does not exist: name one with --model DIR (or model.dir in the configuration); `laya-edge serve --demo` serves the bundled demo model"
    )]
    NoDirectory(PathBuf),
    #[error(
        "incompatible model: {0} does not contain 'rl_agent_config.json'; that file ships with the weights of a Laya checkpoint"
    )]
    NoConfig(PathBuf),
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("incompatible model config {path}: {message}")]
    Config { path: PathBuf, message: String },
    #[error(transparent)]
    Temperature(#[from] TemperatureError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path} is corrupt or was replaced: its sha256 is {found}, the manifest says {expected}")]
    Digest { path: PathBuf, expected: String, found: String },
    #[error("{path}: {message}")]
    Probe { path: PathBuf, message: String },
    #[error("graph {path}: {message}")]
    Graph { path: PathBuf, message: String },
    /// The checkpoint's weights or encoder config as the CPU model would load them (the
    /// message names the file).
    #[error("the checkpoint cannot be loaded: {0}")]
    Checkpoint(String),
}

/// What `rl_agent_config.json` says.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentConfig {
    /// The encoder's name or path (informational: the architecture comes from `encoder/`).
    pub encoder: String,
    /// Decision-head transformer layers.
    pub head_layers: usize,
    /// Act head classes: `len(act_costs) + 1`.
    pub n_act: usize,
    /// The checkpoint's token budget (laya's defaults 512 and 192).
    pub limits: Limits,
    pub temperatures: Temperatures,
    /// How options are laid out (`option_layout`, laya 0.4.15; sequential before it).
    pub option_layout: OptionLayout,
}

/// Reads a JSON file with Python's semantics (`NaN` allowed, key order kept).
pub fn read_json(path: &Path) -> Result<Value, BundleError> {
    let bytes = std::fs::read(path).map_err(|source| BundleError::Read { path: path.to_owned(), source })?;
    json::parse(&bytes, ParseOptions::default())
        .map_err(|e| BundleError::Parse { path: path.to_owned(), message: e.to_string() })
}

impl AgentConfig {
    /// Reads `dir/rl_agent_config.json` and the optional `dir/lang_temperatures.json`, as laya
    /// 0.3.20 does.
    pub fn load(dir: &Path) -> Result<AgentConfig, BundleError> {
        AgentConfig::load_as(dir, LayaVersion::V0_3_20)
    }

    /// [`AgentConfig::load`] as `laya`'s version reads a checkpoint: under 0.4.15 the language
    /// tables follow its stricter rules and an optional `dir/calibration.json` replaces the
    /// temperatures; a parallel `option_layout` is refused under 0.3.20, which has none.
    pub fn load_as(dir: &Path, laya: LayaVersion) -> Result<AgentConfig, BundleError> {
        if !dir.is_dir() {
            return Err(BundleError::NoDirectory(dir.to_owned()));
        }
        let path = dir.join("rl_agent_config.json");
        if !path.is_file() {
            return Err(BundleError::NoConfig(dir.to_owned()));
        }
        let cfg = read_json(&path)?;
        let bad = |message: String| BundleError::Config { path: path.clone(), message };
        if !matches!(cfg, Value::Object(_)) {
            return Err(bad("expected a JSON object".into()));
        }
        let missing: Vec<&str> = ["encoder", "head_layers"].into_iter().filter(|k| cfg.get(k).is_none()).collect();
        if !missing.is_empty() {
            return Err(bad(format!("missing configuration keys {missing:?}")));
        }
        let count = |key: &str, default: i64| -> Result<i64, BundleError> {
            match cfg.get(key) {
                None => Ok(default),
                Some(v) => v.as_i64().ok_or_else(|| bad(format!("'{key}' must be an integer"))),
            }
        };
        let head_layers =
            usize::try_from(count("head_layers", 2)?).map_err(|_| bad("'head_layers' must not be negative".into()))?;
        let limits = Limits { max_len: count("max_len", 512)?, head_max_len: count("head_max_len", 192)? };
        let n_act = match cfg.get("act_costs") {
            None | Some(Value::Null) => 1,
            Some(Value::Object(m)) => m.len() + 1,
            Some(Value::Array(a)) => a.len() + 1,
            Some(_) => return Err(bad("'act_costs' must be an object".into())),
        };
        let option_layout = option_layout(cfg.get("option_layout"), laya).map_err(bad)?;
        let encoder = cfg.get("encoder").and_then(Value::as_str).unwrap_or_default().to_owned();
        let langs_path = dir.join("lang_temperatures.json");
        let langs = if langs_path.is_file() { Some(read_json(&langs_path)?) } else { None };
        let mut temperatures = Temperatures::from_config_as(
            laya,
            cfg.get("temperature"),
            cfg.get("temperature_by_options"),
            langs.as_ref(),
        )
        .map_err(|e| match e {
            TemperatureError::Laya(message) => BundleError::Config { path: langs_path.clone(), message },
            e => e.into(),
        })?;
        let calibration = dir.join(CALIBRATION);
        if laya.is_0_4() && calibration.is_file() {
            crate::decide::calibration::apply(&mut temperatures, &read_json(&calibration)?)
                .map_err(|e| BundleError::Config { path: calibration.clone(), message: e.to_string() })?;
        }
        Ok(AgentConfig { encoder, head_layers, n_act, limits, temperatures, option_layout })
    }
}

/// The option layouts laya knows (laya 0.4.15's `OPTION_LAYOUTS`).
const OPTION_LAYOUTS: [&str; 2] = ["sequential", "parallel"];

/// Reads a checkpoint's `option_layout` (laya 0.4.15; absent before it, and in every published
/// checkpoint: `"sequential"`). A `"parallel"` checkpoint (written by `laya-train`: options start
/// at one position and do not attend to each other) needs laya 0.4.15's semantics: under 0.3.20,
/// which has no such layout, it is refused rather than answered wrongly. A value laya does not
/// know is refused under either, with laya's own message.
fn option_layout(value: Option<&Value>, laya: LayaVersion) -> Result<OptionLayout, String> {
    match value {
        None => Ok(OptionLayout::Sequential),
        Some(Value::Str(s)) if s == "sequential" => Ok(OptionLayout::Sequential),
        Some(Value::Str(s)) if s == "parallel" && laya.is_0_4() => Ok(OptionLayout::Parallel),
        Some(Value::Str(s)) if s == "parallel" => Err(format!(
            "option_layout 'parallel' (options side by side, not attending to each other) is laya 0.4.15's and this model is served as laya {laya}, which lays options out one after another: the checkpoint was not trained on that. Serve it with [model] laya = \"0.4.15\" (--laya 0.4.15)"
        )),
        Some(v) => Err(format!(
            "option_layout must be one of {}, got {}",
            OPTION_LAYOUTS.join(", "),
            crate::prompt::pyrepr::repr(v)
        )),
    }
}

/// How a graph's activations were calibrated (the manifest's `calibration`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Calibration {
    MinMax,
    Sqnr,
    Other,
}

impl Calibration {
    /// The manifest's label. Only a method known not to collapse lifts the min-max guard: a
    /// graph without a label, or with one we do not know (a typo included), is min-max.
    pub fn parse(s: Option<&str>) -> Calibration {
        match s.map(|s| s.to_ascii_lowercase().replace(['-', '_', ' '], "")) {
            Some(s) if s == "sqnr" => Calibration::Sqnr,
            Some(s) if ["entropy", "percentile", "mse"].contains(&s.as_str()) => Calibration::Other,
            _ => Calibration::MinMax,
        }
    }
}

/// Above this many tokens min-max calibration collapses the marker signal (every decision
/// becomes 0.5 at 256 on the product model), so min-max graphs longer than this are not used
/// unless the manifest says `allow_minmax_above_128`.
pub const MINMAX_MAX_TOKENS: usize = 128;

/// One compiled graph of an NPU bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphSpec {
    /// The graph file (absolute: resolved against the bundle directory).
    pub file: PathBuf,
    /// The sequence length it was compiled for.
    pub seq_len: usize,
    /// Option marker slots (RKNN graphs); 0 where the graph has none.
    pub marker_slots: usize,
    /// How its activations were calibrated (`min-max`, `sqnr`), where that matters.
    pub calibration: Option<String>,
    /// The additive masks' clip used in calibration (`tools/qnn`'s `mask_clip`), if any.
    pub mask_clip: Option<f64>,
    /// The graph's entry as written, for backend-specific fields.
    pub raw: Value,
}

/// `laya-bundle.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Manifest {
    /// The backend the graphs are for (`rknn`, `qnn`).
    pub backend: String,
    /// A laya checkpoint directory inside or beside the bundle, if it ships one.
    pub checkpoint: Option<PathBuf>,
    pub graphs: Vec<GraphSpec>,
    /// Runtime versions the graphs are known to work with (empty: any).
    pub runtime_allowlist: Vec<String>,
    /// Use min-max calibrated graphs above [`MINMAX_MAX_TOKENS`] anyway (test bundles).
    pub allow_minmax_above_128: bool,
    /// Every file of the bundle (relative to it) with its sha256 (`files`); empty in a
    /// hand-written manifest.
    pub files: Vec<(String, String)>,
    /// The probe and its thresholds (`probe`), if the bundle has one.
    pub probe: Option<ProbeSpec>,
    /// The whole manifest, for backend-specific sections.
    pub raw: Value,
}

impl Manifest {
    fn load(dir: &Path) -> Result<Manifest, BundleError> {
        let path = dir.join(MANIFEST);
        let raw = read_json(&path)?;
        let bad = |message: String| BundleError::Config { path: path.clone(), message };
        let backend = raw
            .get("backend")
            .and_then(Value::as_str)
            .ok_or_else(|| bad("'backend' must name the backend the graphs are for".into()))?
            .to_owned();
        let checkpoint = match raw.get("checkpoint") {
            None | Some(Value::Null) => None,
            Some(Value::Str(p)) => Some(dir.join(p)),
            Some(_) => return Err(bad("'checkpoint' must be a path".into())),
        };
        let mut graphs = Vec::new();
        for g in raw.get("graphs").and_then(Value::as_array).unwrap_or_default() {
            let file = g.get("file").and_then(Value::as_str).ok_or_else(|| bad("every graph needs a 'file'".into()))?;
            let uint = |k: &str| g.get(k).and_then(Value::as_i64).and_then(|v| usize::try_from(v).ok());
            graphs.push(GraphSpec {
                file: dir.join(file),
                seq_len: uint("seq_len")
                    .ok_or_else(|| bad(format!("graph {file}: 'seq_len' must be a positive integer")))?,
                marker_slots: uint("marker_slots").unwrap_or(0),
                calibration: g.get("calibration").and_then(Value::as_str).map(str::to_owned),
                mask_clip: g.get("mask_clip").and_then(Value::as_f64).filter(|c| c.is_finite() && *c > 0.0),
                raw: g.clone(),
            });
        }
        let runtime_allowlist = raw
            .get("runtime_allowlist")
            .and_then(Value::as_array)
            .unwrap_or_default()
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        let allow_minmax_above_128 = matches!(raw.get("allow_minmax_above_128"), Some(Value::Bool(true)));
        let mut files = Vec::new();
        match raw.get("files") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (name, digest) in m {
                    let digest = digest
                        .as_str()
                        .filter(|d| digest::is_sha256(d))
                        .ok_or_else(|| bad(format!("files: the sha256 of {name} must be 64 lowercase hex digits")))?;
                    if Path::new(name).is_absolute() || name.split('/').any(|c| c == "..") {
                        return Err(bad(format!("files: {name} must be a path inside the bundle")));
                    }
                    files.push((name.clone(), digest.to_owned()));
                }
            }
            Some(_) => return Err(bad("'files' must map file names to their sha256".into())),
        }
        let probe = match raw.get("probe") {
            None | Some(Value::Null) => None,
            Some(p) => Some(ProbeSpec::parse(p, dir).map_err(bad)?),
        };
        Ok(Manifest { backend, checkpoint, graphs, runtime_allowlist, allow_minmax_above_128, files, probe, raw })
    }

    /// Checks every file the manifest lists against its sha256; the first that differs (or
    /// cannot be read) is named.
    pub fn verify_files(&self, dir: &Path) -> Result<usize, BundleError> {
        for (name, expected) in &self.files {
            let path = dir.join(name);
            let found =
                digest::sha256_file(&path).map_err(|source| BundleError::Read { path: path.clone(), source })?;
            if found != *expected {
                return Err(BundleError::Digest { path, expected: expected.clone(), found });
            }
        }
        Ok(self.files.len())
    }

    /// Whether graph `g` may run rows at all: a min-max (or unlabelled) QNN graph longer than
    /// [`MINMAX_MAX_TOKENS`] may not, unless it was calibrated with the masks clipped (what
    /// collapses at 256 is min-max over the raw additive masks, whose range swamps the 16-bit
    /// activations: tools/qnn/README.md) or the manifest allows it. The probe then checks it.
    pub fn usable(&self, g: &GraphSpec) -> bool {
        // Only QNN graphs are quantized (w8a16); RKNN graphs are fp16.
        self.backend != "qnn"
            || self.allow_minmax_above_128
            || g.mask_clip.is_some()
            || Calibration::parse(g.calibration.as_deref()) != Calibration::MinMax
            || g.seq_len <= MINMAX_MAX_TOKENS
    }

    /// The rows the graphs can run: each usable graph's length and option slots (none where
    /// the graph has no markers: the QNN head runs on the host).
    pub fn row_shapes(&self) -> Vec<RowShape> {
        self.graphs
            .iter()
            .filter(|g| self.usable(g))
            .map(|g| RowShape { seq_len: g.seq_len, marker_slots: (g.marker_slots > 0).then_some(g.marker_slots) })
            .collect()
    }
}

/// The manifest's `probe`: `{"file": "probe.jsonl", "min_agreement", "min_clear_agreement",
/// "min_cosine", "max_mean_dp"}`: the file, and the thresholds the bundle sets itself (what it
/// leaves out is `engine::probe::Thresholds`' default; the judging is there, not here).
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeSpec {
    pub file: PathBuf,
    pub thresholds: ThresholdSettings,
}

/// The probe thresholds a bundle's manifest sets (each from 0 to 1), `None` where it sets none.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ThresholdSettings {
    pub min_agreement: Option<f64>,
    pub min_clear_agreement: Option<f64>,
    pub min_cosine: Option<f64>,
    pub max_mean_dp: Option<f64>,
}

impl ProbeSpec {
    fn parse(p: &Value, dir: &Path) -> Result<ProbeSpec, String> {
        let file = p.get("file").and_then(Value::as_str).ok_or("probe: 'file' must name the probe file")?;
        let mut thresholds = ThresholdSettings::default();
        for (key, slot) in [
            ("min_agreement", &mut thresholds.min_agreement),
            ("min_clear_agreement", &mut thresholds.min_clear_agreement),
            ("min_cosine", &mut thresholds.min_cosine),
            ("max_mean_dp", &mut thresholds.max_mean_dp),
        ] {
            if let Some(v) = p.get(key) {
                let v = v.as_f64().filter(|v| (0.0..=1.0).contains(v));
                *slot = Some(v.ok_or_else(|| format!("probe: '{key}' must be a number from 0 to 1"))?);
            }
        }
        Ok(ProbeSpec { file: dir.join(file), thresholds })
    }
}

/// `temperature.json`: `{"choice": t, "score": t, "noul": t}` or `[choice, score, noul]`,
/// optionally with `temperature_by_options` beside a per-type map.
fn temperatures_file(path: &Path) -> Result<Temperatures, BundleError> {
    let v = read_json(path)?;
    let per_type = match &v {
        Value::Array(_) => v.clone(),
        Value::Object(m) => Value::Array(
            ["choice", "score", "noul"].iter().map(|k| m.get(*k).cloned().unwrap_or(Value::Float(1.0))).collect(),
        ),
        _ => {
            return Err(BundleError::Config { path: path.to_owned(), message: "expected a list or an object".into() });
        }
    };
    Ok(Temperatures::from_config(Some(&per_type), v.get("temperature_by_options"), None)?)
}

/// What the host side of the pipeline needs from a model directory.
#[derive(Debug)]
pub struct HostBundle {
    pub dir: PathBuf,
    pub config: AgentConfig,
    pub tokenizer: Tokenizer,
    /// The laya checkpoint the CPU reference can load, if there is one.
    pub checkpoint: Option<PathBuf>,
    /// The NPU manifest, for an NPU bundle.
    pub manifest: Option<Manifest>,
    /// The most a request may ask: `config.limits`, for an NPU bundle cut to its longest usable
    /// graph, and the row shapes its graphs run. Whatever backend answers (the CPU fallback
    /// included), rows are laid out within it.
    pub capacity: Capacity,
    /// The laya whose semantics requests are answered with (`[model] laya`).
    pub laya: LayaVersion,
}

impl HostBundle {
    /// [`HostBundle::load`] after every file the manifest lists was checked against its sha256:
    /// what the agent and the commands that answer questions load. Only the manifest (which
    /// lists the digests) is read before the check, so a damaged file is named as corrupt or
    /// replaced, never by what parsing it would have said.
    pub fn load_verified(dir: &Path) -> Result<HostBundle, BundleError> {
        HostBundle::load_verified_as(dir, LayaVersion::default())
    }

    /// [`HostBundle::load_verified`] served as `laya`'s version ([`HostBundle::load_as`]).
    pub fn load_verified_as(dir: &Path, laya: LayaVersion) -> Result<HostBundle, BundleError> {
        if dir.join(MANIFEST).is_file() {
            Manifest::load(dir)?.verify_files(dir)?;
        }
        HostBundle::load_as(dir, laya)
    }

    /// Loads a laya checkpoint directory or an NPU bundle (a directory with `laya-bundle.json`),
    /// served as laya 0.3.20.
    pub fn load(dir: &Path) -> Result<HostBundle, BundleError> {
        HostBundle::load_as(dir, LayaVersion::default())
    }

    /// [`HostBundle::load`] served as `laya`'s version: its checkpoint read as that version
    /// reads it ([`AgentConfig::load_as`]). An NPU bundle of a parallel-layout checkpoint is
    /// refused: the graphs take no position ids and no option mask, so they would answer it as
    /// if its options were laid out one after another.
    pub fn load_as(dir: &Path, laya: LayaVersion) -> Result<HostBundle, BundleError> {
        if !dir.join(MANIFEST).is_file() {
            let config = AgentConfig::load_as(dir, laya)?;
            let tokenizer = Tokenizer::load(&dir.join("tokenizer"))?;
            return Ok(HostBundle {
                dir: dir.to_owned(),
                capacity: Capacity::of_checkpoint(config.limits),
                config,
                tokenizer,
                checkpoint: Some(dir.to_owned()),
                manifest: None,
                laya,
            });
        }
        let manifest = Manifest::load(dir)?;
        let raw = &manifest.raw;
        let path = dir.join(MANIFEST);
        let bad = |message: String| BundleError::Config { path: path.clone(), message };
        let mut config = match &manifest.checkpoint {
            Some(ckpt) => AgentConfig::load_as(ckpt, laya)?,
            None => AgentConfig {
                encoder: String::new(),
                head_layers: 0,
                n_act: 2,
                limits: Limits::default(),
                temperatures: Temperatures::default(),
                option_layout: OptionLayout::Sequential,
            },
        };
        if let Some(t) = raw.get("temperature").and_then(Value::as_str) {
            config.temperatures = temperatures_file(&dir.join(t))?;
        }
        for (key, slot) in [("max_len", &mut config.limits.max_len), ("head_max_len", &mut config.limits.head_max_len)]
        {
            if let Some(v) = raw.get(key) {
                *slot = v.as_i64().ok_or_else(|| bad(format!("'{key}' must be an integer")))?;
            }
        }
        let tokenizer_path = match raw.get("tokenizer").and_then(Value::as_str) {
            Some(t) if dir.join(t).is_dir() => dir.join(t).join("tokenizer.json"),
            Some(t) => dir.join(t),
            None => match &manifest.checkpoint {
                Some(ckpt) => ckpt.join("tokenizer").join("tokenizer.json"),
                None => dir.join("tokenizer.json"),
            },
        };
        let names = raw.get("special_tokens").map(|s| {
            let get = |k: &str| s.get(k).and_then(Value::as_str).map(str::to_owned);
            SpecialTokenNames { cls: get("cls"), sep: get("sep"), mask: get("mask"), pad: get("pad") }
        });
        let tokenizer = Tokenizer::load_file(&tokenizer_path, names.as_ref())?;
        if config.option_layout == OptionLayout::Parallel && !manifest.graphs.is_empty() {
            return Err(bad(format!(
                "the checkpoint lays its options out in parallel (option_layout 'parallel'), and the {} graphs of this bundle take no position ids and no option mask, so they cannot run it; serve the checkpoint itself on the cpu backend",
                manifest.backend
            )));
        }
        Ok(HostBundle {
            dir: dir.to_owned(),
            // A bundle without graphs (a CPU bundle) runs what its checkpoint runs.
            capacity: if manifest.graphs.is_empty() {
                Capacity::of_checkpoint(config.limits)
            } else {
                Capacity::of_graphs(config.limits, manifest.row_shapes())
            },
            config,
            tokenizer,
            checkpoint: manifest.checkpoint.clone(),
            manifest: Some(manifest),
            laya,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::QType;

    fn fixture(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/laya-0.3.20/models").join(name)
    }

    #[test]
    fn a_parallel_checkpoint_is_served_only_as_laya_0_4_15_and_an_unknown_layout_never() {
        let dir = std::env::temp_dir().join(format!("laya-option-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let original = std::fs::read_to_string(fixture("bpe-t5").join("rl_agent_config.json")).unwrap();
        let with = |layout: &str, laya: LayaVersion| {
            let text =
                original.trim_end().trim_end_matches('}').to_owned() + &format!(", \"option_layout\": {layout}}}");
            std::fs::write(dir.join("rl_agent_config.json"), text).unwrap();
            AgentConfig::load_as(&dir, laya).map(|c| c.option_layout)
        };
        let (old, new) = (LayaVersion::V0_3_20, LayaVersion::V0_4_15);
        assert_eq!(with("\"sequential\"", old).unwrap(), OptionLayout::Sequential, "every published checkpoint");
        let e = with("\"parallel\"", old).unwrap_err().to_string();
        assert!(e.contains("option_layout 'parallel'") && e.contains("laya = \"0.4.15\""), "{e}");
        assert_eq!(with("\"parallel\"", new).unwrap(), OptionLayout::Parallel);
        for laya in [old, new] {
            let e = with("\"diagonal\"", laya).unwrap_err().to_string();
            assert!(e.ends_with("option_layout must be one of sequential, parallel, got 'diagonal'"), "{e}");
        }
        std::fs::write(dir.join("rl_agent_config.json"), &original).unwrap();
        assert_eq!(AgentConfig::load(&dir).unwrap().option_layout, OptionLayout::Sequential, "no option_layout");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_npu_bundle_takes_its_manifest_over_the_checkpoint() {
        let dir = std::env::temp_dir().join(format!("laya-bundle-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ckpt = fixture("bpe-t5");
        std::fs::write(dir.join("temperature.json"), r#"{"choice": 2.0, "score": 0.1, "noul": 1.5}"#).unwrap();
        std::fs::write(
            dir.join(MANIFEST),
            format!(
                r#"{{"backend": "rknn", "checkpoint": {:?}, "temperature": "temperature.json", "max_len": 256,
                   "graphs": [{{"file": "g512.rknn", "seq_len": 512, "marker_slots": 64}}], "runtime_allowlist": ["2.3.2"]}}"#,
                ckpt.to_str().unwrap()
            ),
        )
        .unwrap();
        let b = HostBundle::load(&dir).unwrap();
        let m = b.manifest.as_ref().unwrap();
        assert_eq!(m.backend, "rknn");
        assert_eq!(m.graphs[0].file, dir.join("g512.rknn"));
        assert_eq!((m.graphs[0].seq_len, m.graphs[0].marker_slots), (512, 64));
        assert_eq!(m.runtime_allowlist, ["2.3.2"]);
        assert_eq!(b.config.limits, Limits { max_len: 256, head_max_len: 192 });
        assert_eq!(b.capacity.limits, b.config.limits, "the manifest's 256 is within the 512 graph");
        assert_eq!(b.capacity.shapes, Some(vec![RowShape { seq_len: 512, marker_slots: Some(64) }]));
        assert_eq!(b.config.temperatures.for_question(QType::Choice, 3, None), 2.0);
        assert_eq!(b.config.temperatures.for_question(QType::Score, 3, None), 0.5);
        assert_eq!(b.tokenizer.mask.text, "[MASK]");
        assert_eq!(b.checkpoint.as_deref(), Some(ckpt.as_path()));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn an_npu_bundle_budget_is_at_most_its_longest_usable_graph() {
        let dir = std::env::temp_dir().join(format!("laya-bundle-capacity-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ckpt = fixture("bpe-t5");
        let write = |extra: &str| {
            std::fs::write(
                dir.join(MANIFEST),
                format!(
                    r#"{{"backend": "qnn", "checkpoint": {:?}, "graphs": [
                       {{"file": "a.bin", "seq_len": 128, "calibration": "min-max"}},
                       {{"file": "b.bin", "seq_len": 256, "calibration": "min-max"}}]{extra}}}"#,
                    ckpt.to_str().unwrap()
                ),
            )
            .unwrap();
            HostBundle::load(&dir).unwrap()
        };
        // The checkpoint says 512; a min-max graph above 128 tokens runs nothing.
        let b = write("");
        assert_eq!(b.config.limits.max_len, 512);
        assert_eq!(b.capacity.limits, Limits { max_len: 128, head_max_len: 192 });
        assert_eq!(b.capacity.shapes, Some(vec![RowShape { seq_len: 128, marker_slots: None }]));
        let b = write(r#", "allow_minmax_above_128": true"#);
        assert_eq!(b.capacity.limits.max_len, 256);
        std::fs::remove_dir_all(&dir).ok();
        // A checkpoint's own budget is its capacity.
        let b = HostBundle::load(&fixture("bpe-small")).unwrap();
        assert_eq!(b.capacity, Capacity::of_checkpoint(Limits { max_len: 96, head_max_len: 48 }));
    }

    #[test]
    fn a_directory_without_config_or_manifest_is_named_in_the_error() {
        let err = HostBundle::load(Path::new(env!("CARGO_MANIFEST_DIR"))).unwrap_err();
        assert!(err.to_string().contains("rl_agent_config.json"), "{err}");
    }
}
