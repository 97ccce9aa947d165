//! The probe's default thresholds (`engine::probe::Thresholds::default`) against what sound bundles
//! measure with the probe's own figures (issue #28): every graph judged on its own rows, the
//! float model's logits from the CPU backend, the backend's from Qualcomm's HTP simulator (the
//! committed V68 w8a16 binaries) or, for RKNN, the outputs Rockchip's simulator gave for the
//! demo model's rows (`tests/fixtures/rknn/demo/demo.sim.json`).
//!
//! The rows: the built-in probe requests, each also laid out at every graph's length (as
//! `laya-edge bundle` fills a graph), and the demo model's first held-out requests ([`sizes`])
//! (none of them seen by the binaries' quantizer, which calibrated on requests 101-400) or, for the
//! fixture checkpoints, their recorded cases. Each test prints its figures per graph
//! (`-- --nocapture`; docs/test-evidence.md records them) and asserts that the defaults pass
//! every sound graph with room to spare ([`shortfalls`]). Sound graphs do flip a clear decision
//! now and then on these rows (up to 2 in 248): the defaults forgive one in 20 rows, not two. The
//! demo's 256 graph, calibrated on short rows only, is the one graph here that fails them.
//!
//! The simulator tests run in a child process each (one HTP runtime per process, and the `qnn`
//! module's own tests beside them in this binary); without the simulator libraries they are
//! skipped with a loud message, and fail under CI.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use crate::support::{assert_child_ran_one_test, cases, child_command, f32s, ints, json_str, read_json, test_path};
use laya_edge::backend::cpu::CpuBackend;
use laya_edge::backend::npu::qnn::{QnnBackend, QnnConfig};
use laya_edge::backend::{Backend, RowResult};
use laya_edge::bundle::HostBundle;
use laya_edge::engine::probe::{Probe, Report, Thresholds};
use laya_edge::engine::probe_file;
use laya_edge::prompt::{QType, Row, RowShape};
use laya_topics::Value;
use laya_topics::json::{self, ParseOptions};
use test_kit::{qnn_simulator, workspace};

const CHILD: &str = "LAYA_PROBE_DEFAULTS_CHILD";
const LIB: &str = "LAYA_PROBE_DEFAULTS_LIBS";

/// Held-out demo requests used (of 400; the quantizer calibrated on 101-400), and the fixture
/// cases per checkpoint: a few minutes of the simulator in all. `LAYA_PROBE_DEFAULTS_FULL=1`
/// takes 100 and every case (the measurement docs/test-evidence.md records, ~8 minutes).
fn sizes() -> (usize, usize) {
    if std::env::var_os("LAYA_PROBE_DEFAULTS_FULL").is_some() { (100, usize::MAX) } else { (40, 30) }
}

/// How much of the mean |dp| and cosine bounds a sound graph may use.
const ROOM: f64 = 0.5;

/// Runs `test` of this module in a child process with the simulator libraries, printing what it
/// printed; in the child, runs `body` with them.
fn on_the_simulator(test: &str, body: impl FnOnce(&Path)) {
    if std::env::var_os(CHILD).is_some() {
        let libs = std::env::var_os(LIB).map(PathBuf::from).expect("the simulator libraries");
        body(&libs);
        return;
    }
    let libs = qnn_simulator();
    let test = test_path(module_path!(), test);
    let out = child_command(CHILD, LIB, &libs, &test, &[]).output().expect("the test binary runs");
    eprintln!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_child_ran_one_test(&out, &test);
}

fn jsonl(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| json::parse_str(l, ParseOptions { max_depth: 1000 }).unwrap())
        .collect()
}

/// The built-in probe requests as made, and laid out at each of `lengths` (`max_len`).
fn built_in(lengths: &[usize]) -> Vec<Value> {
    let base = probe_file::parse_requests(probe_file::DEFAULT_REQUESTS, Path::new("built-in")).unwrap();
    let mut out = base.clone();
    for &l in lengths {
        for r in &base {
            let mut r = r.clone();
            if let Value::Object(m) = &mut r {
                m.insert("max_len".into(), Value::int(l as i64));
            }
            out.push(r);
        }
    }
    out
}

/// A probe of `requests`' distinct rows laid out for `bundle`, with `float`'s (the CPU backend's)
/// logits as the expected ones, and where each row comes from (request id, question, max_len).
fn probe_of(bundle: &HostBundle, float: &mut dyn Backend, requests: &[Value]) -> (Probe, Vec<String>) {
    let mut seen = HashSet::new();
    let mut rows = Vec::new();
    let mut origins = Vec::new();
    for r in requests {
        for (qid, row) in probe_file::rows_of(bundle, r, Path::new("requests")).unwrap() {
            if seen.insert(row.input_ids.clone()) {
                origins.push(format!(
                    "{} {qid} (max_len {}, {} tokens)",
                    r.get("id").and_then(Value::as_str).unwrap_or("?"),
                    r.get("max_len").and_then(Value::as_i64).map_or("-".to_owned(), |l| l.to_string()),
                    row.input_ids.len()
                ));
                rows.push(row);
            }
        }
    }
    let refs: Vec<&Row> = rows.iter().collect();
    let expected = float.run(&refs).unwrap();
    (Probe { rows, expected, thresholds: Thresholds::default() }, origins)
}

/// The probe of `requests`' rows for the QNN bundle `dir` ([`probe_of`], the float side from its
/// checkpoint on the CPU backend) judged on the simulator in `libs`, per graph; the rows that moved
/// most printed as `what`'s.
fn judged_on_the_simulator(dir: &Path, libs: &Path, requests: &[Value], what: &str) -> Report {
    let b = HostBundle::load(dir).unwrap();
    let ckpt = b.checkpoint.clone().unwrap();
    let mut cpu = CpuBackend::load(&ckpt, &b.config).unwrap();
    let (probe, origins) = probe_of(&b, &mut cpu, requests);
    let mut qnn = QnnBackend::load(&b, &QnnConfig::from_lib_dir(libs)).unwrap();
    let refs: Vec<&Row> = probe.rows.iter().collect();
    let outputs = qnn.run(&refs).unwrap();
    worst(what, &probe, &outputs, &origins);
    probe.judge(&outputs, b.capacity.shapes.as_deref())
}

/// Prints the rows that moved most (|dp| over 0.1), with where they come from.
fn worst(what: &str, probe: &Probe, outputs: &[RowResult], origins: &[String]) {
    for (i, (want, got)) in probe.expected.iter().zip(outputs).enumerate() {
        let single = Probe {
            rows: vec![probe.rows[i].clone()],
            expected: vec![want.clone()],
            thresholds: Thresholds::default(),
        };
        let r = single.judge(std::slice::from_ref(got), None);
        if r.figures.max_dp > 0.1 || r.figures.clear_agree < r.figures.clear {
            eprintln!(
                "    {what} worst: {} |dp| {:.3} agree {} float {:?} got {:?}",
                origins[i], r.figures.max_dp, r.figures.agree, want.logits, got.logits
            );
        }
    }
}

/// Prints `what`'s figures per graph and returns what falls short of the defaults on the graphs
/// `sound` accepts: each must pass them using at most [`ROOM`] of the mean |dp| bound and of the
/// cosine's distance from 1. The others are only printed.
fn shortfalls(what: &str, report: &Report, sound: impl Fn(Option<usize>) -> bool) -> Vec<String> {
    let t = Thresholds::default();
    eprintln!("{what}: {}", report.figures);
    let mut short = Vec::new();
    for g in report.graphs.iter().filter(|g| g.figures.rows > 0) {
        eprintln!(
            "  {what} {g}: {} of {} clear decisions flipped",
            g.figures.clear - g.figures.clear_agree,
            g.figures.clear
        );
        if !sound(g.seq_len) {
            continue;
        }
        if !g.passed {
            short.push(format!("{what} {g}: the defaults fail a sound graph: {}", g.verdict));
        }
        if g.figures.mean_dp > ROOM * t.max_mean_dp {
            short.push(format!("{what} {g}: mean |dp| uses more than {ROOM} of its bound {}", t.max_mean_dp));
        }
        if 1.0 - g.figures.mean_cosine > ROOM * (1.0 - t.min_cosine) {
            short.push(format!("{what} {g}: the cosine uses more than {ROOM} of its bound {}", t.min_cosine));
        }
    }
    short
}

fn demo_bundle(flavour: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laya-probe-defaults-demo-{flavour}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let io = if flavour == "u16io" { "ufixed16" } else { "float" };
    let g = |l: usize| {
        let file = workspace().join(format!("tests/fixtures/qnn/demo/enc_L{l}_{flavour}_ctx_qnn.bin"));
        format!(
            r#"{{"file": {}, "seq_len": {l}, "calibration": "min-max", "mask_clip": 100, "io": "{io}"}}"#,
            json_str(&file.display().to_string())
        )
    };
    let ckpt = workspace().join("models/demo");
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {}, "graphs": [{}, {}]}}"#,
            json_str(&ckpt.display().to_string()),
            g(128),
            g(256)
        ),
    )
    .unwrap();
    dir
}

/// The demo model's committed binaries: the 128 graph is sound; the 256 graph was calibrated on
/// 48 short held-out tickets only (its sidecar), never on a row longer than 128 tokens, the only
/// rows the agent sends it, and on long rows it is not: one confident decision reversed (|dp|
/// 0.85), mean |dp| 0.038, cosine 0.985 over 48 rows. The probe must say so.
#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn the_demo_bundles_128_graph_passes_the_defaults_with_room_and_its_256_graph_calibrated_on_short_rows_fails_them() {
    on_the_simulator(
        "the_demo_bundles_128_graph_passes_the_defaults_with_room_and_its_256_graph_calibrated_on_short_rows_fails_them",
        |libs| {
            let mut requests = built_in(&[128, 256]);
            requests.extend(jsonl(&workspace().join("config/demo-requests.jsonl")));
            for h in jsonl(&workspace().join("tests/fixtures/demo/heldout.jsonl")).into_iter().take(sizes().0) {
                requests.push(h.get("request").unwrap().clone());
            }
            let mut short = Vec::new();
            for flavour in ["f32io", "u16io"] {
                let report = judged_on_the_simulator(&demo_bundle(flavour), libs, &requests, flavour);
                short.extend(shortfalls(&format!("demo {flavour}"), &report, |g| g == Some(128)));
                let long = report.graphs.iter().find(|g| g.seq_len == Some(256)).expect("the 256 graph");
                assert!(long.figures.rows >= 20 && !long.passed, "demo {flavour}: {long}");
            }
            assert!(short.is_empty(), "{short:#?}");
        },
    );
}

/// A bundle of a fixture checkpoint's committed binaries: 128 tokens u16io, 256 f32io.
fn fixture_bundle(model: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("laya-probe-defaults-{model}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fx = workspace().join(format!("tests/fixtures/qnn/{model}"));
    let file = |name: &str| json_str(&fx.join(name).display().to_string());
    std::fs::write(
        dir.join("laya-bundle.json"),
        format!(
            r#"{{"backend": "qnn", "checkpoint": {}, "allow_minmax_above_128": true, "graphs": [
                {{"file": {}, "seq_len": 128, "calibration": "min-max", "io": "ufixed16"}},
                {{"file": {}, "seq_len": 256, "calibration": "min-max", "io": "float"}}]}}"#,
            file("checkpoint"),
            file("enc_L128_u16io_ctx_qnn.bin"),
            file("enc_L256_f32io_ctx_qnn.bin")
        ),
    )
    .unwrap();
    dir
}

#[test]
#[ignore = "needs the QNN HTP simulator (LAYA_QNN_LIB_DIR, tools/qnn/fetch-runtime.sh): --include-ignored runs it, as tools/test.sh does"]
fn the_fixture_checkpoints_bundles_on_the_qnn_simulator_pass_the_default_thresholds_on_each_graph_with_room_to_spare() {
    on_the_simulator(
        "the_fixture_checkpoints_bundles_on_the_qnn_simulator_pass_the_default_thresholds_on_each_graph_with_room_to_spare",
        |libs| {
            let mut short = Vec::new();
            for model in ["bpe-t5", "wp-t4", "bpe-small"] {
                let mut requests = built_in(&[128, 256]);
                requests.extend(
                    cases()
                        .iter()
                        .filter(|c| c.model == model)
                        .filter_map(|c| c.record.get("request").cloned())
                        .take(sizes().1),
                );
                let report = judged_on_the_simulator(&fixture_bundle(model), libs, &requests, model);
                short.extend(shortfalls(model, &report, |_| true));
            }
            assert!(short.is_empty(), "{short:#?}");
        },
    );
}

#[test]
fn the_rknn_demo_graph_on_rockchips_simulator_passes_the_default_thresholds_with_room_to_spare() {
    // The rows Rockchip's simulator ran (12 from held-out requests, a full 512-token row with 64
    // options and a 3-token one): its logits against laya's own float forward.
    let sim = read_json(&workspace().join("tests/fixtures/rknn/demo/demo.sim.json"));
    let mut probe = Probe { rows: Vec::new(), expected: Vec::new(), thresholds: Thresholds::default() };
    let mut outputs = Vec::new();
    for r in sim.get("rows").and_then(Value::as_array).unwrap() {
        let n = r.get("tokens").and_then(Value::as_i64).unwrap() as usize;
        let k = r.get("options").and_then(Value::as_i64).unwrap() as usize;
        let inputs = r.get("inputs").unwrap();
        let ids = ints(inputs.get("input_ids").unwrap());
        let markers = ints(inputs.get("marker_pos").unwrap());
        probe.rows.push(Row {
            input_ids: ids[..n].iter().map(|&i| i as u32).collect(),
            marker_pos: markers[..k].iter().map(|&m| m as u32).collect(),
            qtype: QType::Choice,
            layout: None,
        });
        let want = f32s(r.get("torch_logits").unwrap());
        probe.expected.push(RowResult { logits: want[..k].to_vec(), act_logits: vec![] });
        let got = f32s(r.get("simulator_logits").unwrap());
        outputs.push(RowResult { logits: got[..k].to_vec(), act_logits: vec![] });
    }
    let shapes = [RowShape { seq_len: 512, marker_slots: Some(64) }];
    let short = shortfalls("rknn demo (Rockchip's simulator)", &probe.judge(&outputs, Some(&shapes)), |_| true);
    assert!(short.is_empty(), "{short:#?}");
}
