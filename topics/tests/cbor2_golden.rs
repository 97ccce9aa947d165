//! Our CBOR codec against an independent encoder: golden bytes Python's `cbor2` wrote (once, with
//! tools/fixtures/cbor2_golden.py, cbor2 pinned in tools/fixtures/cbor2-requirements.txt) for
//! requests and results laya recorded, replies in the documented wire shape, and edge values.
//!
//! cbor2 writes two encodings of each document. Its default keeps map order and writes every
//! finite float as an 8-byte double; we write each float in the shortest width that holds it
//! exactly (RFC 8949 preferred serialization), so there our bytes differ and only decoding is
//! compared. Its canonical encoding sorts map keys and uses the same shortest floats: given the
//! document with its maps in that order (recorded too), our encoder must write exactly its bytes.

use laya_topics::Value;
use laya_topics::cbor;
use laya_topics::json::{self, ParseOptions, Style};

struct Golden {
    name: String,
    json: Value,
    cbor2: Vec<u8>,
    canonical_json: Value,
    cbor2_canonical: Vec<u8>,
    decode_only: bool,
}

fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex");
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn golden() -> Vec<Golden> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/cbor2/golden.jsonl");
    let text = std::fs::read_to_string(path).expect("tests/fixtures/cbor2/golden.jsonl");
    let deep = ParseOptions { max_depth: 10_000 };
    text.split('\n')
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let line = json::parse_str(l, deep).expect("a golden line");
            let s = |k: &str| line.get(k).and_then(Value::as_str).unwrap_or_else(|| panic!("no {k}")).to_owned();
            Golden {
                json: json::parse_str(&s("json"), deep).expect("json"),
                cbor2: hex(&s("cbor2")),
                canonical_json: json::parse_str(&s("canonical_json"), deep).expect("canonical json"),
                cbor2_canonical: hex(&s("cbor2_canonical")),
                decode_only: line.get("decode_only") == Some(&Value::Bool(true)),
                name: s("name"),
            }
        })
        .collect()
}

fn text(v: &Value) -> String {
    json::to_string(v, Style::COMPACT)
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn the_golden_file_holds_requests_results_replies_and_edge_values() {
    let g = golden();
    for kind in ["request ", "result ", "reply "] {
        let n = g.iter().filter(|d| d.name.starts_with(kind)).count();
        assert!(n >= 25, "only {n} documents of kind {kind:?}");
    }
    for name in ["error reply", "edge values", "integer keys"] {
        assert!(g.iter().any(|d| d.name == name), "no {name:?}");
    }
}

#[test]
fn our_decoder_reads_cbor2s_bytes_as_the_json_document() {
    let mut n = 0;
    for d in golden() {
        let got = cbor::decode(&d.cbor2, 10_000).unwrap_or_else(|e| panic!("{}: {e}", d.name));
        assert_eq!(text(&got), text(&d.json), "{}", d.name);
        let got = cbor::decode(&d.cbor2_canonical, 10_000).unwrap_or_else(|e| panic!("{} canonical: {e}", d.name));
        assert_eq!(text(&got), text(&d.canonical_json), "{} canonical", d.name);
        n += 1;
    }
    assert!(n >= 80, "only {n} documents");
}

#[test]
fn our_encoder_writes_cbor2s_canonical_bytes_for_the_canonically_ordered_document() {
    let mut n = 0;
    for d in golden().into_iter().filter(|d| !d.decode_only) {
        let ours = cbor::encode(&d.canonical_json);
        assert!(
            ours == d.cbor2_canonical,
            "{}:\n ours  {}\n cbor2 {}",
            d.name,
            to_hex(&ours),
            to_hex(&d.cbor2_canonical)
        );
        n += 1;
    }
    assert!(n >= 80, "only {n} documents");
}

#[test]
fn where_cbor2_writes_no_float_our_encoder_writes_its_default_bytes_too() {
    // cbor2's default differs from ours only in float widths (the module doc): a document without
    // finite floats must come out byte for byte, map order included.
    fn has_float(v: &Value) -> bool {
        match v {
            Value::Float(f) => f.is_finite(),
            Value::Array(a) => a.iter().any(has_float),
            Value::Object(m) => m.values().any(has_float),
            _ => false,
        }
    }
    let mut n = 0;
    for d in golden().into_iter().filter(|d| !d.decode_only && !has_float(&d.json)) {
        let ours = cbor::encode(&d.json);
        assert!(ours == d.cbor2, "{}:\n ours  {}\n cbor2 {}", d.name, to_hex(&ours), to_hex(&d.cbor2));
        n += 1;
    }
    assert!(n >= 15, "only {n} documents without floats");
}
