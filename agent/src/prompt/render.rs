//! Option texts: laya's `render_options` and `render_criterion`.
//!
//! These strings are what the model reads after each `[MASK]` marker, so they must be exactly
//! laya's, down to the separators of a structured criterion.

use laya_topics::{Value, json};

use super::question::{Criteria, Question, label_text};

/// `render_criterion`: strings as they are, anything else as JSON with `", "` and `": "`.
pub fn render_criterion(value: &Value) -> String {
    match value {
        Value::Str(s) => s.clone(),
        other => json::to_string(other, json::Style::PYTHON),
    }
}

/// `v in (None, "")`: no description.
fn is_blank(value: &Value) -> bool {
    matches!(value, Value::Null) || matches!(value, Value::Str(s) if s.is_empty())
}

/// `render_options`: one text per option, in label-index order (noul: false, then true).
pub fn render_options(q: &Question) -> Vec<String> {
    match &q.criteria {
        Criteria::Choice(labels) => labels
            .iter()
            .map(|(label, desc)| {
                // `str(k)`: a number or bool label (laya 0.4.15) as Python prints it.
                let label = label_text(label);
                if is_blank(desc) { label } else { format!("{label}: {}", render_criterion(desc)) }
            })
            .collect(),
        Criteria::Score(levels) => {
            levels.iter().enumerate().map(|(i, level)| format!("level {i}: {}", render_criterion(level))).collect()
        }
        Criteria::Noul { when_false, when_true } => {
            let describe = |desc: &Option<Value>, default: &str| match desc {
                Some(d) if !is_blank(d) => render_criterion(d),
                _ => default.to_owned(),
            };
            let (false_label, true_label) = &q.noul_labels;
            vec![
                format!("{false_label}: {}", describe(when_false, "no, the statement does not hold")),
                format!("{true_label}: {}", describe(when_true, "yes, the statement holds")),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prompt::question::parse_question;
    use laya_topics::json::{ParseOptions, parse_str};

    fn options(def: &str) -> Vec<String> {
        render_options(&parse_question("q", &parse_str(def, ParseOptions::default()).unwrap()).unwrap())
    }

    #[test]
    fn only_none_and_empty_string_mean_no_description() {
        assert_eq!(
            options(
                r#"{"type": "choice", "instructions": "i", "criteria": {"a": null, "b": "", "c": 0, "d": false, "e": {"x": [1, 2.5]}}}"#
            ),
            ["a", "b", "c: 0", "d: false", r#"e: {"x": [1, 2.5]}"#]
        );
    }

    #[test]
    fn score_levels_are_numbered_from_zero() {
        assert_eq!(
            options(r#"{"type": "score", "instructions": "i", "criteria": ["bad", null, 1e-7]}"#),
            ["level 0: bad", "level 1: null", "level 2: 1e-07"]
        );
    }

    #[test]
    fn noul_is_false_then_true_with_default_texts_and_custom_labels() {
        assert_eq!(
            options(
                r#"{"type": "noul", "instructions": "i", "criteria": {"true": "it is"}, "labels": {"true": " A", "false": "B "}}"#
            ),
            ["B: no, the statement does not hold", "A: it is"]
        );
    }
}
