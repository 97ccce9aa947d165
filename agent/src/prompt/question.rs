//! Question validation and normalisation: laya's `Agent._check_question` and `_to_internal`.
//!
//! A question definition arrives as a caller's JSON object. It is checked with laya's rules and
//! laya's messages (a caller who moves between laya and laya-edge sees the same words), then
//! turned into a [`Question`] whose shape the rest of the pipeline can rely on.
//!
//! The rules are those of the laya version the model is served as: laya 0.4.15 adds checks on
//! question ids, instructions, choice labels (scalars, none null, none repeated) and null score
//! levels, takes numbers and booleans as choice labels, and reads a question's `option_order`.

use laya_topics::wire::LayaVersion;
use laya_topics::{Value, json};

use super::pyrepr::{repr, repr_str, repr_str_list};

/// Question type and its index in the model (`qtype`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QType {
    Choice = 0,
    Score = 1,
    Noul = 2,
}

impl QType {
    /// The name laya uses (`choice`, `score`, `noul`).
    pub fn name(self) -> &'static str {
        match self {
            QType::Choice => "choice",
            QType::Score => "score",
            QType::Noul => "noul",
        }
    }

    /// The model's type index.
    pub fn index(self) -> usize {
        self as usize
    }

    fn from_name(name: &str) -> Option<QType> {
        match name {
            "choice" => Some(QType::Choice),
            "score" => Some(QType::Score),
            "noul" => Some(QType::Noul),
            _ => None,
        }
    }
}

/// The options of a question, normalised.
#[derive(Debug, Clone, PartialEq)]
pub enum Criteria {
    /// Label -> description (`Null` for none), in the caller's order, labels unique. A label is
    /// a string (laya 0.4.15: also a number or a bool, the answer's key as the caller wrote it).
    Choice(Vec<(Value, Value)>),
    /// Level descriptions, level 0 first.
    Score(Vec<Value>),
    /// The optional descriptions of the false and true options.
    Noul { when_false: Option<Value>, when_true: Option<Value> },
}

/// A validated question in laya's internal form.
#[derive(Debug, Clone, PartialEq)]
pub struct Question {
    pub qtype: QType,
    /// The instructions as text (structured instructions serialised as JSON).
    pub instructions: String,
    pub criteria: Criteria,
    /// Noul display labels `(false, true)`, stripped; the defaults when absent.
    pub noul_labels: (String, String),
    /// laya 0.4.15's `option_order`: slot `s` shows option `order[s]` (a permutation of the
    /// option indices). None: the options in their own order (always, under laya 0.3.20).
    pub option_order: Option<Vec<usize>>,
}

/// A choice label as option text: Python's `str(label)`.
pub fn label_text(label: &Value) -> String {
    match label {
        Value::Str(s) => s.clone(),
        Value::Bool(true) => "True".to_owned(),
        Value::Bool(false) => "False".to_owned(),
        other => repr(other),
    }
}

/// A choice label as a JSON object key (the `probabilities` of its answer): what `json.dumps`
/// makes of a `str`, `int`, `float` or `bool` key.
pub fn label_key(label: &Value) -> String {
    match label {
        Value::Str(s) => s.clone(),
        Value::Bool(b) => b.to_string(),
        Value::Float(f) if f.is_nan() => "NaN".to_owned(),
        Value::Float(f) if f.is_infinite() => if *f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned(),
        other => repr(other),
    }
}

/// Python's `==` between two scalar labels: numbers (booleans included) by value, strings by
/// text, never a number and a string.
fn py_scalar_eq(a: &Value, b: &Value) -> bool {
    // An exact decimal for an integral number, so 2**60 and 2.0**60 compare as Python does.
    fn integral(v: &Value) -> Option<String> {
        match v {
            Value::Bool(b) => Some(u8::from(*b).to_string()),
            Value::Int(i) => Some(i.as_str().trim_start_matches('+').to_owned()),
            Value::Float(f) if f.is_finite() && f.fract() == 0.0 => {
                Some(format!("{:.0}", f.abs())).map(|d| if *f < 0.0 && d != "0" { format!("-{d}") } else { d })
            }
            _ => None,
        }
    }
    match (a, b) {
        (Value::Str(x), Value::Str(y)) => x == y,
        (Value::Str(_), _) | (_, Value::Str(_)) => false,
        (Value::Float(x), Value::Float(y)) => x == y,
        _ => matches!((integral(a), integral(b)), (Some(x), Some(y)) if x == y),
    }
}

/// Why a question cannot be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct QuestionError {
    /// What kind of mistake it is, for the wire error code.
    pub kind: QuestionErrorKind,
    /// laya's message where laya has one.
    pub message: String,
}

/// The kinds of question errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QuestionErrorKind {
    /// The definition breaks one of laya's rules (laya raises `ValueError` with this message).
    Invalid,
    /// laya accepts the definition but then fails inside (a non-string choice label); this is
    /// refused up front with a message of our own.
    Unsupported,
    /// The options do not fit in `head_max_len` / `max_len` (laya's own error).
    DoesNotFit,
    /// laya would run it, but this backend cannot: its row fits no graph of the NPU bundle
    /// (more options than marker slots). See [`super::capacity`].
    ExceedsBackend,
}

impl QuestionError {
    fn invalid(message: String) -> QuestionError {
        QuestionError { kind: QuestionErrorKind::Invalid, message }
    }

    /// The wire error code for this error.
    pub fn code(&self) -> &'static str {
        match self.kind {
            QuestionErrorKind::Invalid | QuestionErrorKind::Unsupported => "bad_request",
            QuestionErrorKind::DoesNotFit | QuestionErrorKind::ExceedsBackend => "too_large",
        }
    }
}

const NOUL_LABELS_MESSAGE: &str = "noul labels must map exactly 'false' and 'true' to distinct non-empty strings";

/// Python's `str.strip()`: Unicode whitespace plus the information separators U+001C..U+001F.
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// laya's `_resolve_noul_labels`: `None` means the defaults.
fn resolve_noul_labels(labels: Option<&Value>) -> Result<(String, String), String> {
    let Some(labels) = labels.filter(|v| **v != Value::Null) else {
        return Ok(("false".to_owned(), "true".to_owned()));
    };
    let Some(map) = labels.as_object() else {
        return Err(NOUL_LABELS_MESSAGE.to_owned());
    };
    if map.len() != 2 || !map.contains_key("false") || !map.contains_key("true") {
        return Err(NOUL_LABELS_MESSAGE.to_owned());
    }
    let (Some(f), Some(t)) = (map["false"].as_str(), map["true"].as_str()) else {
        return Err(NOUL_LABELS_MESSAGE.to_owned());
    };
    let (f, t) = (py_strip(f), py_strip(t));
    if f.is_empty() || t.is_empty() || f == t {
        return Err(NOUL_LABELS_MESSAGE.to_owned());
    }
    Ok((f.to_owned(), t.to_owned()))
}

/// Checks a question definition with laya 0.3.20's rules and normalises it.
pub fn parse_question(qid: &str, def: &Value) -> Result<Question, QuestionError> {
    parse_question_as(LayaVersion::V0_3_20, qid, def)
}

/// Checks a question definition with the rules of `laya`'s version (`Agent._check_question`)
/// and normalises it (`Agent._to_internal`).
pub fn parse_question_as(laya: LayaVersion, qid: &str, def: &Value) -> Result<Question, QuestionError> {
    let q = repr_str(qid);
    let v4 = laya.is_0_4();
    if v4 && py_strip(qid).is_empty() {
        return Err(QuestionError::invalid(format!("question id must be a non-empty string, got {q}")));
    }
    let Some(map) = def.as_object() else {
        return Err(QuestionError::invalid(format!(
            "question {q}: definition must be a dict, got {}",
            def.python_type_name()
        )));
    };
    let t = map.get("type").unwrap_or(&Value::Null);
    let qtype = t.as_str().and_then(QType::from_name).ok_or_else(|| {
        QuestionError::invalid(format!(
            "question {q}: unknown type {}; use one of {}",
            repr(t),
            repr_str_list(&["choice", "noul", "score"])
        ))
    })?;
    let Some(instructions) = map.get("instructions") else {
        return Err(QuestionError::invalid(format!(
            "question {q}: no 'instructions'; add the text the model should answer"
        )));
    };
    if v4 {
        check_instructions(&q, instructions)?;
    }
    let crit = map.get("criteria").unwrap_or(&Value::Null);
    match qtype {
        QType::Choice => {
            if !matches!(crit, Value::Object(_) | Value::Array(_)) {
                return Err(QuestionError::invalid(format!(
                    "question {q}: a choice question takes 'criteria' as a dict of label -> description, or a list of labels"
                )));
            }
            if !crit.is_truthy() {
                return Err(QuestionError::invalid(format!(
                    "question {q}: a choice question needs at least one criterion"
                )));
            }
            if v4 {
                check_choice_labels(&q, crit)?;
            }
        }
        QType::Score => {
            if !matches!(crit, Value::Array(_)) {
                return Err(QuestionError::invalid(format!(
                    "question {q}: a score question takes 'criteria' as a list of level descriptions, index 0 first"
                )));
            }
            if !crit.is_truthy() {
                return Err(QuestionError::invalid(format!("question {q}: a score question needs at least one level")));
            }
            if v4 && let Some(i) = crit.as_array().unwrap_or_default().iter().position(|l| *l == Value::Null) {
                return Err(QuestionError::invalid(format!(
                    "question {q}: score level {i} is null; give every level a description, index 0 first"
                )));
            }
        }
        QType::Noul => match crit {
            Value::Null => {}
            Value::Object(c) => {
                let mut keys: Vec<String> = c.keys().map(|k| k.to_lowercase()).collect();
                keys.sort();
                keys.dedup();
                if !keys.iter().all(|k| k == "true" || k == "false") {
                    return Err(QuestionError::invalid(format!(
                        "question {q}: a noul question takes 'criteria' keyed only 'true'/'false' (either or both, and omitted is fine), got {}. Those keys are the option texts the model reads; any other key was silently dropped and replaced with the defaults. If you want the answer worded differently, keep 'criteria' keyed 'true'/'false' and set 'labels' instead.",
                        repr_str_list(&keys)
                    )));
                }
            }
            _ => {
                return Err(QuestionError::invalid(format!(
                    "question {q}: a noul question takes 'criteria' as a dict with optional 'true'/'false' descriptions, or omits it"
                )));
            }
        },
    }
    let option_order = match map.get("option_order") {
        Some(order) if v4 => Some(check_option_order(&q, qtype, crit, order)?),
        _ => None,
    };
    let labels = map.get("labels");
    if labels.is_some() && qtype != QType::Noul {
        return Err(QuestionError::invalid(format!("question {q}: 'labels' is only supported for noul questions")));
    }
    let noul_labels = resolve_noul_labels(labels).map_err(|e| QuestionError::invalid(format!("question {q}: {e}")))?;

    // _to_internal
    let criteria = match (qtype, crit) {
        (QType::Choice, Value::Array(items)) => {
            let mut labels: Vec<(Value, Value)> = Vec::with_capacity(items.len());
            for item in items {
                // laya 0.3.20 takes any label here and then fails inside on a non-string one.
                if !v4 && item.as_str().is_none() {
                    return Err(QuestionError {
                        kind: QuestionErrorKind::Unsupported,
                        message: format!(
                            "question {q}: choice labels in a 'criteria' list must be strings, got {}",
                            item.python_type_name()
                        ),
                    });
                }
                // `{c: None for c in crit}`: a repeated label keeps its first place (0.4.15
                // refused repeats above).
                if !labels.iter().any(|(l, _)| py_scalar_eq(l, item)) {
                    labels.push((item.clone(), Value::Null));
                }
            }
            Criteria::Choice(labels)
        }
        (QType::Choice, Value::Object(m)) => {
            Criteria::Choice(m.iter().map(|(k, v)| (Value::Str(k.clone()), v.clone())).collect())
        }
        (QType::Score, Value::Array(levels)) => Criteria::Score(levels.clone()),
        (QType::Noul, Value::Object(m)) => {
            // `{str(k).lower(): v}`: a later key that lowercases the same replaces the value.
            let (mut when_false, mut when_true) = (None, None);
            for (k, v) in m {
                match k.to_lowercase().as_str() {
                    "false" => when_false = Some(v.clone()),
                    _ => when_true = Some(v.clone()),
                }
            }
            Criteria::Noul { when_false, when_true }
        }
        (QType::Noul, _) => Criteria::Noul { when_false: None, when_true: None },
        // The checks above admit no other combination.
        (QType::Choice | QType::Score, _) => {
            return Err(QuestionError::invalid(format!("question {q}: malformed criteria")));
        }
    };
    let instructions = match instructions {
        Value::Str(s) => s.clone(),
        other => json::to_string(other, json::Style::PYTHON),
    };
    Ok(Question { qtype, instructions, criteria, noul_labels, option_order })
}

/// laya 0.4.15's checks of `instructions` (`q` is the question id's repr).
fn check_instructions(q: &str, ins: &Value) -> Result<(), QuestionError> {
    let tail = "add the text the model should answer";
    let empty = match ins {
        Value::Null => {
            return Err(QuestionError::invalid(format!("question {q}: 'instructions' must not be None; {tail}")));
        }
        Value::Str(s) => py_strip(s).is_empty(),
        Value::Array(_) | Value::Object(_) => !ins.is_truthy(),
        // Numbers and booleans (`int` in Python) are taken as they are.
        Value::Int(_) | Value::Float(_) | Value::Bool(_) => false,
    };
    if empty {
        return Err(QuestionError::invalid(format!("question {q}: 'instructions' must not be empty; {tail}")));
    }
    Ok(())
}

/// laya 0.4.15's checks of choice labels: scalars, none null, and (in a list) no two equal.
fn check_choice_labels(q: &str, crit: &Value) -> Result<(), QuestionError> {
    let labels: Vec<Value> = match crit {
        Value::Array(items) => items.clone(),
        Value::Object(m) => m.keys().map(|k| Value::Str(k.clone())).collect(),
        _ => Vec::new(),
    };
    for (i, label) in labels.iter().enumerate() {
        match label {
            Value::Null => {
                return Err(QuestionError::invalid(format!(
                    "question {q}: choice label {i} is null; a label is rendered as option text and used as the answer key, so it must be a string, number or bool -- a null label renders as the text \"None\" while its answer key is \"null\""
                )));
            }
            Value::Array(_) | Value::Object(_) => {
                return Err(QuestionError::invalid(format!(
                    "question {q}: choice label {i} is a {}; a label is rendered as option text and used as the answer key, so it must be a scalar (a string, number or bool), got {}",
                    label.python_type_name(),
                    repr(label)
                )));
            }
            _ => {}
        }
    }
    if matches!(crit, Value::Array(_)) {
        for (i, label) in labels.iter().enumerate() {
            if let Some(first) = labels[..i].iter().position(|l| py_scalar_eq(l, label)) {
                return Err(QuestionError::invalid(format!(
                    "question {q}: choice label {i} ({}) repeats label {first}; the labels are the answer keys, so every option needs its own (1, 1.0 and True are one key)",
                    repr(label)
                )));
            }
        }
    }
    Ok(())
}

/// laya 0.4.15's check of `option_order`: a permutation of the option indices.
fn check_option_order(q: &str, qtype: QType, crit: &Value, order: &Value) -> Result<Vec<usize>, QuestionError> {
    // `_option_count`: a noul is always two options; otherwise one per criterion.
    let n = match (qtype, crit) {
        (QType::Noul, _) => 2,
        (_, Value::Array(a)) => a.len(),
        (_, Value::Object(m)) => m.len(),
        _ => 0,
    };
    let refuse = || {
        QuestionError::invalid(format!(
            "question {q}: 'option_order' must be a permutation of range({n}) -- one slot per option, each option once -- got {}",
            repr(order)
        ))
    };
    let Value::Array(items) = order else { return Err(refuse()) };
    if items.len() != n {
        return Err(refuse());
    }
    // `sorted(int(i) for i in order if isinstance(i, int) and not isinstance(i, bool))`
    let mut ints: Vec<usize> = Vec::with_capacity(n);
    for item in items {
        if let Value::Int(i) = item {
            // An index past every option (or negative) can never complete the permutation.
            ints.push(i.to_i64().and_then(|v| usize::try_from(v).ok()).filter(|v| *v < n).ok_or_else(refuse)?);
        }
    }
    let mut sorted = ints.clone();
    sorted.sort_unstable();
    if sorted != (0..n).collect::<Vec<_>>() {
        return Err(refuse());
    }
    Ok(ints)
}

#[cfg(test)]
mod tests {
    use super::*;
    use laya_topics::json::{ParseOptions, parse_str};

    fn parse(qid: &str, def: &str) -> Result<Question, QuestionError> {
        parse_question(qid, &parse_str(def, ParseOptions::default()).unwrap())
    }

    #[test]
    fn a_choice_list_becomes_unique_labels_without_descriptions() {
        let q = parse("q", r#"{"type": "choice", "instructions": "i", "criteria": ["a", "b", "a"]}"#).unwrap();
        assert_eq!(
            q.criteria,
            Criteria::Choice(vec![(Value::from("a"), Value::Null), (Value::from("b"), Value::Null)])
        );
    }

    #[test]
    fn noul_criteria_keys_are_lowercased_and_the_last_duplicate_wins() {
        let q = parse("q", r#"{"type": "noul", "instructions": "i", "criteria": {"TRUE": "x", "true": "y"}}"#).unwrap();
        assert_eq!(q.criteria, Criteria::Noul { when_false: None, when_true: Some(Value::from("y")) });
    }

    #[test]
    fn structured_instructions_are_serialised_as_python_json() {
        let q = parse("q", r#"{"type": "noul", "instructions": {"ask": "é", "n": [1, 2.0]}}"#).unwrap();
        assert_eq!(q.instructions, r#"{"ask": "é", "n": [1, 2.0]}"#);
    }

    #[test]
    fn invalid_questions_get_lavas_messages() {
        let cases = [
            (r#""x""#, "question 'q': definition must be a dict, got str"),
            (r#"{"instructions": "i"}"#, "question 'q': unknown type None; use one of ['choice', 'noul', 'score']"),
            (
                r#"{"type": "choice", "criteria": ["a"]}"#,
                "question 'q': no 'instructions'; add the text the model should answer",
            ),
            (
                r#"{"type": "choice", "instructions": "i", "criteria": []}"#,
                "question 'q': a choice question needs at least one criterion",
            ),
            (
                r#"{"type": "score", "instructions": "i", "criteria": {"a": 1}}"#,
                "question 'q': a score question takes 'criteria' as a list of level descriptions, index 0 first",
            ),
            (
                r#"{"type": "choice", "instructions": "i", "criteria": ["a"], "labels": null}"#,
                "question 'q': 'labels' is only supported for noul questions",
            ),
            (
                r#"{"type": "noul", "instructions": "i", "labels": {"false": " x ", "true": "x"}}"#,
                "question 'q': noul labels must map exactly 'false' and 'true' to distinct non-empty strings",
            ),
        ];
        for (def, want) in cases {
            let err = parse("q", def).unwrap_err();
            assert_eq!(err.kind, QuestionErrorKind::Invalid);
            assert_eq!(err.message, want);
        }
    }

    #[test]
    fn noul_labels_are_stripped_with_pythons_whitespace() {
        let q = parse(
            "q",
            r#"{"type": "noul", "instructions": "i", "labels": {"false": "\u001c no ", "true": "\tyes\u3000"}}"#,
        )
        .unwrap();
        assert_eq!(q.noul_labels, ("no".to_owned(), "yes".to_owned()));
    }

    #[test]
    fn a_non_string_choice_label_is_refused_up_front() {
        let err = parse("q", r#"{"type": "choice", "instructions": "i", "criteria": [1]}"#).unwrap_err();
        assert_eq!(err.kind, QuestionErrorKind::Unsupported);
    }
}
